"""The delta long-poll: a device read once a write has changed its desired or reported."""

from __future__ import annotations

from ..errors import DeviceNotFound
from ..item import schema
from ..model.device import Device
from ..runtime import Runtime
from ..write.store import Store
from .log import InvalidSince


def wait_for_sections(store: Store, runtime: Runtime, device_id: str, since: int, wait_seconds: float,
                  first_delay: float = 0.05, max_delay: float = 0.5) -> Device:
    """The device once a write after version ``since`` has changed its desired or
    reported (at once when one already has), or as it is when ``wait_seconds`` pass.
    Polls the state item (strongly consistent), so it never trails the writes."""
    monotonic = runtime.monotonic
    deadline = monotonic() + max(wait_seconds, 0.0)
    delay = first_delay
    while True:
        item = store.get_live_state(device_id, runtime.clock())
        if item is None:
            raise DeviceNotFound(device_id)
        if since > schema.StateItem.of(item).version:
            raise InvalidSince(f"since ({since}) is past the device's current version ({item[schema.VERSION]['N']})")
        changed = max((int(item[attribute]["N"]) for attribute in schema.CHANGED_ATTRIBUTES.values()
                       if attribute in item), default=0)
        left = deadline - monotonic()
        if changed > since or left <= 0:
            return Device.from_item(item, with_connectivity=True)
        runtime.sleep(min(delay, left))
        delay = min(delay * 2, max_delay)
