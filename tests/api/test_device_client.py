"""The device client (clients/python, `device_state_client`) against the real dev server (HTTP
and WebSocket, stream processor and fan-out, on DynamoDB Local): connections cut mid-stream
while writers change desired, a refused reconnect window, a token that expires under an open
connection, a dropped message, changes past the retention, a lost answer to a report. The
client hands out every version after ``since`` exactly once and in order; beside it a naive
loop (subscribe again from the version read at reconnect, no dedup, no gap check) loses or
repeats versions under the same faults, so the tests are shown able to fail."""

from __future__ import annotations

import http.client
import http.server
import json
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid

import pytest
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect
from websockets.sync.server import serve

from functions.auth.credentials import LEEWAY_SECONDS
from functions.device_state import table
from functions.device_state.feed.items import change_sk
from functions.device_state.client import dynamodb_client
from functions.device_state.model.connectivity import MAX_CONNECTIONS
from localdev.dynamodb_local import free_port
from localdev.tls import LocalCA
from tests.api.test_http import launch
from tests.auth import bearer, token
from tests.helpers import served
from tests.make_serve import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "clients" / "python"))  # the package as a device author installs it
from device_state_client import (ApiError, Backoff, CertificateCredentials, Change, DeviceClient,  # noqa: E402
                                 FollowError, OutcomeUnknown, Resynced, TokenCredentials)

pytestmark = pytest.mark.dynamodb_local
MERGE = {"Content-Type": "application/merge-patch+json"}
# The fan-out trails writes by seconds when the suite's other workers share the 2 cores (see
# test_push.py); these tests are about completeness and order, not lag.
FOLLOW_SECONDS = 90
FAST_BACKOFF = {"first": 0.1, "cap": 1.0}


@pytest.fixture(scope="module")
def server(dynamodb_local):
    table_name = f"client-{uuid.uuid4().hex[:8]}"
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=table_name, WORKERS="6")
    candidate.table = table_name
    yield candidate
    process.terminate()
    process.wait(timeout=30)


def _device(server, desired=None) -> str:
    device = f"client-{uuid.uuid4().hex[:8]}"
    status, _, body = server.request("POST", "/devices", {"deviceId": device, "state": {},
                                                          "desired": desired or {"brightness": 0}})
    assert status == 201, body
    return device


def _set_desired(server, device, **desired) -> int:
    status, _, body = server.request("PATCH", f"/devices/{device}/desired", desired, headers=MERGE)
    assert status == 200, body
    return json.loads(body)["version"]


def _client(server, device, websocket_port=None, credentials=None) -> DeviceClient:
    """A client as the device itself (a device token), over ``websocket_port`` when given."""
    port = websocket_port or server.port
    return DeviceClient(f"http://127.0.0.1:{server.port}/", device,
                        credentials or TokenCredentials(lambda: token(device=device)),
                        websocket_url=f"ws://127.0.0.1:{port}/ws")


class Collector:
    """Runs an iterable of events in a thread, keeping each, until one reaches ``until``."""

    def __init__(self, events, until: int):
        self.events, self.until, self.error = [], until, None
        self.done = threading.Event()
        self._iterator = iter(events)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        try:
            for event in self._iterator:
                self.events.append(event)
                if event.version >= self.until:
                    break
        except Exception as error:  # noqa: BLE001 - shown by the test
            self.error = error
        finally:
            self.done.set()

    def wait(self, seconds: float = FOLLOW_SECONDS) -> list:
        assert self.done.wait(seconds), f"not done in {seconds} s; got {[event.version for event in self.events]}"
        assert self.error is None, self.error
        return self.events


