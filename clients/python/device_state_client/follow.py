"""Following devices over the WebSocket push, many on one connection: every change of each
after its ``since``, exactly once and in version order, across any disconnect."""

from __future__ import annotations

import http.client
import json
import time
from collections import deque
from dataclasses import dataclass

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect

from .backoff import Backoff
from .credentials import CredentialsError, token_expiry
from .errors import ApiError, problem_slug

PING = json.dumps({"action": "ping"})


@dataclass(frozen=True)
class Change:
    """One version of the device: the feed's change and the ``delta`` after it (``None`` for a
    delete). ``patch`` is RFC 6902 over ``{"state", "desired", "reported"}``; ``None`` when the
    change was too large for one message (``delta`` is then read from the version's history)."""

    device_id: str
    version: int
    previous_version: int
    kind: str
    sections: tuple
    patch: list | None
    delta: dict | None
    updated_at: str

    @classmethod
    def of(cls, change: dict, delta: dict | None) -> Change:
        return cls(change["deviceId"], change["version"], change["previousVersion"], change["kind"],
                   tuple(change["sections"]), change.get("patch"), delta, change["updatedAt"])

    def leaves_written(self, section: str = "desired") -> dict | None:
        """The leaves of ``section`` this version wrote: ``{JSON Pointer inside the section:
        value}``, ``None`` for a member it removed; ``None`` when the change came without its
        patch (too large for one message: ``delta`` has the section's outstanding leaves)."""
        if self.patch is None:
            return None
        prefix, written = f"/{section}", {}
        for operation in self.patch:
            if operation["op"] == "remove":
                written[operation["path"]] = None
            elif operation["op"] in ("add", "replace"):
                _leaves(operation["path"], operation["value"], written)
        return {path[len(prefix):]: value for path, value in written.items() if path.startswith(prefix + "/")}


@dataclass(frozen=True)
class Resynced:
    """The changes after the last version handed out are past the feed's retention
    (``changes-expired``): they cannot be handed out. ``device`` is the device as read; following
    goes on after its version. Treat it as the whole truth (apply its ``delta``)."""

    device: dict

    @property
    def device_id(self) -> str:
        return self.device["deviceId"]

    @property
    def version(self) -> int:
        return self.device["version"]


def _leaves(path: str, value, into: dict) -> None:
    """A value's leaves (scalars, arrays, empty objects) under ``path``, as the delta counts them."""
    if isinstance(value, dict) and value:
        for name, member in value.items():
            _leaves(f"{path}/{name.replace('~', '~0').replace('/', '~1')}", member, into)
    else:
        into[path] = value


class FollowError(Exception):
    """A refusal that reconnecting cannot cure: the caller may not read a device (403), a bad
    device id or ``since``, credentials that cannot be renewed."""


class _Reconnect(Exception):
    """This connection can serve no more (its token expired, the server failed): connect again."""


