"""The plain listing of the fleet: every device in key order, page by page, with cursors
sealed to it (``cursors``). The table holds more than the devices' state items; a page reads
past them and shows devices only."""

from __future__ import annotations

from typing import Callable

from ..errors import InvalidCursor
from ..item import schema
from ..model.device import Device
from ..model.values import MAX_PAGE_BYTES, item_size
from ..write.expressions import Expression, live
from ..write.store import Store
from .cursors import CURSOR_REFUSED, CursorSeal
from .limits import MAX_LIST_LIMIT

MAX_SCAN_CALLS_PER_PAGE = 4  # a listing page never costs more than this many Scan calls
MAX_SCAN_ITEMS_PER_CALL = 1000  # items one of them reads at most (and 1 MB, DynamoDB's own bound)
SCAN_GROWTH = 4  # a Scan call after calls that found no device reads this many times what they read
LISTING_SCOPE = ["devices"]  # the plain listing's cursors (a fleet query's name its filter and sort)


class Listing:
    def __init__(self, store: Store, cursors: CursorSeal, clock: Callable[[], float]):
        self._store = store
        self._cursors = cursors
        self._clock = clock

    def page(self, limit: int = 50, cursor: str | None = None) -> tuple[list[Device], str | None]:
        """One page of devices and the cursor of the next page (None at the end).

        The table holds more than the devices' state items (their change items, lease rows,
        keyed-write records and tombstones, WebSocket connections, the fleet index's
        bookkeeping): a page reads past them and shows devices only. It makes at most
        ``MAX_SCAN_CALLS_PER_PAGE`` Scan calls, the first of ``limit`` items, each later one sized
        by what the page still needs and how many devices the items read so far held (at most
        ``MAX_SCAN_ITEMS_PER_CALL`` items, and 1 MB, DynamoDB's own bound). So a page may hold
        fewer than ``limit`` devices, even none, while a cursor remains: it then read all it
        may, and its cursor is past everything it read. A full page's cursor is its last device
        (or past what it read, when nothing it read after that device was one). A page also
        stops before the device that would take its devices past ``MAX_PAGE_BYTES`` as stored.
        """
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValueError(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}")
        start_key = _listing_key(self._cursors.open(LISTING_SCOPE, cursor)) if cursor is not None else None
        devices: list[Device] = []
        read, size, previous = 0, 0, None  # items the Scan calls read; the bytes of the devices taken, the last
        for _ in range(MAX_SCAN_CALLS_PER_PAGE):
            need = limit - len(devices)
            expr = Expression()
            state_item = f"{expr.name(schema.SORT_KEY)} = {expr.value({'S': schema.STATE_SK})}"
            request = {
                "Limit": _scan_size(need, read, len(devices)),
                "ConsistentRead": True,
                "FilterExpression": f"{state_item} AND {live(expr, int(self._clock()))}",
                **expr.attributes(),
            }
            if start_key:
                request["ExclusiveStartKey"] = start_key
            page = self._store.send("scan", **request)
            read += page.get("ScannedCount", 0)
            found = page.get("Items", [])
            for item in found[:need]:
                size += item_size(item)
                if devices and size > MAX_PAGE_BYTES:  # the next page starts at this device
                    return devices, self._cursor(previous)
                devices.append(Device.from_item(item, with_connectivity=True))
                previous = item
            if len(found) > need:  # the page is full before the end of what this call read
                return devices, self._cursor(found[need - 1])
            start_key = page.get("LastEvaluatedKey")
            if not start_key:
                return devices, None
            if len(devices) == limit:
                break
        return devices, self._cursor(start_key)

    def _cursor(self, key: dict) -> str:
        """The plain listing's cursor: the scan resumes after this key (an item's, or its key)."""
        return self._cursors.seal(LISTING_SCOPE, [schema.StateItem.of(key).device_id, key[schema.SORT_KEY]["S"]])


def _scan_size(need: int, read: int, found: int) -> int:
    """How many items a listing page's next Scan call reads: ``need`` devices at the rate the
    page's earlier calls found them (``found`` in ``read`` items), growing while they found none."""
    if not read:
        return need
    wanted = read * SCAN_GROWTH if not found else max(need, -(-need * read // found))
    return min(wanted, MAX_SCAN_ITEMS_PER_CALL)


def _listing_key(position) -> dict:
    """The scan's start key a plain listing's cursor holds (its seal vouches for it)."""
    if not (isinstance(position, list) and len(position) == 2 and all(isinstance(part, str) for part in position)):
        raise InvalidCursor(CURSOR_REFUSED)
    return {schema.PARTITION_KEY: {"S": position[0]}, schema.SORT_KEY: {"S": position[1]}}
