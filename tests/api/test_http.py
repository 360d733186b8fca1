"""Through the real local server (`python -m localdev.server`) over HTTP, on DynamoDB Local."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functions.api.openapi import OPENAPI
from functions.device_state.client import dynamodb_client
from functions.device_state.model.values import dumps
from functions.device_state.table import create_table
from localdev.dynamodb_local import free_port
from tests.auth import with_credentials
from tests.conftest import table_admin

pytestmark = pytest.mark.dynamodb_local
READ_SECONDS = 2  # the server's deadline for reading one request (default 5)


class Server:
    def __init__(self, port: int, log=None, tls: ssl.SSLContext | None = None):
        self.port = port
        self._log = log  # an unnamed temporary file the server process writes to
        self.tls = tls  # the client's TLS context when the server speaks HTTPS

    @property
    def log(self) -> str:
        """What the server printed so far (its request lines, tracebacks, why it stopped)."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def request(self, method, path, body=None, headers=None, raw: bytes | None = None, timeout: float = 30,
                tls: ssl.SSLContext | None = None):
        """One request on its own connection; ``tls``: this request's TLS context (a client
        certificate), instead of the server's default one."""
        tls = tls or self.tls
        connection = (http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=tls) if tls
                      else http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout))
        headers = with_credentials(headers)
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            headers.setdefault("Content-Type", "application/json")
        try:
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            payload = response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, payload
        finally:
            connection.close()