class CuttableProxy:
    """A TCP relay from its own port to the server's. ``cut()`` drops every relayed connection
    at once, both ways, without a WebSocket close (as a lost network does); ``stop()`` and
    ``start()`` refuse connections for a while (as a server restarting does), on the same port.
    ``connections`` counts the connections it relayed."""

    def __init__(self, target_port: int):
        self.target_port, self.port = target_port, free_port()
        self.cuts = self.connections = 0
        self._sockets, self._lock = [], threading.Lock()
        self.start()

    def start(self):
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def stop(self):
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it
        self._listener.close()
        self.cut()

    def cut(self):
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for each in sockets:  # shut down, not closed: the relay threads close them as they end
            try:
                each.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.cuts += 1

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                return
            with self._lock:
                self._sockets += [client, upstream]
                self.connections += 1
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _relay(self, client, upstream):
        other = threading.Thread(target=self._pipe, args=(upstream, client), daemon=True)
        other.start()
        self._pipe(client, upstream)
        other.join()
        client.close()
        upstream.close()

    @staticmethod
    def _pipe(source, target):
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        for each in (source, target):
            try:
                each.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def naive_follow(server, device: str, websocket_port: int, until: int, seconds: float) -> list[int]:
    """The loop a device author writes from a first reading of the docs: on every (re)connect
    subscribe from the version the device is at, hand out every change that comes."""
    versions, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            status, _, body = server.request("GET", f"/devices/{device}")
            since = json.loads(body)["version"]
            if since >= until:
                return versions
            with connect(f"ws://127.0.0.1:{websocket_port}/ws", additional_headers=bearer(device=device),
                         open_timeout=5) as websocket:
                websocket.send(json.dumps({"action": "subscribe", "deviceId": device, "since": since}))
                while time.monotonic() < deadline:
                    message = json.loads(websocket.recv(timeout=max(deadline - time.monotonic(), 0.01)))
                    if message["type"] == "change":
                        versions.append(message["version"])
                        if message["version"] >= until:
                            return versions
        except (ConnectionClosed, InvalidHandshake, OSError):
            time.sleep(0.2)
    return versions


def test_connections_cut_mid_stream_lose_and_repeat_nothing_while_the_naive_loop_loses(server):
    device, writes = _device(server), 60
    proxy = CuttableProxy(server.port)
    client = _client(server, device, proxy.port)
    follower = client.follow(since=1, backoff=Backoff(**FAST_BACKOFF))
    followed = Collector(follower, until=1 + writes)
    naive = {}
    naive_thread = threading.Thread(target=lambda: naive.setdefault("versions", naive_follow(
        server, device, proxy.port, 1 + writes, FOLLOW_SECONDS)), daemon=True)
    naive_thread.start()
    time.sleep(1)  # both subscribed
    for number in range(1, writes + 1):
        _set_desired(server, device, brightness=number)
        time.sleep(0.1)
        if number % 8 == 0:
            proxy.cut()  # mid-stream: changes in flight and changes still to come
        if number == 30:  # a window in which nobody can connect, writes going on
            proxy.stop()
        if number == 40:
            proxy.start()
    events = followed.wait()
    naive_thread.join(FOLLOW_SECONDS)
    assert [event.version for event in events] == list(range(2, 2 + writes))
    assert all(isinstance(event, Change) and event.sections == ("desired",) for event in events)
    assert [event.delta["brightness"] for event in events] == list(range(1, 1 + writes))  # delta as of each version
    assert [event.leaves_written() for event in events] == [{"/brightness": n} for n in range(1, 1 + writes)]
    assert len(follower.reconnects) >= proxy.cuts, follower.reconnects
    # The control, under the same cuts: versions written while it was away are gone, some come twice.
    assert naive["versions"] != list(range(2, 2 + writes)), naive["versions"]
    assert set(range(2, 2 + writes)) - set(naive["versions"]), "the naive loop lost nothing"


def test_a_server_restarted_mid_stream_costs_no_version_and_repeats_none(dynamodb_local):
    """A real restart behind a stable address: the server process ends (its WebSocket
    connections with it) while the client is behind, and a new one starts on the same table
    (its stream processor reading the stream from its start again); REST and WebSocket both
    go through the address, so the client's reads see the restart too."""
    table_name = f"restart-{uuid.uuid4().hex[:8]}"
    first, before = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=table_name, WORKERS="4")
    second = None
    try:
        proxy = CuttableProxy(before.port)
        device = _device(before)
        client = DeviceClient(f"http://127.0.0.1:{proxy.port}/", device, TokenCredentials(lambda: token(device=device)))
        follower = client.follow(since=1, backoff=Backoff(**FAST_BACKOFF))
        followed = Collector(follower, until=21)
        for number in range(1, 11):
            _set_desired(before, device, brightness=number)
        proxy.stop()
        first.terminate()
        first.wait(timeout=30)
        second, after = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=table_name, WORKERS="4")
        proxy.target_port = after.port
        proxy.start()
        for number in range(11, 21):
            _set_desired(after, device, brightness=number)
        assert [event.version for event in followed.wait()] == list(range(2, 22))
        assert follower.reconnects, "the restart went unnoticed"
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=30)


