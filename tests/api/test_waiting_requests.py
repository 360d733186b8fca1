"""Waiting requests on the real dev server never block the others: long-polls take at most
their share of the workers (503 + Retry-After beyond it), and one whose client hung up
gives its worker back at once."""

from __future__ import annotations

import json
import select
import socket
import time
import uuid

import pytest

from tests.api.test_http import launch
from tests.auth import token

pytestmark = pytest.mark.dynamodb_local

WAIT = 8  # seconds each long-poll would wait: far longer than a write may take


@pytest.fixture(scope="module")
def server(dynamodb_local):
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"wait-{uuid.uuid4().hex[:8]}",
                                WORKERS="4", STREAM_PROCESSOR="off")  # nothing reaches the feed: polls wait
    assert candidate.request("POST", "/devices", {"deviceId": "w", "state": {"n": 0}})[0] == 201
    yield candidate
    process.terminate()
    process.wait(timeout=30)


def timed_patch(server) -> tuple[int, float]:
    started = time.monotonic()
    status = server.request("PATCH", "/devices/w", {"n": time.time()},
                            headers={"Content-Type": "application/merge-patch+json"})[0]
    return status, time.monotonic() - started


def start_poll(server, path: str) -> socket.socket:
    """A long-poll sent on a connection of its own, left open for the test to read or drop."""
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    connection.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token()}\r\n"
                       f"Content-Length: 0\r\n\r\n".encode())
    return connection


def answer_of(connection: socket.socket) -> tuple[int, str | None]:
    """(status, Retry-After) of a connection's whole answer (the server closes after one)."""
    response = b""
    while chunk := connection.recv(65536):
        response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    status = int(lines[0].split()[1])
    if status == 503:  # the server's own refusal is a problem of the service's namespace, like the handler's
        assert json.loads(body)["type"] == "urn:device-state:problem:too-many-waiting", body
        assert headers["content-type"] == "application/problem+json"
    return status, headers.get("retry-after")


@pytest.mark.parametrize("poll", ["changes", "delta"])
def test_writes_are_answered_promptly_while_long_polls_fill_their_share(server, poll):
    current = int(server.request("GET", "/devices/w")[1]["etag"].strip('"'))
    polls = [start_poll(server, f"/devices/w/{poll}?since={current}&waitSeconds={WAIT}") for _ in range(6)]
    try:
        time.sleep(1.0)  # every poll is in: the share waits, the rest were refused
        answered = [connection for connection in polls if select.select([connection], [], [], 0)[0]]
        refused = [answer_of(connection) for connection in answered]
        status, seconds = timed_patch(server)
        assert status == 200 and seconds < 3, seconds
        assert refused == [(503, "1")] * 4, refused  # 4 workers: 2 may wait, 4 more polls told to come back
        waiting = [connection for connection in polls if connection not in answered]
        assert not select.select(waiting, [], [], 0)[0], "a poll of the share stopped waiting before the write"
    finally:
        for connection in polls:  # the two still waiting hang up: their workers are freed at once
            connection.close()
    time.sleep(0.5)


def test_long_polls_whose_clients_hung_up_release_their_workers_at_once(server):
    current = int(server.request("GET", "/devices/w")[1]["etag"].strip('"'))
    request = (f"GET /devices/w/changes?since={current}&waitSeconds={WAIT} HTTP/1.1\r\n"
               f"Host: 127.0.0.1\r\nAuthorization: Bearer {token()}\r\nContent-Length: 0\r\n\r\n").encode()
    for _ in range(4):
        with socket.create_connection(("127.0.0.1", server.port)) as client:
            client.sendall(request)
            time.sleep(0.3)  # the server has it and waits on it; then the client goes
    time.sleep(0.5)
    for _ in range(3):
        status, seconds = timed_patch(server)
        assert status == 200 and seconds < 3, seconds
    started = time.monotonic()
    status = server.request("GET", f"/devices/w/changes?since={current + 3}&waitSeconds=1")[0]
    assert status == 200 and time.monotonic() - started < 3  # a waiting slot is free again


@pytest.fixture(scope="module")
def never_waiting(dynamodb_local):
    """A server as the deployed API function is configured: its routes are not the waiting
    ones (the gateway sends those to the waiting function), so it never waits."""
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"nowait-{uuid.uuid4().hex[:8]}",
                                WORKERS="2", STREAM_PROCESSOR="off", NEVER_WAIT="true")
    assert candidate.request("POST", "/devices", {"deviceId": "w", "state": {"n": 0}})[0] == 201
    yield candidate
    process.terminate()
    process.wait(timeout=30)


def test_a_function_that_serves_no_waiting_route_answers_a_wait_at_once(server, never_waiting):
    """A long-poll or a queued lease request the gateway did not route to the waiting function
    (a path spelled another way) must not hold the API function's executions."""
    current = int(never_waiting.request("GET", "/devices/w")[1]["etag"].strip('"'))
    assert never_waiting.request("POST", "/devices/w/leases", {"ttlSeconds": 30})[0] == 201  # held
    for method, target, body in (("GET", f"/devices/w/changes?since={current}&waitSeconds={WAIT}", None),
                                 ("GET", f"/devices/w/delta?since={current}&waitSeconds={WAIT}", None),
                                 ("POST", "/devices/w/leases", {"ttlSeconds": 30, "waitSeconds": WAIT})):
        started = time.monotonic()
        status = never_waiting.request(method, target, body)[0]
        assert time.monotonic() - started < WAIT / 2, (target, status)
        assert status in (200, 304, 409), (target, status)  # as when the wait ran out
    # the control: the same long-poll where waiting is allowed waits
    current = int(server.request("GET", "/devices/w")[1]["etag"].strip('"'))
    started = time.monotonic()
    server.request("GET", f"/devices/w/delta?since={current}&waitSeconds=2")
    assert time.monotonic() - started >= 1.5