def launch(tls: ssl.SSLContext | None = None, **env) -> tuple[subprocess.Popen, Server]:
    """`python -m localdev.server` with ``env`` on a free port, once it answers (over HTTPS with
    ``tls``, the client's context, for a server started with TLS=1). What it prints goes to
    ``server.log``, so a test can show why a server stopped. One without the stream processor makes
    its table without a stream (TABLE_STREAM=off: nobody reads it). Its stream processor and fan-out
    run at the API's priority: niced, they starve behind the suite's other workers on a shared
    machine (measured: 16 writers' 321 versions to 3 subscribers missed their 20 s beside four
    busy processes, and arrived in time at priority 0), which no deployed Lambda meets."""
    port = free_port()
    log = tempfile.TemporaryFile()
    process = subprocess.Popen([sys.executable, "-m", "localdev.server"],
                               env=dict(os.environ, PORT=str(port), STREAM_NICENESS="0", **{"TABLE_STREAM": "off", **env}),
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    candidate = Server(port, log, tls)
    deadline = time.monotonic() + 60
    while True:
        try:
            if candidate.request("GET", "/openapi.json")[0] == 200:
                return process, candidate
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the local server did not start:\n{candidate.log[-4000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def server(dynamodb_local):
    # These tests are about writes under contention on a shared 2-core machine; the change feed's
    # processor (tested with its own server in test_changes_api.py) would add its writes to the
    # contention budget they measure.
    table_name = f"http-{uuid.uuid4().hex[:8]}"
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=table_name,
                                WORKERS="8", REQUEST_READ_SECONDS=str(READ_SECONDS), STREAM_PROCESSOR="off",
                                FLEET_INDEX="state/site:string")  # so that a count has a field to read
    candidate.table = table_name
    yield candidate
    process.terminate()
    process.wait(timeout=20)


def test_readme_flow_create_patch_and_a_stale_if_match(server):
    status, headers, body = server.request("POST", "/devices", {"deviceId": "readme-lamp", "state": {"brightness": 50}})
    assert status == 201 and headers["etag"] == '"1"' and headers["location"] == "/devices/readme-lamp"
    status, headers, body = server.request(
        "PATCH", "/devices/readme-lamp", {"brightness": 75},
        headers={"Content-Type": "application/merge-patch+json", "If-Match": '"1"'})
    assert status == 200 and headers["etag"] == '"2"' and json.loads(body)["state"]["brightness"] == 75
    status, headers, body = server.request(
        "PATCH", "/devices/readme-lamp", {"brightness": 25},
        headers={"Content-Type": "application/merge-patch+json", "If-Match": '"1"'})
    assert status == 412 and headers["etag"] == '"2"'
    assert headers["content-type"] == "application/problem+json"
    status, headers, body = server.request("GET", "/devices/readme-lamp", headers={"If-None-Match": '"2"'})
    assert status == 304 and body == b""


def test_concurrent_increments_over_http_are_all_applied(server):
    threads, per_thread = 16, 8
    server.request("POST", "/devices", {"deviceId": "hot-http", "state": {"n": 0}})
    barrier = threading.Barrier(threads)
    statuses, lock = [], threading.Lock()
    patch = [{"op": "increment", "path": "/n", "value": 1}]

    def worker():
        barrier.wait()
        for _ in range(per_thread):
            status, _, _ = server.request("PATCH", "/devices/hot-http", patch,
                                          headers={"Content-Type": "application/json-patch+json"})
            with lock:
                statuses.append(status)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert statuses == [200] * (threads * per_thread)
    status, headers, body = server.request("GET", "/devices/hot-http")
    device = json.loads(body)
    assert device["state"]["n"] == threads * per_thread
    assert device["version"] == 1 + threads * per_thread
    assert headers["etag"] == f'"{device["version"]}"'


def test_keyed_increments_with_lost_responses_apply_exactly_once(server):
    """8 clients x 20 increments, each with its own key; a random third of the responses are
    "lost" (the client never reads them) and the request is sent again with the same key."""
    import random

    clients, per_client = 8, 20
    server.request("POST", "/devices", {"deviceId": "idem-http", "state": {"n": 0}})
    patch = [{"op": "increment", "path": "/n", "value": 1}]
    barrier = threading.Barrier(clients)
    outcomes, lock = [], threading.Lock()

    def client(number):
        rng = random.Random(number)
        barrier.wait()
        for i in range(per_client):
            headers = {"Content-Type": "application/json-patch+json", "Idempotency-Key": f"c{number}-{i}"}
            lost_status = None
            if rng.random() < 1 / 3:  # the client never reads this answer ("lost")
                lost_status = server.request("PATCH", "/devices/idem-http", patch, headers=headers)[0]
            while True:  # a 503 wrote nothing, and a retry with the same key is always safe
                status, response_headers, _ = server.request("PATCH", "/devices/idem-http", patch, headers=headers)
                if status != 503:
                    break
            with lock:
                outcomes.append((status, lost_status, response_headers.get("idempotent-replayed")))

    pool = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert [status for status, _, _ in outcomes] == [200] * (clients * per_client)
    replays = [replayed for _, lost_status, replayed in outcomes if lost_status == 200]
    assert replays and all(replayed == "true" for replayed in replays)  # the lost one applied: replayed
    device = json.loads(server.request("GET", "/devices/idem-http")[2])
    assert device["state"]["n"] == clients * per_client
    assert device["version"] == 1 + clients * per_client


def test_a_waiter_over_http_gets_the_lease_when_the_holder_releases_and_the_old_token_is_fenced(server):
    server.request("POST", "/devices", {"deviceId": "leased-http", "state": {"n": 0}})
    status, headers, body = server.request("POST", "/devices/leased-http/leases", {"ttlSeconds": 30})
    assert status == 201
    first = json.loads(body)
    merge = {"Content-Type": "application/merge-patch+json"}
    assert server.request("PATCH", "/devices/leased-http", {"n": 1}, headers=merge)[0] == 423
    waited = {}

    def waiter():
        started = time.monotonic()
        waited["status"], _, payload = server.request("POST", "/devices/leased-http/leases", {"waitSeconds": 20})
        waited["seconds"], waited["lease"] = time.monotonic() - started, json.loads(payload)

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 10
    while json.loads(server.request("GET", "/devices/leased-http/leases")[2])["queueLength"] != 1:
        assert time.monotonic() < deadline, "the waiter never queued"  # it queues in another worker process
        time.sleep(0.05)
    token = {**merge, "Lease-Token": first["leaseToken"]}
    assert server.request("PATCH", "/devices/leased-http", {"n": 1}, headers=token)[0] == 200
    assert server.request("DELETE", f"/devices/leased-http/leases/{first['leaseId']}")[0] == 204
    thread.join()
    assert waited["status"] == 201, waited
    second = waited["lease"]
    assert second["fencingToken"] > first["fencingToken"]
    assert server.request("PATCH", "/devices/leased-http", {"n": 2}, headers=token)[0] == 423  # the old holder
    status, _, body = server.request("PATCH", "/devices/leased-http", {"n": 2},
                                     headers={**merge, "Lease-Token": second["leaseToken"]})
    assert status == 200 and json.loads(body)["state"] == {"n": 2}
    assert server.request("DELETE", f"/devices/leased-http/leases/{second['leaseId']}")[0] == 204


def test_a_long_request_in_one_worker_holds_up_no_other_request(server):
    server.request("POST", "/devices", {"deviceId": "busy-worker", "state": {}})
    holder = json.loads(server.request("POST", "/devices/busy-worker/leases", {"ttlSeconds": 60})[2])
    waited = {}
    thread = threading.Thread(target=lambda: waited.update(status=server.request(
        "POST", "/devices/busy-worker/leases", {"waitSeconds": 25})[0]))
    thread.start()
    deadline = time.monotonic() + 10
    while json.loads(server.request("GET", "/devices/busy-worker/leases")[2])["queueLength"] != 1:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.05)
    # More requests than workers, one after another: with the waiter's worker taking any of
    # them, that request would stall until the wait ended.
    for _ in range(24):
        assert server.request("GET", "/devices/busy-worker")[0] == 200
    assert thread.is_alive(), "the waiter finished early, so the test proved nothing"
    assert server.request("DELETE", f"/devices/busy-worker/leases/{holder['leaseId']}")[0] == 204
    thread.join()
    assert waited["status"] == 201


def test_openapi_document_is_served(server):
    status, headers, body = server.request("GET", "/openapi.json")
    assert status == 200 and json.loads(body) == json.loads(dumps(OPENAPI))


# ------------------------------------------------------- framing and methods (issue 13)


def raw_exchange(server, data: bytes, timeout: float = 10) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as connection:
        connection.sendall(data)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_idle_connections_time_out_and_never_stop_the_server_serving_others(server):
    """More idle connections than workers (8): before, every worker sat in a read forever."""
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
    try:
        started = time.monotonic()
        status, _, _ = server.request("GET", "/openapi.json")
        served_after = time.monotonic() - started
        assert status == 200 and served_after < READ_SECONDS * 4 + 5, served_after
        for connection in idle:  # each was dropped by the server, not answered
            connection.settimeout(READ_SECONDS * 4 + 5)
            assert connection.recv(1) == b""
    finally:
        for connection in idle:
            connection.close()


def test_a_client_that_dribbles_its_request_is_dropped_at_the_deadline(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=READ_SECONDS * 4) as connection:
        started = time.monotonic()
        connection.sendall(b"GET /devices HTTP/1.1\r\n")
        closed = False
        for _ in range(READ_SECONDS * 4 * 2):
            try:
                connection.sendall(b"X-Slow: y\r\n")
            except OSError:
                closed = True
                break
            time.sleep(0.5)
            connection.setblocking(False)
            try:
                closed = connection.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed = True
            connection.setblocking(True)
            if closed:
                break
        assert closed and time.monotonic() - started < READ_SECONDS + 3


def test_a_few_bytes_then_a_close_are_answered_without_waiting_for_the_read_deadline(server):
    """Fewer bytes than the WebSocket peek reads (8), then the client's FIN: that peek once held
    the worker until the deadline, for bytes that could never come."""
    for request in (b"\r\n\r\n", b"GET\r\n\r\n", b"\x00\x01", b"G", b"GET /w"):
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", server.port), timeout=READ_SECONDS * 3) as connection:
            connection.sendall(request)
            connection.shutdown(socket.SHUT_WR)
            while connection.recv(65536):
                pass
        assert time.monotonic() - started < READ_SECONDS / 2, request


@pytest.mark.parametrize("length", [b"abc", b"-1", b"1e3", b"5, 6"])
def test_a_malformed_or_negative_content_length_is_400(server, length):
    response = raw_exchange(server, b"POST /devices HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                    b"Content-Length: " + length + b"\r\n\r\n{}")
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), response
    assert b"application/problem+json" in head and json.loads(body)["status"] == 400


@pytest.mark.parametrize("method", ["TRACE", "OPTIONS", "PROPFIND"])
def test_unknown_methods_get_a_405_problem_with_allow_from_the_server(server, method):
    status, headers, body = server.request(method, "/devices/any")
    assert status == 405 and headers["allow"] == "DELETE, GET, HEAD, PATCH, PUT"
    assert headers["content-type"] == "application/problem+json" and json.loads(body)["status"] == 405


def test_head_and_if_match_on_reads_over_http(server):
    server.request("POST", "/devices", {"deviceId": "head-1", "state": {"a": 1}})
    status, headers, body = server.request("HEAD", "/devices/head-1")
    assert status == 200 and headers["etag"] == '"1"' and body == b""
    status, headers, _ = server.request("GET", "/devices/head-1", headers={"If-Match": '"2"'})
    assert status == 412 and headers["etag"] == '"1"'
    assert server.request("HEAD", "/devices/head-1", headers={"If-Match": '"2"'})[0] == 412


# ------------------------------------------------------------------- fuzz

_OPERATIONS = {
    (method.upper(), path): {int(code) for code in operation["responses"]}
    for path, item in OPENAPI["paths"].items()
    for method, operation in item.items()
    if method != "parameters"
}
_IDS = st.sampled_from(["fuzz-1", "fuzz-2", "a", "x" * 128, "x" * 129, "bad%20id", "%41", "%C3%A9", "a%2Fb", "",
                        "a:b", "a%00"])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)