def test_a_token_that_expires_under_the_connection_is_answered_401_and_the_client_reconnects(server):
    device = _device(server)
    # The first token is past its exp but inside the server's 60 s leeway: served 3 more seconds.
    tokens = iter([token(device=device, exp=int(time.time()) - LEEWAY_SECONDS + 3)])
    credentials = TokenCredentials(lambda: next(tokens, None) or token(device=device))
    follower = _client(server, device, credentials=credentials).follow(
        since=1, ping_seconds=0.5, backoff=Backoff(**FAST_BACKOFF))
    followed = Collector(follower, until=7)
    for number in range(1, 4):
        _set_desired(server, device, brightness=number)
    time.sleep(5)  # the token expires; the next ping is answered 401
    for number in range(4, 7):
        _set_desired(server, device, brightness=number)
    assert [event.version for event in followed.wait()] == [2, 3, 4, 5, 6, 7]
    assert any("401" in reason for reason in follower.reconnects), follower.reconnects


def test_a_connection_is_renewed_when_its_token_expires_before_anything_is_refused(server):
    device = _device(server)
    tokens = iter([token(device=device, exp=int(time.time()) + 4)])  # valid for 4 more seconds
    credentials = TokenCredentials(lambda: next(tokens, None) or token(device=device))
    follower = _client(server, device, credentials=credentials).follow(since=1, backoff=Backoff(**FAST_BACKOFF))
    followed = Collector(follower, until=3)
    _set_desired(server, device, brightness=1)
    time.sleep(5)
    _set_desired(server, device, brightness=2)
    assert [event.version for event in followed.wait()] == [2, 3]
    assert follower.reconnects == ["_Reconnect: the connection's token expired"]


class CountedRenewals(TokenCredentials):
    """The device's token; ``renewals`` counts the connects that asked for a fresh one, ``connects``
    when each connect asked for its token."""

    def __init__(self, device: str, renewable: bool):
        super().__init__((lambda: token(device=device)) if renewable else token(device=device))
        self.renewals = 0
        self.connects: list[float] = []

    def bearer_token(self, client, renew: bool = False) -> str:
        self.renewals += renew
        self.connects.append(time.monotonic())
        return super().bearer_token(client, renew)


@pytest.mark.parametrize("renewable", [True, False], ids=["renewable token", "fixed token"])
def test_a_connect_refused_over_the_devices_cap_is_backed_off_not_taken_for_a_bad_token(server, renewable):
    """The device holds its most connections (a leak elsewhere, another copy of it): each connect
    is 429, which the follower waits out with its backoff (at least the Retry-After), renewing
    nothing and never giving up, and it follows once a place frees."""
    device = _device(server)
    held = [connect(f"ws://127.0.0.1:{server.port}/ws", additional_headers=bearer(device=device), open_timeout=10)
            for _ in range(MAX_CONNECTIONS)]
    credentials = CountedRenewals(device, renewable)
    follower = _client(server, device, credentials=credentials).follow(since=1, backoff=Backoff(**FAST_BACKOFF))
    try:
        followed = Collector(follower, until=2)
        deadline = time.monotonic() + FOLLOW_SECONDS
        while len(follower.reconnects) < 3 and followed.error is None:
            assert time.monotonic() < deadline, follower.reconnects
            time.sleep(0.1)
        assert followed.error is None, followed.error
        assert all("429" in reason for reason in follower.reconnects), follower.reconnects
        waits = [later - earlier for earlier, later in zip(credentials.connects, credentials.connects[1:])]
        assert min(waits[:2]) >= 0.9, waits  # Retry-After: 1, beside a backoff of at most 0.2 s
        held.pop().close()
        _set_desired(server, device, brightness=1)
        assert [event.version for event in followed.wait()] == [2]
        assert credentials.renewals == 0
    finally:
        for websocket in held:
            websocket.close()


