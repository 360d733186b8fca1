"""16 writers PATCH one device through the real dev server while DynamoDB Local stalls
twice (SIGSTOP/SIGCONT): every answer is the truth. A 200's change is stored exactly
once, a 503's not at all, a 504 says outcome-unknown, and the version counts exactly
the changes stored."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from localdev.dynamodb_local import DynamoDBLocal
from tests.api.test_http import launch

pytestmark = [pytest.mark.dynamodb_local, pytest.mark.concurrency]

WRITERS, PATCHES = 16, 12
STALLS = ((1.0, 4.0), (1.0, 6.0))  # (seconds before, seconds stalled): longer than the 3 s read timeout
CLIENT_TIMEOUT_SECONDS = 120


@pytest.fixture(scope="module")
def stalling_server():
    """A dev server on a DynamoDB Local of its own (the module's tests stop it), each test on its own device."""
    engine = DynamoDBLocal().start()
    try:
        process, server = launch(DYNAMODB_ENDPOINT=engine.endpoint, TABLE_NAME=f"stall-{uuid.uuid4().hex[:8]}",
                                 WORKERS="8", STREAM_PROCESSOR="off")  # about write answers, not the feed
    except BaseException:
        engine.stop()
        raise
    yield process, server, engine
    engine.resume()
    process.terminate()
    process.wait(timeout=30)
    engine.stop()


def test_writes_through_two_dynamodb_stalls_are_answered_truthfully(stalling_server):
    process, server, engine = stalling_server
    assert server.request("POST", "/devices", {"deviceId": "s", "state": {"tokens": []}})[0] == 201
    answers: list[tuple[str, int | None, dict]] = []
    seconds: list[float] = []
    lock = threading.Lock()

    def writer(index):
        for number in range(PATCHES):
            token = f"{index}-{number}"
            started = time.monotonic()
            try:
                # A request may queue behind several that wait out a stall (each up to the read
                # timeout plus SETTLE_SECONDS): slow is allowed here, only untruthful is wrong.
                status, _, body = server.request(
                    "PATCH", "/devices/s", [{"op": "add", "path": "/tokens/-", "value": token}],
                    headers={"Content-Type": "application/json-patch+json"}, timeout=CLIENT_TIMEOUT_SECONDS)
                answer = (token, status, json.loads(body) if body else {})
            except OSError as error:  # kept, so the test says what happened instead of a thread dying
                answer = (token, None, {"error": repr(error)})
            with lock:
                answers.append(answer)
                seconds.append(time.monotonic() - started)

    def stall():
        for before, stalled in STALLS:
            time.sleep(before)
            engine.pause()
            time.sleep(stalled)
            engine.resume()

    threads = [threading.Thread(target=writer, args=(index,)) for index in range(WRITERS)]
    staller = threading.Thread(target=stall)
    for thread in [staller, *threads]:
        thread.start()
    for thread in [staller, *threads]:
        thread.join()
    assert process.poll() is None, f"the dev server stopped:\n{server.log[-6000:]}"

    failed = [answer for answer in answers if answer[1] is None]
    assert not failed, f"requests got no answer: {failed[:3]}\n{server.log[-6000:]}"
    status, headers, body = server.request("GET", "/devices/s")
    device = json.loads(body)
    stored = device["state"]["tokens"]
    assert len(stored) == len(set(stored)), "a change was applied twice"
    assert device["version"] == 1 + len(stored), "the version does not count the stored changes"
    statuses = {}
    for token, status, problem in answers:
        statuses[status] = statuses.get(status, 0) + 1
        if status == 200:
            assert stored.count(token) == 1
        elif status == 503:
            assert token not in stored, "503 said nothing was written, but it was"
        elif status == 504:
            assert problem["type"].endswith(":outcome-unknown")
        else:
            pytest.fail(f"unexpected {status}: {problem}")
    assert len(answers) == WRITERS * PATCHES
    assert statuses.get(200, 0) > 0
    print("statuses through the stalls:", statuses, f"slowest answer {max(seconds):.1f} s")


def test_ending_a_lease_through_a_dynamodb_stall_is_answered_truthfully(stalling_server):
    """Ending a lease by its fencing token (issue 27 row 4) is a write verb: sent while DynamoDB
    Local is stopped for longer than the read timeout, its answer is the truth once it resumes."""
    from tests.auth import bearer

    process, server, engine = stalling_server
    assert server.request("POST", "/devices", {"deviceId": "leased", "state": {}})[0] == 201
    status, _, body = server.request("POST", "/devices/leased/leases", {"ttlSeconds": 60},
                                     headers=bearer(device="leased"))
    assert status == 201, body
    token = json.loads(body)["fencingToken"]
    answer = {}

    def end():
        answer["status"], _, answer["body"] = server.request("DELETE", f"/devices/leased/leases/{token}",
                                                             timeout=CLIENT_TIMEOUT_SECONDS)

    engine.pause()
    ender = threading.Thread(target=end)
    ender.start()
    time.sleep(5.0)  # longer than the 3 s read timeout
    engine.resume()
    ender.join()
    assert process.poll() is None, f"the dev server stopped:\n{server.log[-6000:]}"
    holder = json.loads(server.request("GET", "/devices/leased/leases")[2])["holder"]
    if answer["status"] == 204:
        assert holder is None
    elif answer["status"] == 503:
        assert holder["fencingToken"] == token, "503 said nothing was ended, but it was"
    else:
        assert answer["status"] == 504 and json.loads(answer["body"])["type"].endswith(":outcome-unknown")
    server.request("DELETE", f"/devices/leased/leases/{token}")  # once DynamoDB answers, ending it is sure
    assert json.loads(server.request("GET", "/devices/leased/leases")[2])["holder"] is None
    print("ending a lease through a stall answered", answer["status"])