_PATCH_OPS = st.lists(st.fixed_dictionaries(
    {"op": st.sampled_from(["add", "remove", "replace", "move", "copy", "test", "increment", "bogus"]),
     "path": st.sampled_from(["", "/a", "/a/0", "/b/-", "a", "/~2"])},
    optional={"value": _JSON, "from": st.sampled_from(["/a", "/b", ""]), "min": st.integers(), "max": st.integers()},
), max_size=4)
_TAGS = st.sampled_from([None, "*", '"1"', '"2"', 'W/"1"', '"1", "2"', "1", '"', "", '"x"'])
_BODIES = st.one_of(
    st.none(),
    _JSON.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"deviceId": _IDS | st.text(max_size=4), "state": _JSON}).map(
        lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"state": _JSON}).map(lambda v: json.dumps(v).encode()),
    _PATCH_OPS.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
    st.sampled_from([b'{"a": NaN}', b'{"a": 1e999}', b"[" * 2000, b'{"a": 0.1}', b"\xff\xfe"]),
    st.lists(st.fixed_dictionaries(
        {"deviceId": _IDS},
        optional={"mergePatch": _JSON, "jsonPatch": _PATCH_OPS, "put": st.fixed_dictionaries({"state": _JSON}),
                  "delete": st.booleans(), "check": st.booleans(), "ifMatch": _TAGS,
                  "ifNoneMatch": st.sampled_from(["*", '"1"'])}),
        max_size=3).map(lambda ops: json.dumps({"operations": ops}).encode()),
    st.fixed_dictionaries({}, optional={
        "ttlSeconds": st.sampled_from([0, 1, 2, 900, 901, -3, 1.5, "60", True, None]),
        "waitSeconds": st.sampled_from([0, 0.05, 26, -1, "x", None]),
        "owner": st.sampled_from(["job", "", 7])}).map(lambda v: json.dumps(v).encode()),
)
# Issue 13: the inputs that broke the service, as generators.
_SURROGATES = st.sampled_from(["\\ud800", "\\udfff", "\\udbff", "x\\ud800y"])
_NUMBERS = st.one_of(
    st.integers(0, 8).map(lambda zeros: "1." + "0" * (38 + zeros)),  # trailing zeros past 38 digits
    st.integers(37, 44).map(lambda zeros: "1" + "0" * zeros),  # exponents written out
    st.integers(38, 45).flatmap(lambda digits: st.text("0123456789", min_size=digits, max_size=digits)).map(
        lambda digits: "9" + digits),  # 38-46 significant digits
    st.tuples(st.sampled_from(["0", "1", "-9.5", "0.0"]), st.sampled_from(["E", "e-", "E+"]),
              st.integers(100, 400)).map(lambda t: f"{t[0]}{t[1]}{t[2]}"),  # extreme exponents, zero included
)
_DEEP = st.integers(20, 1200).map(lambda depth: "[" * depth + "1" + "]" * depth)
_HOSTILE_VALUES = st.one_of(_SURROGATES.map(lambda s: f'"{s}"'), _NUMBERS, _DEEP)
_HOSTILE_BODIES = st.one_of(
    _SURROGATES.map(lambda s: f'{{"{s}": 1}}'),
    _HOSTILE_VALUES.map(lambda v: f'{{"n": {v}}}'),
    _HOSTILE_VALUES.map(lambda v: f'{{"deviceId": "fuzz-1", "state": {{"n": {v}}}}}'),
    _HOSTILE_VALUES.map(lambda v: f'{{"state": {{"n": {v}}}}}'),
    st.tuples(st.sampled_from(["add", "replace", "increment", "test"]), _HOSTILE_VALUES).map(
        lambda t: f'[{{"op": "{t[0]}", "path": "/n", "value": {t[1]}}}]'),
    st.tuples(_NUMBERS, _NUMBERS).map(lambda t: f'[{{"op": "increment", "path": "/n", "value": {t[0]}, "max": {t[1]}}}]'),
    _SURROGATES.map(lambda s: f'{{"owner": "{s}"}}'),
    _HOSTILE_VALUES.map(lambda v: f'{{"operations": [{{"deviceId": "fuzz-1", "mergePatch": {{"n": {v}}}}}]}}'),
).map(str.encode)
_HOSTILE_CURSORS = st.one_of(
    _DEEP.map(str.encode), _SURROGATES.map(lambda s: f'["{s}", "state"]'.encode()), st.binary(max_size=30),
).map(lambda raw: "cursor=" + __import__("base64").urlsafe_b64encode(raw).decode().rstrip("="))
_BODIES = st.one_of(_BODIES, _HOSTILE_BODIES)

