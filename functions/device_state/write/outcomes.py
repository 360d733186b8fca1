"""What a request on a device's state item came to, named once: ``Applied`` (it landed,
once), ``Moved`` (nothing written; another writer got there first, so planning again may
succeed), ``NeverApplied`` (a lost answer settled as never applied), a typed refusal
(``refusal``: read from the item as it was, ALL_OLD, whichever way the request was sent:
alone, with an idempotency record, in a transaction, or as a lease holder change), and
``Refusals``, what a cancelled transaction says of each of its parts. Callers match on these
types, never on positions or strings."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import (
    ConditionFailed,
    CredentialNotFound,
    CredentialRevoked,
    DeviceAlreadyExists,
    DeviceLocked,
    DeviceNotFound,
    JobAlreadyWritten,
    LeaseLost,
    LeaseNotHeld,
    LeaseOvertaken,
    TooManyConnections,
    TooManyCredentials,
)
from ..item import job_marks, schema
from ..item.credentials import MAX_CREDENTIALS, expired, registered
from ..item.fencing import active_holder
from ..model import connectivity
from ..model.connectivity import MAX_CONNECTIONS
from ..model.device import Device
from .plan import (
    CHECKED,
    CONNECTED,
    CONNECTIVITY_OUTCOMES,
    CREATED,
    CREDENTIAL_REGISTERED,
    CREDENTIAL_REVOKED,
    LEASE_CLEARED,
    LEASE_EXTENDED,
    LEASE_TAKEN,
    REINDEXED,
    PlanContext,
    Planned,
)

RECORD = "record"  # the part of a keyed write that is its idempotency record (``send_together``)


@dataclass(frozen=True)
class Applied:
    """A request that landed, once: the device after it (a delete: as it was; a compiled
    patch: only its version when the item was not returned), the item DynamoDB returned
    (ALL_NEW), if any, and ``version``, the version this request made (a journaled write's own,
    which the device may have passed since: a settled compiled patch's device is as read later)."""

    device: Device | None
    item: dict | None = None
    version: int | None = None


class Moved(Exception):
    """Nothing was written and another attempt may succeed: another writer got there first
    (``item`` is the newer item when the refused write returned it). ``reason`` says why, for
    what counts retries (``version``, ``conflict``)."""

    def __init__(self, item: dict | None = None, reason: str = "version"):
        super().__init__(reason)
        self.item = item
        self.reason = reason


class NeverApplied(Moved):
    """A write whose answer was lost, settled as never applied (its journal entry is marked
    so): nothing was written, and trying again is safe."""

    def __init__(self):
        super().__init__(None, "settled")


class Refusals(Exception):
    """DynamoDB cancelled a transaction; nothing was written. ``refusals``: per planned write,
    in the order given, why its condition failed (``refusal``) or None where it held, with
    ``items`` the item as it was; ``refused``: the names of the other parts (``send_together``'s
    ``others``) whose condition failed; ``conflict``: another request touched one of its items
    at that instant (trying again may succeed)."""

    def __init__(self, refusals: list[Exception | None], items: list[dict | None], refused: frozenset[str],
                 conflict: bool):
        super().__init__("transaction cancelled")
        self.refusals = refusals
        self.items = items
        self.refused = refused
        self.conflict = conflict

    @property
    def refusal(self) -> Exception | None:
        """The refusal of the one planned write a transaction carried beside its other parts."""
        [refusal] = self.refusals
        return refusal


def refusal(planned: Planned, old: dict | None, planner: PlanContext) -> Exception:
    """Why ``planned``'s condition failed: a typed error, or ``Moved`` when planning again
    from ``Moved.item`` may succeed. For lease holder changes: ``DeviceNotFound``,
    ``DeviceLocked`` (another lease is active) or ``LeaseOvertaken`` (a later ticket was granted)
    for a take, ``LeaseLost`` for an extension, ``LeaseNotHeld`` for a clear whose ticket is not
    the holder; ``TooManyConnections`` for a connect over the cap."""
    device_id, fence, now = planned.device_id, planner.fence, planner.now
    live = old if schema.is_live_state(old, now) else None
    holder = planner.holder_of(device_id)
    if live is not None and holder is not None and planned.outcome != CREATED and not holder.admits(live, now):
        return CredentialRevoked(device_id)
    if planner.job is not None and live is not None and (held := job_marks.mark_of(live, planner.job.job_id)):
        return JobAlreadyWritten(device_id, planner.job.job_id, held[0])
    if planned.outcome == CREDENTIAL_REGISTERED:
        if live is None:
            return DeviceNotFound(device_id)
        held = len(registered(live)) - len(expired(live, now))
        return TooManyCredentials(device_id, MAX_CREDENTIALS) if held >= MAX_CREDENTIALS else Moved(live)
    if planned.outcome == CREDENTIAL_REVOKED:
        return DeviceNotFound(device_id) if live is None else CredentialNotFound(device_id)
    if planned.outcome == LEASE_CLEARED:
        return LeaseNotHeld(device_id)
    if planned.outcome == LEASE_EXTENDED:
        return LeaseLost(device_id, "(the lease is no longer the holder)")
    if planned.outcome == LEASE_TAKEN:  # refused by a live device: another lease is active, or a later one was
        if live is None:
            return DeviceNotFound(device_id)
        until = active_holder(live, now)[1]
        return LeaseOvertaken(device_id) if until is None else DeviceLocked(device_id, until)
    if planned.outcome in CONNECTIVITY_OUTCOMES:  # carries no fence and no version
        if live is None:
            return DeviceNotFound(device_id)
        if planned.outcome == CONNECTED:  # its condition is the cap
            return TooManyConnections(device_id, MAX_CONNECTIONS, tuple(connectivity.members(live)))
        return ConditionFailed(device_id, Device.from_item(live))  # not needed: seen recently, a connect meanwhile
    fenced = fence.error(device_id, live, now) if planned.outcome not in (CHECKED, REINDEXED) else None
    if planned.outcome == CREATED:
        if live is not None:
            return DeviceAlreadyExists(device_id, Device.from_item(live))
        return fenced or Moved(old)
    if live is None:
        return DeviceNotFound(device_id)
    if fenced is not None:
        return fenced
    current = Device.from_item(live)
    if current.version != planned.expected_version:
        return Moved(live)
    return ConditionFailed(device_id, current)
