"""DeviceStateChanged events: one per change, on EventBridge (deployed) or appended to a
file and the log (locally, where there is no EventBridge). Published after the change item
is written, so a retried record may publish its event again: subscribers deduplicate by
(deviceId, version)."""

from __future__ import annotations

import json
import logging
import threading

from functions.device_state import Change, dumps

SOURCE = "device-state"
DETAIL_TYPE = "DeviceStateChanged"
MAX_EVENT_BYTES = 256 * 1024  # EventBridge's limit for one entry
EVENT_MARGIN_BYTES = 1024

logger = logging.getLogger("device_state.changes")


class PublishFailed(RuntimeError):
    pass


def detail(change: Change) -> dict:
    """The event detail: the sections the write changed and the delta after it (null for
    a delete), so a rule can match "this device now has a delta"; the state too when the
    entry fits EventBridge's limit, else ``stateOmitted`` (read it with GET
    /devices/{id}/versions/{version}); the patch, then the delta, are left out
    (``patchOmitted``, ``deltaOmitted``) only when even that does not fit."""
    body = {"deviceId": change.device_id, "version": change.version, "previousVersion": change.previous_version,
            "kind": change.kind, "updatedAt": change.updated_at, "sections": list(change.sections),
            "delta": None if change.state is None else change.device().delta(),
            "patch": change.patch, "state": change.state}
    body.update({key: value for key, value in change.as_dict().items() if key in ("acks", "acksOmitted")})
    for omitted in ("state", "patch", "delta"):
        if _entry_bytes(body) <= MAX_EVENT_BYTES - EVENT_MARGIN_BYTES:
            break
        body.pop(omitted)
        body[f"{omitted}Omitted"] = True
    return body


def _entry_bytes(body: dict) -> int:
    return len(dumps(body).encode()) + len(SOURCE) + len(DETAIL_TYPE)


class EventBridgePublisher:
    def __init__(self, client, bus_name: str):
        self.client, self.bus_name = client, bus_name

    def publish(self, change: Change) -> None:
        self.send(DETAIL_TYPE, detail(change))

    def send(self, detail_type: str, body: dict) -> None:
        response = self.client.put_events(Entries=[{
            "Source": SOURCE, "DetailType": detail_type, "Detail": dumps(body),
            "EventBusName": self.bus_name, "Resources": []}])
        if response.get("FailedEntryCount"):
            entry = response["Entries"][0]
            raise PublishFailed(f"EventBridge refused the event: {entry.get('ErrorCode')} {entry.get('ErrorMessage')}")


class FilePublisher:
    """Locally: one JSON line per event, in EventBridge's envelope shape, plus a log line."""

    _lock = threading.Lock()

    def __init__(self, path: str):
        self.path = path

    def publish(self, change: Change) -> None:
        self.send(DETAIL_TYPE, detail(change))

    def send(self, detail_type: str, body: dict) -> None:
        line = dumps({"source": SOURCE, "detail-type": detail_type, "detail": body})
        with self._lock, open(self.path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
        logger.info("%s %s", detail_type, json.dumps({key: body.get(key) for key in ("deviceId", "version", "kind")
                                                      if key in body}))


class LogPublisher:
    def publish(self, change: Change) -> None:
        self.send(DETAIL_TYPE, detail(change))

    def send(self, detail_type: str, body: dict) -> None:
        logger.info("%s %s v%s (no bus configured)", detail_type, body.get("deviceId"), body.get("version", "-"))