class DroppingRelay:
    """A WebSocket relay in front of the server's /ws that passes every message except the
    changes of one version: a gap only a client that checks previousVersion notices."""

    def __init__(self, target_port: int, drop_version: int):
        self.target_port, self.drop_version = target_port, drop_version
        self._server = serve(self._relay, "127.0.0.1", 0)
        self.port = self._server.socket.getsockname()[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _relay(self, downstream):
        headers = {"Authorization": downstream.request.headers["Authorization"]}
        with connect(f"ws://127.0.0.1:{self.target_port}/ws", additional_headers=headers) as upstream:
            def forward_up():
                try:
                    for message in downstream:
                        upstream.send(message)
                except ConnectionClosed:
                    pass
                upstream.close()

            threading.Thread(target=forward_up, daemon=True).start()
            try:
                for message in upstream:
                    parsed = json.loads(message)
                    if parsed.get("type") == "change" and parsed["version"] == self.drop_version:
                        continue
                    downstream.send(message)
            except ConnectionClosed:
                pass

    def close(self):
        self._server.shutdown()


def test_a_gap_in_the_pushed_versions_is_filled_from_the_change_feed(server):
    device = _device(server)
    relay = DroppingRelay(server.port, drop_version=3)
    try:
        client = _client(server, device, relay.port)
        followed = Collector(client.follow(since=1, backoff=Backoff(**FAST_BACKOFF)), until=5)
        dedup_only = Collector(_dedup_only(relay.port, device), until=5)  # the control: drops repeats, trusts order
        for number in range(1, 5):
            _set_desired(server, device, brightness=number)
        events = followed.wait()
        assert [event.version for event in events] == [2, 3, 4, 5]
        assert [event.delta for event in events] == [{"brightness": number} for number in range(1, 5)]
        assert [event.version for event in dedup_only.wait()] == [2, 4, 5]  # version 3 silently skipped
    finally:
        relay.close()


def _dedup_only(port, device):
    with connect(f"ws://127.0.0.1:{port}/ws", additional_headers=bearer(device=device)) as websocket:
        websocket.send(json.dumps({"action": "subscribe", "deviceId": device, "since": 1}))
        last = 1
        for raw in websocket:
            message = json.loads(raw)
            if message["type"] == "change" and message["version"] > last:
                last = message["version"]
                yield Change.of(message, message["delta"])


def test_changes_past_the_retention_resync_from_the_device_and_say_so(server, dynamodb_local):
    device = _device(server)
    _set_desired(server, device, brightness=1)
    status, _, body = server.request("GET", f"/devices/{device}/changes?since=1&waitSeconds=20")
    assert status == 200 and json.loads(body)["changes"], body  # version 2 is recorded
    dynamodb_client(dynamodb_local.endpoint).delete_item(  # version 1's change passes the retention, as TTL would
        TableName=server.table, Key={table.PARTITION_KEY: {"S": device}, table.SORT_KEY: {"S": change_sk(1)}})
    followed = Collector(_client(server, device).follow(since=0, backoff=Backoff(**FAST_BACKOFF)), until=3)
    time.sleep(1)
    _set_desired(server, device, brightness=2)
    resynced, change = followed.wait()
    assert isinstance(resynced, Resynced) and resynced.version == 2
    assert resynced.device["desired"] == {"brightness": 1}
    assert isinstance(change, Change) and (change.version, change.delta) == (3, {"brightness": 2})


def test_only_the_sections_followed_are_handed_out_and_no_feed_read_is_needed(server):
    """The device reports after each desire; its reports are versions too, passed over by a
    follower of desired without a read of the feed."""
    device = _device(server)
    client = _client(server, device)
    feed_reads = []
    original = client.changes
    client.changes = lambda since, limit=100: feed_reads.append(since) or original(since, limit)
    follower = client.follow(since=1, backoff=Backoff(**FAST_BACKOFF))
    desired_versions = []
    followed = Collector(follower, until=8)
    for number in range(1, 4):
        desired_versions.append(_set_desired(server, device, brightness=number))
        answer = client.report({"brightness": number})
        assert answer["reported"] == {"brightness": number} and answer["delta"] == {}
    desired_versions.append(_set_desired(server, device, power="on"))
    assert desired_versions == [2, 4, 6, 8]
    assert [event.version for event in followed.wait()] == desired_versions
    assert follower.position == 8 and feed_reads == []
    assert client.delta() == {"deviceId": device, "version": 8, "delta": {"power": "on"}}
    assert client.get()["reported"] == {"brightness": 3}
    with pytest.raises(ApiError) as refused:  # a refusal comes with its problem details
        client.changes(since=99)
    assert (refused.value.status, refused.value.slug) == (400, "invalid-since")


class AnswerDroppingProxy:
    """An HTTP relay to the server that forwards each request and, for the first ``drops``
    writes (any method but GET), closes the connection instead of answering: the write
    applied, its answer lost. ``keys``: each write's Idempotency-Key."""

    def __init__(self, target_port: int, drops: int):
        proxy = self
        self.drops, self.keys = drops, []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _relay(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.command != "GET":
                    proxy.keys.append(self.headers.get("Idempotency-Key"))
                upstream = http.client.HTTPConnection("127.0.0.1", target_port, timeout=30)
                upstream.request(self.command, self.path, body=body, headers=dict(self.headers))
                answer = upstream.getresponse()
                payload = answer.read()
                if proxy.drops > 0 and self.command != "GET":
                    proxy.drops -= 1
                    self.close_connection = True
                    return
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.close = served(self._server)


@pytest.mark.parametrize("retry_with_the_same_key, versions_written", [(True, 1), (False, 2)])
def test_a_report_whose_answer_is_lost_is_applied_once_when_resent_under_its_key(
        server, retry_with_the_same_key, versions_written):
    """The client resends under the same Idempotency-Key and gets the first answer back; the
    control resends the same report under a fresh key, as a loop without keys would, and it is
    applied twice (one more version, a second change to every follower)."""
    device = _device(server)
    proxy = AnswerDroppingProxy(server.port, drops=1)
    try:
        client = DeviceClient(f"http://127.0.0.1:{proxy.port}/", device,
                              TokenCredentials(token(device=device)), sleep=lambda seconds: None)
        if retry_with_the_same_key:
            answer = client.report({"power": "on"})
        else:
            client.write_attempts = 1
            with pytest.raises(OutcomeUnknown):  # its only copy went unanswered
                client.report({"power": "on"})
            answer = client.report({"power": "on"})
        assert answer["version"] == 1 + versions_written and answer["reported"] == {"power": "on"}
        assert (len(proxy.keys), len(set(proxy.keys))) == (2, 1 if retry_with_the_same_key else 2)
        status, _, body = server.request("GET", f"/devices/{device}")
        assert json.loads(body)["version"] == 1 + versions_written
    finally:
        proxy.close()


def package_readme_block(name: str) -> str:
    text = (REPO_ROOT / "clients" / "python" / "README.md").read_text()
    match = re.search(rf"<!-- readme-test: {name} -->\n```python\n(.*?)\n```", text, re.DOTALL)
    assert match, f"no block {name} in clients/python/README.md"
    return match.group(1)


def test_the_package_readmes_lamp_settles_what_is_outstanding_then_follows_desired(server, tmp_path):
    """The README's lamp as written, as its own process with the device's token: it applies
    and reports the desire outstanding at start, then each new one, acknowledges a desire it
    refuses (which takes the leaf out of the delta), and ends on the delete."""
    device = _device(server, desired={"power": "on"})
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT / "clients" / "python"),
                   "URL": f"http://127.0.0.1:{server.port}/", "DEVICE": device, "TOKEN": token(device=device)}
    log = tmp_path / "lamp.log"
    with open(log, "w") as output:
        lamp = subprocess.Popen([sys.executable, "-c", package_readme_block("lamp")], cwd=tmp_path,
                                env=environment, stdout=output, stderr=subprocess.STDOUT)
    try:
        _wait_for_device(server, device, lambda seen: seen["reported"] == {"power": "on"}, lamp, log)
        _set_desired(server, device, brightness=40)
        _wait_for_device(server, device, lambda seen: seen["reported"] == {"power": "on", "brightness": 40}
                         and seen["delta"] == {}, lamp, log)
        refused_at = _set_desired(server, device, brightness=150)
        _wait_for_device(server, device, lambda seen: seen["delta"] == {}, lamp, log)
        seen = json.loads(server.request("GET", f"/devices/{device}?include=metadata")[2])
        assert seen["reported"] == {"power": "on", "brightness": 40}
        ack = seen["metadata"]["desired"]["brightness"]["ack"]
        assert (ack["code"], ack["version"], ack["reason"]) == (400, refused_at, "150 is not a brightness this lamp takes")
        assert server.request("DELETE", f"/devices/{device}")[0] == 204
        assert lamp.wait(timeout=FOLLOW_SECONDS) == 0, log.read_text()
    finally:
        if lamp.poll() is None:
            lamp.kill()
            lamp.wait()


