"""What every planner builds: ``Planned``, one request on a device's state item ready to send,
the outcomes a planned request has, and ``PlanContext``, the instant and fence every request is
planned under. The planner (``planner.Planner``) is its three kinds of request together."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DeviceNotFound, VersionConflict
from ..fleet.index import FleetIndex
from ..item import contention, schema
from ..item.credentials import Holder
from ..item.fencing import Fence
from ..item.job_marks import JobMark
from ..item.journal import WriteId
from ..model.connectivity import CONNECTED_FIELD, CONNECTIVITY
from ..model.device import Device
from .expressions import Expression, live

DEFAULT_TOMBSTONE_SECONDS = 30 * 24 * 60 * 60

# What a journaled state write did (``Planned.outcome``; also the answer a keyed write records).
CREATED, REPLACED, UPDATED, DELETED, CHECKED = "created", "replaced", "updated", "deleted", "checked"
# What a lease holder change does to the state item. These carry no journal entry: each names
# its ticket in its condition, so sending one again is harmless.
LEASE_TAKEN, LEASE_EXTENDED, LEASE_CLEARED = "lease-taken", "lease-extended", "lease-cleared"
LEASE_OUTCOMES = frozenset({LEASE_TAKEN, LEASE_EXTENDED, LEASE_CLEARED})
REINDEXED = "reindexed"  # index attributes set as the item's sections say (``BookkeepingRequests.reindex``)
# What a connectivity change does to the state item: no version, no journal entry; each is
# the same when sent again (a set member added or deleted, a time set).
CONNECTED, DISCONNECTED, ALL_DISCONNECTED, SEEN = "connected", "disconnected", "all-disconnected", "seen"
CONNECTIVITY_OUTCOMES = frozenset({CONNECTED, DISCONNECTED, ALL_DISCONNECTED, SEEN})
# What a credential change does to the state item: no version; a journal entry at the current
# version, so a lost answer settles.
CREDENTIAL_REGISTERED, CREDENTIAL_REVOKED = "credential-registered", "credential-revoked"
SETTLE_MARK = "settle-mark"  # a lost write marked as never applied (classified by ``WritePipeline.settle``)


@dataclass(frozen=True)
class Planned:
    """One request on a device's state item, ready to send alone (``WritePipeline.send``) or
    with others in a transaction (TransactWriteItems form)."""

    device_id: str
    request: dict
    device: Device | None  # after the write (a delete: as it was; a compiled patch, a lease change: unknown)
    outcome: str
    expected_version: int | None = None
    write: WriteId | None = None  # its journal entry; None: idempotent by its condition (a lease change)


def index_sets(expr: Expression, indexed: dict, written: dict) -> list[str]:
    """SET clauses of index attributes (``fleet_index``); what they write goes into ``written``."""
    written.update(indexed)
    return [f"{expr.name(attribute)} = {expr.value(value)}" for attribute, value in indexed.items()]


def expect(device_id: str, item: dict | None, expected_version: int | None, now: float) -> dict:
    """The live item, checked against the version the caller expects (if any)."""
    if not schema.is_live_state(item, now):
        raise DeviceNotFound(device_id)
    if expected_version is not None:
        current = Device.from_item(item)
        if current.version != expected_version:
            raise VersionConflict(device_id, expected_version, current)
    return item


@dataclass(frozen=True)
class PlanContext:
    """Plans requests at one instant (``now``, epoch seconds) under one lease fence: what every
    kind of request shares."""

    table_name: str
    fence: Fence
    now: float
    tombstone_seconds: int = DEFAULT_TOMBSTONE_SECONDS
    fleet_index: FleetIndex = FleetIndex()
    seen_by: str | None = None  # the device whose own writes these are: they set its lastSeen too
    raced: contention.Raced | None = None  # how a read-modify-write came to this try (None: it races no one)
    holder: Holder | None = None  # the credential the device's own requests come with (item/credentials.py)
    job: JobMark | None = None  # the job whose desired write this is: its mark goes with it (item/job_marks.py)

    def holder_of(self, device_id: str) -> Holder | None:
        """The credential a request on ``device_id`` must find on its item: the caller's, when
        the device writes itself with one."""
        return self.holder if self.seen_by == device_id else None

    def _holder_condition(self, expr: Expression, device_id: str) -> list[str]:
        holder = self.holder_of(device_id)
        return [holder.condition(expr, self.now)] if holder is not None else []

    def _update(self, device_id: str, update: str, condition: str, expr: Expression, write: WriteId | None,
                outcome: str, device: Device | None = None, expected_version: int | None = None,
                **returns) -> Planned:
        """An UpdateItem on the device's state item, in TransactWriteItems form."""
        request = {"Update": {
            "TableName": self.table_name, "Key": schema.state_key(device_id),
            "UpdateExpression": update, "ConditionExpression": condition, **expr.attributes(),
            **returns, "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }}
        return Planned(device_id, request, device, outcome, expected_version, write)

    def _connectivity_attribute(self) -> str | None:
        """The index attribute of ``connectivity/connected``, where it is declared."""
        field = self.fleet_index.field(CONNECTIVITY, CONNECTED_FIELD)
        return field.attribute if field else None

    def _at_version(self, expr: Expression, version: int) -> str:
        """The condition that the item is live at ``version``."""
        return f"{expr.name(schema.VERSION)} = {expr.number(version)} AND {live(expr, self.now)}"