_TYPES = st.sampled_from([None, "application/json", "application/merge-patch+json", "application/json-patch+json",
                          "text/plain", "application/json; charset=latin-1", "application/json;charset=utf-8"])


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    method=st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "TRACE", "OPTIONS"]),
    target=st.one_of(
        _IDS.map(lambda i: f"/devices/{i}"),
        st.just("/devices"),
        st.sampled_from(["limit=1", "limit=0", "limit=x", "cursor=abc", "cursor=WyJhIiwic3RhdGUiXQ",
                         "foo=bar", "limit=2&limit=3"]).map(lambda q: f"/devices?{q}"),
        _HOSTILE_CURSORS.map(lambda q: f"/devices?{q}"),
        st.just("/elsewhere"),
        st.just("/transactions"),
        _IDS.map(lambda i: f"/devices/{i}/leases"),
        st.sampled_from(["garbage", "1.0123456789abcdef0123456789abcdef", "1", "%2E"]).map(
            lambda lease: f"/devices/fuzz-1/leases/{lease}"),
    ),
    body=_BODIES,
    content_type=_TYPES,
    if_match=_TAGS,
    if_none_match=_TAGS,
    idempotency_key=st.sampled_from([None, "fuzz-key", "", "x" * 256]),
    lease_token=st.sampled_from([None, "1", "x", "0" * 32, "f" * 33, "99999999999999999999"]),
)
def test_fuzz_never_5xx_and_only_documented_statuses(server, carried_snapshot, method, target, body, content_type,
                                                     if_match, if_none_match, idempotency_key, lease_token):
    headers = {}
    for name, value in (("Content-Type", content_type), ("If-Match", if_match), ("If-None-Match", if_none_match),
                        ("Idempotency-Key", idempotency_key), ("Lease-Token", lease_token)):
        if value is not None:
            headers[name] = value
    before = carried_snapshot.pop("after", None) or _snapshot(server)
    status, response_headers, payload = server.request(method, target, raw=body, headers=headers)
    after = _snapshot(server)
    assert status < 500, payload
    if status >= 400:
        assert after == before, (method, target, status, payload)  # a refusal changed nothing
    path = target.split("?")[0]
    # Powertools treats a trailing slash as absent: /devices/ is the collection
    segments = path.split("/")[2:] if path.startswith("/devices/") else None
    route = "/devices" if path in ("/devices", "/devices/") else \
        "/transactions" if path == "/transactions" else \
        None if segments is None else \
        "/devices/{deviceId}" if len(segments) == 1 else \
        "/devices/{deviceId}/leases" if len(segments) == 2 and segments[1] == "leases" else \
        "/devices/{deviceId}/leases/{leaseId}" if len(segments) == 3 and segments[1] == "leases" else None
    documented = _OPERATIONS.get((method, route))
    if documented is None:  # no such route: only 404 or 405
        assert status in (404, 405), (method, target, status, payload)
    else:
        assert status in documented, (method, target, status, payload)
    if status >= 400 and method != "HEAD":
        problem = json.loads(payload)
        assert response_headers["content-type"] == "application/problem+json"
        assert problem["status"] == status
    carried_snapshot["after"] = after  # only once every check passed: after a failure the next one reads afresh


