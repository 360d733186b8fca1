"""A job's cancel whose answer never reaches its caller, over the real server (make serve's, its job
runner too) talking to DynamoDB Local through localdev/faults.py's forwarder: the cancel's
transaction lands and every answer after it is lost (alone, or with another caller's forced cancel
in between), or DynamoDB Local stalls (SIGSTOP) until the server gives up on its resends and answers 504.
Sent again under its Idempotency-Key, the cancel answers what it did: 200 with the job, CANCELED,
``Idempotent-Replayed: true``; the same key on another request is 422. The naive control, the same
cancel sent again without a key, is told 409 job-ended for the cancel it made itself."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from functions.device_state import DeviceStateManager
from tests.api.test_http import launch
from tests.helpers import Stall

pytestmark = pytest.mark.dynamodb_local


@pytest.fixture(scope="module")
def table_name():
    return f"jobs-faults-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def server(forwarder, table_name):
    process, server = launch(DYNAMODB_ENDPOINT=forwarder.endpoint, TABLE_NAME=table_name)  # its job runner too
    yield server
    process.terminate()
    process.wait(timeout=20)


@pytest.fixture
def other(dynamodb_local, table_name, server):
    """Another client of the same table, straight to DynamoDB Local."""
    from functions.device_state.client import dynamodb_client

    return DeviceStateManager(dynamodb_client(dynamodb_local.endpoint), table_name)


def call(server, method, path, body=None, headers=None, timeout=60):
    status, response_headers, payload = server.request(method, path, body, headers, timeout=timeout)
    return status, response_headers, json.loads(payload) if payload else None


def written_job(server, other) -> str:
    """A job whose one device is written (IN_PROGRESS): nothing of it is in flight."""
    device, job_id = f"lamp-{uuid.uuid4().hex[:8]}", f"job-{uuid.uuid4().hex[:8]}"
    assert call(server, "POST", "/devices", {"deviceId": device, "state": {}})[0] == 201
    assert call(server, "POST", "/jobs", {"jobId": job_id, "deviceIds": [device], "desired": {"mode": "eco"}})[0] == 201
    deadline = time.monotonic() + 30
    while other.jobs().head(job_id).counts_by_state["IN_PROGRESS"] != 1:
        assert time.monotonic() < deadline, "the job's device was never written"
        time.sleep(0.2)
    return job_id


def lose_the_cancels_answers(forwarder, then=lambda: None):
    """The cancel's transaction (its stop reason, "cancel") lands; then DynamoDB answers nothing more."""
    def cut():
        then()
        forwarder.unreachable = True

    forwarder.unreachable = False
    forwarder.lose("TransactWriteItems", when=lambda body: b'"cancel"' in body, then=cut)


def first_cancel_lost(server, forwarder, other, job_id, headers, then=lambda: None) -> None:
    before = len(forwarder.lost)
    lose_the_cancels_answers(forwarder, then)
    try:
        status, _, problem = call(server, "POST", f"/jobs/{job_id}/cancel", headers=headers)
    finally:
        forwarder.unreachable = False
    assert status == 504 and problem["type"].endswith("outcome-unknown"), (status, problem)
    assert "TransactWriteItems" in forwarder.lost[before:]
    assert other.jobs().head(job_id).record.status == "CANCELED"  # it did apply


@pytest.mark.parametrize("between", ["alone", "another cancel between"])
def test_a_cancel_whose_answer_is_lost_answers_the_job_again_under_its_key(server, forwarder, other, between):
    job_id = written_job(server, other)
    then = (lambda: other.jobs().cancel(job_id, force=True)) if between != "alone" else (lambda: None)
    key = {"Idempotency-Key": f"cancel-{uuid.uuid4().hex}"}
    first_cancel_lost(server, forwarder, other, job_id, key, then)
    status, headers, job = call(server, "POST", f"/jobs/{job_id}/cancel", headers=key)
    assert status == 200, job
    assert headers["idempotent-replayed"] == "true" and job["jobId"] == job_id and job["status"] == "CANCELED"
    assert headers["etag"]
    status, _, problem = call(server, "POST", f"/jobs/{job_id}/cancel?force=true", headers=key)
    assert status == 422 and problem["type"].endswith("idempotency-key-reused")


def test_naive_control_a_cancel_sent_again_without_a_key_is_told_job_ended(server, forwarder, other):
    job_id = written_job(server, other)
    first_cancel_lost(server, forwarder, other, job_id, {})
    status, _, problem = call(server, "POST", f"/jobs/{job_id}/cancel")
    assert status == 409 and problem["type"].endswith("job-ended")  # its own cancel, reported as someone else's


def test_a_cancel_through_a_dynamodb_stall_is_answered_again_under_its_key(server, forwarder, other, dynamodb_local):
    """Two cancels wait out one stall side by side: one keyed, and its control sent without a key."""
    keys = [f"stall-{uuid.uuid4().hex}", None]
    jobs = [written_job(server, other) for _ in keys]
    answers = [[] for _ in keys]
    # DynamoDB Local stops once both cancels' transactions reach it, and stays stopped until the
    # callers are answered: past the server's sends (3, each up to its 3 s read timeout).
    stall = Stall(forwarder, dynamodb_local, "TransactWriteItems",
                  *(lambda body, job_id=job_id: b'"cancel"' in body and job_id.encode() in body
                    for job_id in jobs))

    def cancel(job_id: str, key: str | None, answered: list) -> None:
        answered.append(call(server, "POST", f"/jobs/{job_id}/cancel",
                             headers={"Idempotency-Key": key} if key else {}, timeout=120))
    senders = [threading.Thread(target=cancel, args=sent) for sent in zip(jobs, keys, answers)]
    for sender in senders:
        sender.start()
    try:
        assert stall.held(), "the cancels' transactions never came"
        for sender in senders:
            sender.join(120)
            assert not sender.is_alive(), "no answer while DynamoDB was stopped"
    finally:
        stall.disarm()
        dynamodb_local.resume()
    for job_id, key, [(status, _, problem)] in zip(jobs, keys, answers):
        assert status == 504 and problem["type"].endswith(":outcome-unknown"), (problem, server.log[-3000:])
        deadline = time.monotonic() + 30
        while other.jobs().head(job_id).record.status != "CANCELED":  # what waited in DynamoDB's queue applied
            assert time.monotonic() < deadline
            time.sleep(0.2)
        status, response_headers, answer = call(server, "POST", f"/jobs/{job_id}/cancel",
                                                headers={"Idempotency-Key": key} if key else {})
        if key:
            assert (status, response_headers["idempotent-replayed"], answer["status"]) == (200, "true", "CANCELED")
        else:  # the control
            assert status == 409 and answer["type"].endswith("job-ended")