class Follower:
    """Iterate it for ``Change`` (and ``Resynced``) events of every device in ``positions``
    (device id: the last version the caller has). ``positions`` holds the last version handed
    out (or passed over: not in ``sections``; ``None`` for every section) of each device; keep
    it to resume after a restart (``position`` when following one device).

    It subscribes to every section and filters here: the push then carries every version, so a
    change whose ``previousVersion`` is not the device's position is a real gap (filled from the
    change feed), not a version the server left out (which would cost a feed read per such
    change). It subscribes to one device at a time, waiting for each answer, so that a refusal
    that names no device is known to be that subscription's. ``reconnects`` lists why each
    connection ended, and ``on_reconnect(why)`` is told as each ends. ``read_device(id)``,
    ``read_version(id, version)`` and ``read_changes(id, since)`` are the HTTP reads it fills
    gaps and resyncs with."""

    def __init__(self, client, positions: dict, sections: tuple | None, *, read_device, read_version,
                 read_changes, ping_seconds: float = 300, backoff: Backoff | None = None, open_timeout: float = 10,
                 on_reconnect=lambda why: None):
        self.client, self.positions, self.sections = client, dict(positions), sections
        self.read_device, self.read_version, self.read_changes = read_device, read_version, read_changes
        self.ping_seconds, self.open_timeout = ping_seconds, open_timeout
        self.backoff = backoff or Backoff()
        self.reconnects: list[str] = []
        self.on_reconnect = on_reconnect
        self._renew_token = self._renewed = False
        self._retry_after = 0.0  # what a connect refused 429 asked to wait, where the gateway passed it on
        self._unsubscribed: deque = deque()
        self._pending: str | None = None  # the device whose subscription awaits its answer
        self._connected = False  # once: its credentials served (a token command failing before is no hiccup)

    @property
    def position(self) -> int:
        """The one device's position (see ``positions`` for many)."""
        [position] = self.positions.values()
        return position

    def __iter__(self):
        while True:
            try:
                with self._connect() as websocket:
                    self._connected = True
                    yield from self._follow(websocket)
            except CredentialsError as error:  # tried again once a connection was made with it: a hiccup
                if not self._connected:
                    raise FollowError(str(error)) from error
                self._ended(error)
            except (ConnectionClosed, InvalidHandshake, OSError, http.client.HTTPException, _Reconnect) as error:
                self._ended(error)
            except ApiError as error:  # a read the follower needed (feed, device) failed
                if error.status in (401, 429) or error.status >= 500:
                    self._ended(error)
                else:
                    raise FollowError(str(error)) from error
            time.sleep(max(self.backoff.next_delay(), self._retry_after))
            self._retry_after = 0.0

    def _ended(self, error: Exception) -> None:
        # A 429 (the device holds its most connections) says nothing against the token: it is
        # waited out with the backoff like any other refused connect (at least its Retry-After,
        # where the gateway passed it on), the token kept.
        if isinstance(error, InvalidStatus) and error.response.status_code == 429:
            retry_after = error.response.headers.get("Retry-After", "")
            self._retry_after = float(retry_after) if retry_after.isdigit() else 0.0
        if isinstance(error, InvalidStatus) and error.response.status_code in (401, 403):
            status = error.response.status_code
            if not self.client.credentials.renewable:
                raise FollowError(f"the WebSocket API refused the token ({status})") from error
            if self._renewed:  # a token renewed for this connect, refused too: renewing cannot cure it
                raise FollowError(f"{self.client.websocket_url} refused the token, renewed too ({status}); a 403 "
                                  f"may also mean the URL or its stage is not the WebSocket API's") from error
            self._renew_token = True
        why = f"{type(error).__name__}: {error}"
        self.reconnects.append(why)
        self.on_reconnect(why)

    def _connect(self):
        token = self.client.credentials.bearer_token(self.client, renew=self._renew_token)
        self._renewed, self._renew_token = self._renew_token, False
        expiry = token_expiry(token)
        # A connection is served until its token expires (the server allows 60 s of clock
        # leeway on top); connecting again at expiry, with a renewed token, leaves no silent gap.
        self._token_expiry = expiry if expiry and expiry > time.time() else None
        secure = self.client.websocket_url.startswith("wss:")
        return connect(self.client.websocket_url, additional_headers={"Authorization": f"Bearer {token}"},
                       ssl=self.client.ssl_context if secure else None, open_timeout=self.open_timeout)

    def _follow(self, websocket):
        self._unsubscribed, self._pending = deque(self.positions), None
        self._subscribe_next(websocket)
        next_ping = time.monotonic() + self.ping_seconds
        while True:
            if self._token_expiry is not None and time.time() >= self._token_expiry:
                raise _Reconnect("the connection's token expired")
            wait = next_ping - time.monotonic()
            if self._token_expiry is not None:
                wait = min(wait, self._token_expiry - time.time())
            try:
                message = json.loads(websocket.recv(timeout=max(wait, 0)))
            except TimeoutError:
                if time.monotonic() >= next_ping:  # API Gateway closes a connection idle for 10 minutes
                    websocket.send(PING)
                    next_ping = time.monotonic() + self.ping_seconds
                continue
            if message.get("type") == "subscribed":
                if message.get("deviceId") == self._pending:
                    self._pending = None
                    self._subscribe_next(websocket)
                self.backoff.reset()
            elif message.get("type") == "change" and message.get("deviceId") in self.positions:
                yield from self._take(websocket, message)
            elif message.get("type") == "error":
                yield from self._refused(websocket, message.get("problem") or {})

    def _subscribe(self, websocket, device_id: str) -> None:
        """Subscribes ``device_id`` once the subscription in flight is answered."""
        if device_id not in self._unsubscribed and device_id != self._pending:
            self._unsubscribed.append(device_id)
        self._subscribe_next(websocket)

    def _subscribe_next(self, websocket) -> None:
        if self._pending is None and self._unsubscribed:
            self._pending = self._unsubscribed.popleft()
            websocket.send(json.dumps({"action": "subscribe", "deviceId": self._pending,
                                       "since": self.positions[self._pending]}))

    def _take(self, websocket, message: dict):
        device_id, version = message["deviceId"], message["version"]
        if version <= self.positions[device_id]:
            return  # a repeat: two senders may race to send a version
        if message["previousVersion"] != self.positions[device_id]:
            yield from self._fill(websocket, device_id, version)
            if self.positions[device_id] >= version:
                return
            if self.positions[device_id] != message["previousVersion"]:  # never skip: the catch-up reads again
                raise _Reconnect(f"the change feed of {device_id} had nothing after {self.positions[device_id]} "
                                 f"before {version}")
        delta = message.get("delta")
        if message.get("tooLarge"):
            delta = None if message["kind"] == "deleted" else self._delta_at(device_id, version)
        yield from self._hand_out(message, delta)

    def _fill(self, websocket, device_id: str, until: int):
        """The versions of ``device_id`` after its position and before ``until``, from the change feed."""
        while self.positions[device_id] < until - 1:
            try:
                page = self.read_changes(device_id, self.positions[device_id])
            except ApiError as error:
                if error.slug != "changes-expired":
                    raise
                yield from self._resync(websocket, device_id)
                return
            changes = [change for change in page["changes"]
                       if self.positions[device_id] < change["version"] < until]
            if not changes:
                return  # the feed holds nothing more before ``until``
            for change in changes:
                delta = None if change["kind"] == "deleted" or not self._wanted(change) else \
                    self._delta_at(device_id, change["version"])
                yield from self._hand_out(change, delta)

    def _hand_out(self, change: dict, delta: dict | None):
        self.positions[change["deviceId"]] = change["version"]
        if self._wanted(change):
            yield Change.of(change, delta)

    def _wanted(self, change: dict) -> bool:
        return (self.sections is None or change["kind"] == "deleted"
                or bool(set(self.sections).intersection(change["sections"])))

    def _delta_at(self, device_id: str, version: int) -> dict | None:
        try:
            return self.read_version(device_id, version).get("delta")
        except ApiError as error:
            if error.status == 404:  # that version's history has expired: the change goes without its delta
                return None
            raise

    def _refused(self, websocket, problem: dict):
        slug = problem_slug(problem)
        # A refusal of a subscription names its device, or else answers the one in flight.
        device_id = problem.get("deviceId") or self._pending
        if problem.get("status") == 401:  # the connection's token expired: every message is refused
            self._renew_token = True
            raise _Reconnect("401: the connection's token expired")
        if problem.get("status", 500) >= 500 or problem.get("status") == 429:
            raise _Reconnect(f"{problem.get('status')}: {problem.get('detail')}")
        if slug == "changes-expired" and device_id in self.positions:
            if device_id == self._pending:
                self._pending = None
            yield from self._resync(websocket, device_id)
            return
        raise FollowError(f"{device_id}: {problem.get('status')} {slug}: {problem.get('detail')}")

    def _resync(self, websocket, device_id: str):
        device = self.read_device(device_id)
        self.positions[device_id] = device["version"]
        yield Resynced(device)
        self._subscribe(websocket, device_id)