@pytest.fixture
def carried_snapshot() -> dict:
    """The devices as the previous example left them, which are the next example's before: nothing
    else writes to the server between two examples. Hypothesis runs every example of a test in one
    call of a function-scoped fixture, so one snapshot per example serves as both."""
    return {}


def _snapshot(server) -> list:
    """Every device with its version and state, and the fuzz device's lease holder."""
    devices, cursor = [], None
    while True:
        status, _, body = server.request("GET", "/devices?limit=100" + (f"&cursor={cursor}" if cursor else ""))
        assert status == 200
        page = json.loads(body)
        devices += [(item["deviceId"], item["version"], json.dumps(item["state"], sort_keys=True))
                    for item in page["items"]]
        cursor = page["nextCursor"]
        if not cursor:
            return sorted(devices) + [json.loads(server.request("GET", "/devices/fuzz-1/leases")[2]).get("holder")]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(spelling=_NUMBERS, how=st.sampled_from(["post", "merge", "add", "increment"]))
def test_fuzz_numbers_are_stored_exactly_or_refused_with_4xx(server, spelling, how):
    """A number is either stored as the equal number or refused (400/413) with nothing changed."""
    from decimal import Decimal, localcontext

    device_id = f"num-{uuid.uuid4().hex[:8]}"
    status, _, _ = server.request("POST", "/devices", {"deviceId": device_id, "state": {"n": 5}})
    assert status == 201
    path = f"/devices/{device_id}"
    if how == "post":
        path, body, kind = "/devices", f'{{"deviceId": "{device_id}-p", "state": {{"n": {spelling}}}}}', "application/json"
    elif how == "merge":
        body, kind = f'{{"n": {spelling}}}', "application/merge-patch+json"
    else:
        body = f'[{{"op": "{how}", "path": "/n", "value": {spelling}}}]'
        kind = "application/json-patch+json"
    status, _, payload = server.request("PATCH" if how != "post" else "POST", path, raw=body.encode(),
                                        headers={"Content-Type": kind})
    assert status in (200, 201, 400, 413), (status, payload)
    stored_id = f"{device_id}-p" if how == "post" else device_id
    read_status, _, read = server.request("GET", f"/devices/{stored_id}")
    if status >= 400:
        assert read_status == (404 if how == "post" else 200)
        if how != "post":
            assert json.loads(read)["version"] == 1
        return
    with localcontext() as exact:
        exact.prec = 1000  # the default 28 digits would round the expectation itself
        expected = Decimal(spelling) + (5 if how == "increment" else 0)
    assert Decimal(json.loads(read, parse_float=Decimal, parse_int=Decimal)["state"]["n"]) == expected


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=st.one_of(
    st.sampled_from([b"GET / HTTP/1.1\r\n\r\n", b"\r\n\r\n", b"GET\r\n\r\n", b"GET /devices HTTP/9.9\r\n\r\n",
                     b"POST /devices HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}",
                     b"POST /devices HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                     b"GET /devices HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"]),
    st.tuples(st.sampled_from(["GET", "POST", "PATCH", "BREW", "G\x00T"]),
              st.sampled_from(["/devices", "/devices/x", "*", "http://h/devices", "/%ff", "/" + "a" * 70000]),
              st.sampled_from(["", "Content-Length: -5\r\n", "Content-Length: +5\r\n", "Content-Length: 0x10\r\n",
                               "Content-Length: 2\r\nContent-Length: 3\r\n", "X: \xff\r\n", "bad header\r\n"]),
              st.binary(max_size=20)).map(
        lambda t: f"{t[0]} {t[1]} HTTP/1.1\r\nHost: x\r\n{t[2]}\r\n".encode("latin-1") + t[3]),
    st.binary(max_size=200),
))
def test_fuzz_malformed_framing_never_5xx_and_the_server_keeps_serving(server, request):
    with socket.create_connection(("127.0.0.1", server.port), timeout=READ_SECONDS * 3) as connection:
        connection.sendall(request)
        try:
            connection.shutdown(socket.SHUT_WR)
            response = connection.recv(65536)
        except OSError:
            response = b""
    if response:
        # An HTTP/0.9-style request line gets a bare body naming the code; 505 is the one right
        # answer to an HTTP version the server does not speak (RFC 9110 15.6.6).
        code = re.match(rb"HTTP/1\.[01] (\d{3}) ", response) or re.search(rb"Error code: (\d{3})", response)
        assert code and (int(code.group(1)) < 500 or code.group(1) == b"505"), response
    assert server.request("GET", "/openapi.json")[0] == 200


def test_ctrl_c_stops_the_server_and_its_dynamodb_local():
    """`make serve` as a user runs it: DynamoDB Local started by the server itself, then Ctrl-C
    (SIGINT to the whole process group, as a terminal sends it)."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "DYNAMODB_ENDPOINT"}
    process = subprocess.Popen([sys.executable, "-m", "localdev.server", "--port", str(port), "--workers", "2"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(port)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if server.request("PUT", "/devices/c", {"state": {}})[0] == 201:
                break
        except OSError:
            time.sleep(0.2)
    else:
        process.kill()
        pytest.fail("the server did not start")
    group = os.getpgid(process.pid)
    os.killpg(group, signal.SIGINT)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output
    assert b"stopped" in output
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)  # nothing of the group is left: workers and DynamoDB Local are gone


def test_the_suites_server_without_the_stream_processor_makes_its_table_without_a_stream(server, dynamodb_local):
    admin = dynamodb_client(dynamodb_local.endpoint, "us-east-1")
    assert "LatestStreamArn" not in admin.describe_table(TableName=server.table)["Table"]


def test_a_table_kept_without_a_stream_gets_one_from_a_server_with_the_stream_processor(dynamodb_local):
    """As a table kept on disk from before streams (or made with TABLE_STREAM=off): the server that
    runs the processor enables the stream, and the feed follows the writes from then on."""
    name = f"unstreamed-{uuid.uuid4().hex[:8]}"
    admin = table_admin(dynamodb_local.endpoint)
    create_table(admin, name, stream=False)
    process, streamed = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=name, WORKERS="1")
    try:
        assert "LatestStreamArn" in admin.describe_table(TableName=name)["Table"]
        assert streamed.request("PUT", "/devices/streamed-later", {"state": {"on": True}})[0] == 201
        status, _, body = streamed.request("GET", "/devices/streamed-later/changes?since=0&waitSeconds=20")
        assert status == 200 and [change["version"] for change in json.loads(body)["changes"]] == [1], body
    finally:
        process.terminate()
        process.wait(timeout=20)
        admin.delete_table(TableName=name)


def test_a_child_stopped_the_instant_it_is_forked_ends_and_is_not_left_running():
    """A SIGTERM that reached the server while it forked a worker was swallowed (its handler's
    KeyboardInterrupt raised inside logging's after-fork callback, where exceptions are ignored),
    and a clean clone's test of a replaced worker timed out in the server's stop. Forks happen
    under _stops_held: here each child, sent SIGTERM at once, still takes it once it can."""
    import os
    import signal
    import time

    from localdev import server

    for _ in range(30):
        with server._stops_held():
            pid = server._forked(time.sleep, 60)
            os.kill(pid, signal.SIGTERM)  # at once: pending in the child until it lets it in
        deadline = time.monotonic() + 10
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            assert time.monotonic() < deadline, "the child did not stop"
            time.sleep(0.01)
        assert os.WIFSIGNALED(done[1]) and os.WTERMSIG(done[1]) == signal.SIGTERM


def test_a_worker_that_dies_is_replaced_and_the_server_keeps_serving(dynamodb_local):
    """One failed worker (killed here; a bug would do the same) never stops the server: the
    others keep serving, a new worker takes its place, and the log says what happened."""
    process, server = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"crash-{uuid.uuid4().hex[:8]}",
                             WORKERS="2", STREAM_PROCESSOR="off")
    try:
        with open(f"/proc/{process.pid}/task/{process.pid}/children") as children:
            workers = [int(pid) for pid in children.read().split()]
        assert len(workers) == 3  # two HTTP workers, then the WebSocket process
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while "starting another" not in server.log and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [server.request("PUT", f"/devices/after-crash-{n}", {"state": {}})[0] for n in range(6)] == [201] * 6
        assert process.poll() is None, server.log
        assert f"worker {workers[0]} exited unexpectedly (signal SIGKILL); starting another" in server.log
    finally:
        process.terminate()
        process.wait(timeout=20)
