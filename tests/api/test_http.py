"""Through the real local server (`python -m localdev.server`) over HTTP, on DynamoDB Local."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functions.api.openapi import OPENAPI
from localdev.dynamodb_local import free_port

pytestmark = pytest.mark.dynamodb_local


class Server:
    def __init__(self, port: int):
        self.port = port

    def request(self, method, path, body=None, headers=None, raw: bytes | None = None):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = dict(headers or {})
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


@pytest.fixture(scope="module")
def server(dynamodb_local):
    port = free_port()
    env = dict(os.environ, DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"http-{uuid.uuid4().hex[:8]}",
               PORT=str(port), WORKERS="8",
               # These tests are about writes under contention on a shared 2-core machine; the change
               # feed's processor (tested with its own server in test_changes_api.py) would add its
               # writes to the contention budget they measure.
               STREAM_PROCESSOR="off")
    process = subprocess.Popen([sys.executable, "-m", "localdev.server"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    candidate = Server(port)
    deadline = time.monotonic() + 60
    while True:
        try:
            if candidate.request("GET", "/openapi.json")[0] == 200:
                break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail("the local server did not start")
        time.sleep(0.2)
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
            if rng.random() < 1 / 3:
                server.request("PATCH", "/devices/idem-http", patch, headers=headers)  # response lost
                lost = True
            else:
                lost = False
            status, response_headers, _ = server.request("PATCH", "/devices/idem-http", patch, headers=headers)
            with lock:
                outcomes.append((status, lost, response_headers.get("idempotent-replayed")))

    pool = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    assert [status for status, _, _ in outcomes] == [200] * (clients * per_client)
    lost = [replayed for _, was_lost, replayed in outcomes if was_lost]
    assert lost and all(replayed == "true" for replayed in lost)
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
    token = {**merge, "Lease-Token": str(first["fencingToken"])}
    assert server.request("PATCH", "/devices/leased-http", {"n": 1}, headers=token)[0] == 200
    assert server.request("DELETE", f"/devices/leased-http/leases/{first['leaseId']}")[0] == 204
    thread.join()
    assert waited["status"] == 201, waited
    second = waited["lease"]
    assert second["fencingToken"] > first["fencingToken"]
    assert server.request("PATCH", "/devices/leased-http", {"n": 2}, headers=token)[0] == 423  # the old holder
    status, _, body = server.request("PATCH", "/devices/leased-http", {"n": 2},
                                     headers={**merge, "Lease-Token": str(second["fencingToken"])})
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
    assert status == 200 and json.loads(body) == json.loads(json.dumps(OPENAPI))


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
_TYPES = st.sampled_from([None, "application/json", "application/merge-patch+json", "application/json-patch+json",
                          "text/plain", "application/json; charset=latin-1", "application/json;charset=utf-8"])


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"]),
    target=st.one_of(
        _IDS.map(lambda i: f"/devices/{i}"),
        st.just("/devices"),
        st.sampled_from(["limit=1", "limit=0", "limit=x", "cursor=abc", "cursor=WyJhIiwic3RhdGUiXQ",
                         "foo=bar", "limit=2&limit=3"]).map(lambda q: f"/devices?{q}"),
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
    lease_token=st.sampled_from([None, "1", "2", "x", "0", "99999999999999999999"]),
)
def test_fuzz_never_5xx_and_only_documented_statuses(server, method, target, body, content_type, if_match,
                                                     if_none_match, idempotency_key, lease_token):
    headers = {}
    for name, value in (("Content-Type", content_type), ("If-Match", if_match), ("If-None-Match", if_none_match),
                        ("Idempotency-Key", idempotency_key), ("Lease-Token", lease_token)):
        if value is not None:
            headers[name] = value
    status, response_headers, payload = server.request(method, target, raw=body, headers=headers)
    assert status < 500, payload
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
    if status >= 400:
        problem = json.loads(payload)
        assert response_headers["content-type"] == "application/problem+json"
        assert problem["status"] == status


def test_ctrl_c_stops_the_server_and_its_dynamodb_local():
    """`make serve` as a user runs it: DynamoDB Local started by the server itself, then Ctrl-C
    (SIGINT to the whole process group, as a terminal sends it)."""
    import signal

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
