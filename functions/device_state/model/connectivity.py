"""Whether a device is connected, since when, and when it was last seen: kept on its state
item beside (not in) its versioned sections, so none of it makes a new version. All pure.

- ``connections`` (a string set): one member per open WebSocket connection of the device's
  own credentials, ``<until ms>:<connection id>``, where *until* is when API Gateway (or the
  token it was opened with) ends it at the latest. Adding and deleting a member are
  idempotent, so a resend after a lost answer is harmless; a connection whose close never
  arrives stops counting at its *until*.
- ``connectedSince`` (ms): set by the connect that found none open, removed with the last.
- ``lastSeen`` (ms): the device's connects and disconnects, its own writes (in the same
  request), and its reads of itself, at most once a minute (``SEEN_EVERY_SECONDS``).

``connectivity/connected`` may be declared for fleet query: its index attribute is set by
connects and cleared by the disconnect that leaves none open.
"""

from __future__ import annotations

from ..item import schema
from .times import timestamp

CONNECTIVITY = "connectivity"  # the document a device read shows, and its fleet-query section
CONNECTED_FIELD = ("connected",)  # the one member of it that may be declared for fleet query
MAX_CONNECTIONS = 4  # open connections per device (their members live in the item's bookkeeping room)
SEEN_EVERY_SECONDS = 60


def member(connection_id: str, until: float) -> str:
    return f"{int(until * 1000)}:{connection_id}"


def connection_of(member_: str) -> str:
    """The connection id a member names."""
    return member_.partition(":")[2]


def _until_ms(member_: str) -> int:
    milliseconds, _, _ = member_.partition(":")
    return int(milliseconds) if milliseconds.isdigit() else 0


def members(item: dict | None) -> list[str]:
    return schema.StateItem.of(item).strings(schema.CONNECTIONS)


def counted_connections(item: dict | None) -> set[str]:
    """The ids of the connections the item counts against the device's cap (none without an item)."""
    return {connection_of(entry) for entry in members(item)}


def open_members(item: dict | None, now: float) -> list[str]:
    return [entry for entry in members(item) if _until_ms(entry) > now * 1000]


def ended_members(members_: list[str], now: float) -> list[str]:
    """Of ``members_``, those whose connection ended without its close arriving."""
    return [entry for entry in members_ if _until_ms(entry) <= now * 1000]


def _ms(item: dict, name: str) -> int | None:
    return int(item[name]["N"]) if name in item else None


def connectivity_of(item: dict, now: float) -> dict:
    """``{"connected", "since", "lastSeen"}`` as a device read shows it."""
    connected = bool(open_members(item, now))
    since, seen = _ms(item, schema.CONNECTED_SINCE), _ms(item, schema.LAST_SEEN)
    return {"connected": connected, "since": timestamp(since / 1000) if connected and since else None,
            "lastSeen": timestamp(seen / 1000) if seen else None}


def seen_recently(item: dict | None, now: float) -> bool:
    seen = _ms(item or {}, schema.LAST_SEEN)
    return seen is not None and seen > (now - SEEN_EVERY_SECONDS) * 1000


CONNECTED_EVENT, DISCONNECTED_EVENT = "device.connected", "device.disconnected"


def connectivity_event(old: dict | None, new: dict | None) -> tuple[str, dict] | None:
    """(detail type, detail) when a stream record's images show the device becoming
    connected (``connectedSince`` appears) or disconnected (it goes: its last connection
    closed, or the device was deleted while connected); None otherwise."""
    if not new or schema.VERSION not in new:
        return None
    before, after = schema.CONNECTED_SINCE in (old or {}), schema.CONNECTED_SINCE in new
    if before == after:
        return None
    seen = _ms(new, schema.LAST_SEEN) if after or schema.DELETED_AT not in new else None
    at = timestamp(seen / 1000) if seen else new.get(schema.DELETED_AT, {}).get("S")
    detail = {"deviceId": schema.StateItem.of(new).device_id, "connected": after, "at": at}
    return (CONNECTED_EVENT if after else DISCONNECTED_EVENT), detail
