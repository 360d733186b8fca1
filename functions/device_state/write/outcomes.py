"""What a refused request on a device's state item means, read from the item as it was
(ALL_OLD), whichever way it was sent: alone, with an idempotency record, in a
transaction, or as a lease holder change. The one classifier of refusals."""

from __future__ import annotations

from ..errors import (
    ConditionFailed,
    DeviceAlreadyExists,
    DeviceLocked,
    DeviceNotFound,
    LeaseLost,
    LeaseNotHeld,
)
from ..item import schema
from ..item.fencing import Fence, active_holder
from ..model.device import Device
from .plan import (
    CHECKED,
    CONNECTIVITY_OUTCOMES,
    CREATED,
    LEASE_CLEARED,
    LEASE_EXTENDED,
    LEASE_TAKEN,
    REINDEXED,
    Planned,
)
from .retry import Moved


def refusal(planned: Planned, old: dict | None, fence: Fence, now: float) -> Exception:
    """Why ``planned``'s condition failed: a typed error, or ``Moved`` when planning again
    from ``Moved.item`` may succeed. For lease holder changes: ``DeviceNotFound`` or
    ``DeviceLocked`` (another lease is active) for a take, ``LeaseLost`` for an extension,
    ``LeaseNotHeld`` for a clear whose ticket is not the holder."""
    device_id = planned.device_id
    live = old if schema.is_live_state(old, now) else None
    if planned.outcome == LEASE_CLEARED:
        return LeaseNotHeld(device_id)
    if planned.outcome == LEASE_EXTENDED:
        return LeaseLost(device_id, "(the lease is no longer the holder)")
    if planned.outcome == LEASE_TAKEN:
        return DeviceNotFound(device_id) if live is None else DeviceLocked(device_id, active_holder(live, now)[1])
    if planned.outcome in CONNECTIVITY_OUTCOMES:  # carries no fence and no version
        return DeviceNotFound(device_id) if live is None else ConditionFailed(device_id, Device.from_item(live))
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
