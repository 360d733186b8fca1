"""Listing pages and their cursors, and query strings, over the real local server on DynamoDB
Local: every cursor the service issues is taken back, a page holds devices and nothing else
whatever the table holds beside them (the fleet index's bookkeeping, change items, lease rows,
keyed-write records, tombstones, WebSocket connections), each device comes once and the walk
ends with a null cursor; cursors are bound to their listing by a key only the service holds;
a path or query that is not UTF-8 is 400 on every route."""

from __future__ import annotations

import base64
import hashlib
import json
import math
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
    table_name = f"pages-{uuid.uuid4().hex[:8]}"
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=table_name,
                                FLEET_INDEX=DECLARED, WORKERS="3")
    candidate.table = table_name
    yield candidate
    process.terminate()
    process.wait(timeout=30)


def get(server, path: str, **query):
    status, _, body = server.request("GET", f"{path}?{urllib.parse.urlencode(query)}" if query else path)
    return status, json.loads(body) if body else None


def slug(problem: dict) -> str:
    return problem["type"].rsplit(":", 1)[-1]


def walk(server, limits, **query) -> tuple[list[str], list[int]]:
    """Every page of a listing, the n-th asked with limits[n % len(limits)]: the device ids in
    order and each page's size. Every page must be a 200 of devices."""
    ids, sizes, cursor = [], [], None
    while True:
        limit = limits[len(sizes) % len(limits)]
        status, body = get(server, "/devices", limit=limit, **query, **({"cursor": cursor} if cursor else {}))
        assert status == 200, (len(sizes), body)
        assert len(body["items"]) <= limit
        for item in body["items"]:
            assert {"deviceId", "version", "state"} <= set(item), item
        ids += [item["deviceId"] for item in body["items"]]
        sizes.append(len(body["items"]))
        cursor = body["nextCursor"]
        assert len(sizes) < 500, "the walk does not end"
        if cursor is None:
            return ids, sizes


def test_a_table_holding_only_bookkeeping_lists_no_device_and_its_walk_ends(server):
    for limit in (1, 2, 5, 50):
        ids, sizes = walk(server, [limit])
        assert ids == [] and len(sizes) <= 2, sizes


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


@pytest.mark.parametrize("limits", [[1], [2], [5], [50], [3, 1, 7, 100]], ids=str)
def test_every_walk_takes_each_cursor_back_shows_each_device_once_and_ends_with_null(server, fleet, limits):
    ids, sizes = walk(server, limits)
    assert sorted(ids) == sorted(fleet) and len(ids) == len(set(ids))
    # A page reads past what is no device (here at most BUSY_VERSIONS and a few items in a row),
    # so no page but the last comes back empty, and pages fill up to their limit.
    assert all(sizes[:-1]), sizes
    if len(set(limits)) == 1:
        assert len(sizes) <= math.ceil(len(fleet) / limits[0]) + 1, sizes


def _assert_bound_to_their_listing(server) -> None:
    """A cursor given to another listing (filter, sort, none), or changed by one character anywhere: 400."""
    _, page = get(server, "/devices", limit=2)
    plain = page["nextCursor"]
    _, page = get(server, "/devices", filter="exists(state/site)", limit=2)
    queried = page["nextCursor"]
    assert plain and queried
    for query in ({"cursor": queried},  # a fleet query's, without its filter
                  {"cursor": plain, "filter": "exists(state/site)"},  # the plain listing's, with a filter
                  {"cursor": queried, "filter": "exists(reported/firmware)"},  # another filter's
                  {"cursor": queried, "filter": "exists(state/site)", "sort": "+state/site"}):  # another sort
        status, problem = get(server, "/devices", limit=2, **query)
        assert (status, slug(problem)) == (400, "invalid-cursor"), (query, problem)
    for cursor in (plain, queried):  # changed by one character anywhere: refused
        for at in (0, len(cursor) // 2, len(cursor) - 1):
            changed = cursor[:at] + ("A" if cursor[at] != "A" else "B") + cursor[at + 1:]
            status, problem = get(server, "/devices", limit=2, cursor=changed,
                                  **({"filter": "exists(state/site)"} if cursor is queried else {}))
            assert (status, slug(problem)) == (400, "invalid-cursor"), (at, problem)


def test_after_the_cursor_key_is_replaced_earlier_cursors_are_refused_and_the_walk_starts_again(
        server, fleet, dynamodb_local):
    _, page = get(server, "/devices", limit=2)
    earlier = page["nextCursor"]
    process, replaced = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=server.table,
                               FLEET_INDEX=DECLARED, WORKERS="1", STREAM_PROCESSOR="off", CURSOR_KEY="r" * 64)
    try:
        status, problem = get(replaced, "/devices", limit=2, cursor=earlier)
        assert (status, slug(problem)) == (400, "invalid-cursor") and "start the listing again" in problem["detail"]
        ids, _ = walk(replaced, [7])
        assert sorted(ids) == sorted(fleet)
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_position_written_by_a_reader_is_refused(server, fleet):
    """Without the service's key a reader cannot make a cursor: a fleet query's position, with
    the unkeyed fingerprint the filter and sort give, is refused (as are, above, cursors changed
    or given to another listing)."""
    _assert_bound_to_their_listing(server)
    text = "exists(state/site)"
    fingerprint = hashlib.sha256(f"{text}\nNone".encode()).hexdigest()[:16]
    position = {"f": fingerprint, "s": 0, "p": [["lst-020", "s2"]] * 16}
    forged = base64.urlsafe_b64encode(json.dumps(position, separators=(",", ":")).encode()).decode().rstrip("=")
    status, problem = get(server, "/devices", filter=text, limit=5, cursor=forged)
    assert (status, slug(problem)) == (400, "invalid-cursor"), problem


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
