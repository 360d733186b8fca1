"""Query strings and paths over the real local server on DynamoDB Local: a path or query that
is not UTF-8 is 400 on every route; UTF-8, percent-encoded or not, is read as UTF-8."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
import uuid

import pytest
from websockets.sync.client import connect

from tests.api.test_http import launch
from tests.auth import bearer

pytestmark = pytest.mark.dynamodb_local

# make serve's own declaration and one more: more of the fleet index's bookkeeping items than a
# small page reads
DECLARED = ("reported/firmware:string,reported/online:boolean,reported/battery:number,state/site:string,"
            "desired/brightness:number")
DEVICES = 24
BUSY_VERSIONS = 40  # one device's change items: a long run of items that are no device


@pytest.fixture(scope="module")
def server(dynamodb_local):
    """A server on a fresh table with fields declared: before any device is written, the table
    holds the fleet index's bookkeeping (marked ready at start) and nothing else."""
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"pages-{uuid.uuid4().hex[:8]}",
                                FLEET_INDEX=DECLARED, WORKERS="3")
    yield candidate
    process.terminate()
    process.wait(timeout=30)


def get(server, path: str, **query):
    status, _, body = server.request("GET", f"{path}?{urllib.parse.urlencode(query)}" if query else path)
    return status, json.loads(body) if body else None


def slug(problem: dict) -> str:
    return problem["type"].rsplit(":", 1)[-1]


@pytest.fixture(scope="module")
def fleet(server):
    """DEVICES live devices, and beside them every other kind of item the table holds: one
    device's BUSY_VERSIONS change items, lease rows, keyed-write records, tombstones of deleted
    devices, and a WebSocket connection with its subscription (open while the tests run)."""
    live = set()
    for number in range(DEVICES):
        device = f"lst-{number:03d}"
        status, _, body = server.request("POST", "/devices", {"deviceId": device, "state": {"site": f"s{number % 3}"}})
        assert status == 201, body
        live.add(device)
    for version in range(2, BUSY_VERSIONS + 1):
        status, _, body = server.request("PATCH", "/devices/lst-000", {"n": version},
                                         headers={"Content-Type": "application/merge-patch+json"})
        assert status == 200, body
    for device in ("lst-001", "lst-002", "lst-003"):
        status, _, body = server.request("POST", f"/devices/{device}/leases", {"ttlSeconds": 60})
        assert status == 201, body
    for number in range(3):
        status, _, body = server.request("PATCH", f"/devices/lst-01{number}", {"keyed": True},
                                         headers={"Content-Type": "application/merge-patch+json",
                                                  "Idempotency-Key": f"key-{number}"})
        assert status == 200, body
    for number in range(3):
        gone = f"gone-{number}"
        assert server.request("POST", "/devices", {"deviceId": gone, "state": {}})[0] == 201
        assert server.request("DELETE", f"/devices/{gone}")[0] == 204
    client = connect(f"ws://127.0.0.1:{server.port}/ws", additional_headers=bearer(), open_timeout=10)
    client.send(json.dumps({"action": "subscribe", "deviceId": "lst-004", "since": 0}))
    deadline = time.monotonic() + 60
    while True:  # the stream processor has written the busy device's change items
        status, body = get(server, "/devices/lst-000/changes", since=0, limit=100)
        if status == 200 and len(body["changes"]) == BUSY_VERSIONS:
            break
        assert time.monotonic() < deadline, body
        time.sleep(0.5)
    yield live
    client.close()


def _raw(server, target: bytes) -> tuple[int, bytes]:
    """One request with the target's bytes sent as they are (no client library re-encodes them)."""
    from tests.auth import token

    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as connection:
        connection.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                           + token().encode() + b"\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize("target", [
    b'/devices?filter=eq(state/site,"%FF%FE")',
    b'/devices/count?filter=eq(state/site,"%C3")',
    b"/devices?limit=1&cursor=%80",
    b"/devices?%FF=1",
    b"/devices/lst-001?include=%ED%A0%80",  # an encoded surrogate is no UTF-8 either
    b"/devices/lst-001/changes?since=0&waitSeconds=%FF",
    b"/devices/lst-001/versions/1?include=%FF",
    b"/openapi.json?x=%FF",
    b"/devices/%FF%FE",
    b"/devices/lst-001/versions/%FF",
    b"/devices/lst-001/leases/%C0%AF",
    b"/nowhere/%FF",
    b'/devices?filter=eq(state/site,"\xff\xfe")',  # bytes that are no UTF-8, sent unencoded
    b"/devices/\xff",
    b'/devices?filter=eq(state/site,"%EF%BF%BD")',  # U+FFFD: what a gateway puts for such bytes
])
def test_a_path_or_query_that_is_not_utf8_is_400_on_every_route(server, fleet, target):
    status, body = _raw(server, target)
    assert status == 400, body
    problem = json.loads(body)
    assert "UTF-8" in problem["detail"], problem


def test_utf8_in_paths_and_queries_is_read_as_utf8(server, fleet):
    assert server.request("PATCH", "/devices/lst-005", {"site": "münchen"},
                          headers={"Content-Type": "application/merge-patch+json"})[0] == 200
    for target in ('/devices?filter=eq(state/site,"m%C3%BCnchen")'.encode(),
                   '/devices?filter=eq(state/site,"münchen")'.encode(),  # unencoded UTF-8 bytes
                   b'/devices?filter=eq(state/site,"m\\u00fcnchen")'):  # the filter's own JSON escape
        status, body = _raw(server, target)
        assert status == 200, body
        assert [item["deviceId"] for item in json.loads(body)["items"]] == ["lst-005"], target