def _wait_for_device(server, device, condition, lamp, log) -> None:
    deadline = time.monotonic() + FOLLOW_SECONDS
    while True:
        seen = json.loads(server.request("GET", f"/devices/{device}")[2])
        if condition(seen):
            return
        assert lamp.poll() is None, log.read_text()
        assert time.monotonic() < deadline, (seen, log.read_text())
        time.sleep(0.2)


def test_acks_reach_the_real_route_and_an_ack_of_a_desire_that_moved_on_is_409(server):
    device = _device(server)
    client = _client(server, device)
    refused_at = _set_desired(server, device, brightness=150, power="on")
    answer = client.ack("/brightness", refused_at, 400, "out of range 0-100")
    assert answer["version"] == refused_at + 1 and answer["delta"] == {"power": "on"}  # a refused leaf leaves it
    moved_at = _set_desired(server, device, power="off")
    with pytest.raises(ApiError) as moved:
        client.ack_many([{"path": "/power", "version": refused_at, "code": 200}])
    assert (moved.value.status, moved.value.slug) == (409, "desire-moved")
    answer = client.ack_many([{"path": "/power", "version": moved_at, "code": 202, "reason": "warming up"}])
    assert answer["delta"] == {"power": "off"}  # in progress: it stays in the delta


def test_a_certificate_device_reads_and_reports_over_mutual_tls_on_the_real_server(dynamodb_local, tmp_path):
    """REST with the device's certificate alone (a token beside it would be 400
    mixed-credentials); the token exchange for the WebSocket is checked on a scripted server in
    tests/unit/test_device_client.py."""
    ca = LocalCA.load_or_create(tmp_path / "tls")
    trust = ssl.create_default_context(cafile=ca.certificate_path)
    process, tls_server = launch(tls=trust, DYNAMODB_ENDPOINT=dynamodb_local.endpoint,
                                 TABLE_NAME=f"client-tls-{uuid.uuid4().hex[:8]}", WORKERS="2", STREAM_PROCESSOR="off",
                                 TLS="1", TLS_DIR=str(ca.directory))
    try:
        device = _device(tls_server, desired={"power": "on"})
        certificate, key = ca.device_certificate(device)
        client = DeviceClient(f"https://127.0.0.1:{tls_server.port}/", device,
                              CertificateCredentials(str(certificate), str(key), str(ca.certificate_path)))
        assert client.get()["delta"] == {"power": "on"}
        assert client.report({"power": "on"})["delta"] == {}
        assert client.delta() == {"deviceId": device, "version": 2, "delta": {}}
        other = _device(tls_server)
        with pytest.raises(ApiError) as refused:  # the certificate names its own device only
            DeviceClient(client.base_url, other, client.credentials).report({"power": "off"})
        assert refused.value.status == 403
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_what_reconnecting_cannot_cure_ends_the_follower_with_follow_error(server):
    device, other = _device(server), _device(server)
    for client in (_client(server, device, credentials=TokenCredentials("not-a-token")),  # 401, not renewable
                   DeviceClient(f"http://127.0.0.1:{server.port}/", other,  # 403: a device follows only itself
                                TokenCredentials(lambda: token(device=device)))):
        follower = client.follow(since=0, backoff=Backoff(**FAST_BACKOFF))
        with pytest.raises(FollowError):
            next(iter(follower))
        assert follower.reconnects == []
