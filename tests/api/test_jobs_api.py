"""Jobs over the real server (make serve's: its stream processor and its job runner in their own
processes, on DynamoDB Local): a job created from a filter writes each matching device once, its
counts move live as devices confirm and refuse (a long-poll on its ETag wakes), they agree with its
executions, a device lists its jobs, cancel ends it; bad requests are 4xx problems that change
nothing; an Idempotency-Key replays the job; a device token and a read-only back-end may not
create one."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.api.test_http import launch
from tests.auth import bearer

pytestmark = pytest.mark.dynamodb_local

DEVICES = 12


@pytest.fixture(scope="module")
def server(dynamodb_local):
    process, server = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"jobs-{uuid.uuid4().hex[:8]}",
                             FLEET_INDEX="reported/battery:number", WORKERS="3")
    for number in range(DEVICES):  # lamp-0..5 low on battery, lamp-6..11 not
        status, _, body = server.request("POST", "/devices", {
            "deviceId": f"lamp-{number}", "state": {}, "reported": {"battery": 10 if number < 6 else 90}})
        assert status == 201, body
    yield server
    process.terminate()
    process.wait(timeout=20)


def call(server, method, path, body=None, headers=None):
    status, response_headers, payload = server.request(method, path, body, headers)
    return status, response_headers, json.loads(payload) if payload else None


def wait_for(server, job_id, predicate, seconds=30):
    """The job once ``predicate(job)`` holds, following its ETag with waiting reads."""
    deadline, tag = time.monotonic() + seconds, None
    while time.monotonic() < deadline:
        headers = {"If-None-Match": tag} if tag else {}
        status, response_headers, job = call(server, "GET", f"/jobs/{job_id}?waitSeconds=5", headers=headers)
        assert status in (200, 304)
        if status == 200:
            tag = response_headers["etag"]
            if predicate(job):
                return job
    raise AssertionError(f"job {job_id} never reached the state wanted")


def test_if_none_match_names_the_job_among_other_tags_or_by_star(server):
    """Any tag of the list that is the job's ETag answers 304 (RFC 9110), as does *, not only
    the first of the list."""
    status, _, _ = call(server, "POST", "/jobs", {"jobId": "tags-1", "deviceIds": ["lamp-9"], "desired": {"t": 1}})
    assert status == 201
    job = wait_for(server, "tags-1", lambda job: job["counts"]["IN_PROGRESS"] == 1)
    tag = call(server, "GET", "/jobs/tags-1")[1]["etag"]
    for named in (tag, f'"other", {tag}', f'W/{tag}', "*"):
        status, headers, _ = call(server, "GET", "/jobs/tags-1", headers={"If-None-Match": named})
        assert (status, headers["etag"]) == (304, tag), named
    began = time.monotonic()
    status, _, _ = call(server, "GET", "/jobs/tags-1?waitSeconds=20", headers={"If-None-Match": "*"})
    assert status == 304 and time.monotonic() - began < 10  # * matches whatever the job becomes: no wait
    status, _, shown = call(server, "GET", "/jobs/tags-1", headers={"If-None-Match": '"other", "another"'})
    assert status == 200 and shown == job


def test_a_job_from_a_filter_writes_each_match_once_and_its_counts_follow_the_devices(server):
    status, headers, job = call(server, "POST", "/jobs", {"jobId": "eco-1", "filter": "lt(reported/battery,20)",
                                                          "desired": {"mode": "eco"}})
    assert status == 201 and headers["location"] == "/jobs/eco-1" and job["status"] == "IN_PROGRESS"
    job = wait_for(server, "eco-1", lambda job: job["counts"]["IN_PROGRESS"] == 6 and not job.get("targeting"))
    assert job["total"] == 6 and job["counts"]["QUEUED"] == 0
    for number in range(6):
        device = call(server, "GET", f"/devices/lamp-{number}")[2]
        assert device["desired"] == {"mode": "eco"} and device["version"] == 2  # once
    assert call(server, "GET", "/devices/lamp-7")[2]["desired"] == {}  # not matched, not written
    device = bearer(device="lamp-0")
    status, _, _ = call(server, "PATCH", "/devices/lamp-0/reported", {"mode": "eco"},
                        {**device, "Content-Type": "application/merge-patch+json"})
    assert status == 200
    status, _, _ = call(server, "POST", "/devices/lamp-1/desired/acks",
                        {"acks": [{"path": "/mode", "version": 2, "code": 409, "reason": "busy"}]},
                        bearer(device="lamp-1"))
    assert status == 200
    job = wait_for(server, "eco-1", lambda job: job["counts"]["SUCCEEDED"] == 1 and job["counts"]["FAILED"] == 1)
    status, _, page = call(server, "GET", "/jobs/eco-1/executions?limit=4")
    items, cursor = page["items"], page["nextCursor"]
    while cursor:
        page = call(server, "GET", f"/jobs/eco-1/executions?limit=4&cursor={cursor}")[2]
        items, cursor = items + page["items"], page["nextCursor"]
    states = {item["deviceId"]: item for item in items}
    assert len(items) == 6 and states["lamp-0"]["state"] == "SUCCEEDED" and states["lamp-1"]["state"] == "FAILED"
    assert states["lamp-1"]["code"] == 409 and states["lamp-1"]["reason"] == "busy"
    assert {state: sum(item["state"] == state for item in items) for state in job["counts"]} == job["counts"]
    failed = call(server, "GET", "/jobs/eco-1/executions?state=FAILED")[2]["items"]
    assert [item["deviceId"] for item in failed] == ["lamp-1"]
    status, _, mine = call(server, "GET", "/devices/lamp-2/jobs", headers=bearer(device="lamp-2"))
    assert status == 200 and [entry["jobId"] for entry in mine["items"]] == ["eco-1"]
    assert mine["items"][0]["execution"]["state"] == "IN_PROGRESS"
    status, _, canceled = call(server, "POST", "/jobs/eco-1/cancel")
    assert status == 200 and canceled["status"] == "CANCELED"
    status, _, problem = call(server, "POST", "/jobs/eco-1/cancel")
    assert status == 409 and problem["type"].endswith("job-ended")
    listed = call(server, "GET", "/jobs?status=CANCELED")[2]["items"]
    assert "eco-1" in [entry["jobId"] for entry in listed]
    wait_for(server, "eco-1", lambda job: job.get("completedAt") is None or job["status"] == "CANCELED")


def test_an_idempotency_key_replays_the_job_and_refuses_another_body(server):
    body, key = {"deviceIds": ["lamp-8", "ghost"], "desired": {"level": 3}}, {"Idempotency-Key": "job-key-1"}
    status, headers, first = call(server, "POST", "/jobs", body, key)
    assert status == 201
    status, headers, again = call(server, "POST", "/jobs", body, key)
    assert status == 201 and headers["idempotent-replayed"] == "true" and again["jobId"] == first["jobId"]
    status, _, problem = call(server, "POST", "/jobs", {**body, "desired": {"level": 4}}, key)
    assert status == 422 and problem["type"].endswith("idempotency-key-reused")
    job = wait_for(server, first["jobId"], lambda job: job["counts"]["REMOVED"] == 1 and job["counts"]["IN_PROGRESS"])
    assert job["total"] == 2  # the missing device is REMOVED at once, the other written


@pytest.mark.parametrize("body, status, slug", [
    ({"filter": "lt(state/undeclared,3)", "desired": {"a": 1}}, 400, "unindexed-filter"),
    ({"filter": "lt(reported/battery,", "desired": {"a": 1}}, 400, "invalid-filter"),
    ({"deviceIds": ["lamp-1"], "filter": "exists(reported/battery)", "desired": {"a": 1}}, 400, "bad-request"),
    ({"deviceIds": ["lamp-1"], "desired": {"a": None}}, 400, "invalid-job"),
    ({"deviceIds": ["lamp-1"], "desired": {}}, 400, "invalid-job"),
    ({"deviceIds": ["lamp-1"]}, 400, "bad-request"),
    ({"deviceIds": ["lamp-1", "count"], "desired": {"a": 1}}, 400, "invalid-device-id"),  # /devices/count's
    ({"deviceIds": ["lamp-1"], "desired": {"a": 1}, "targets": "continuous"}, 400, "bad-request"),
    ({"deviceIds": ["lamp-1"], "desired": {"a": 1}, "endsAt": "yesterday"}, 400, "bad-request"),
    ({"deviceIds": ["lamp-1"], "desired": {"a": 1}, "endsAt": "2020-01-01T00:00:00Z"}, 400, "invalid-job"),
    ({"deviceIds": ["lamp-1"], "desired": {"a": 1}, "abort": [{"on": "FAILED", "thresholdPercent": 0,
                                                               "minExecuted": 1}]}, 400, "bad-request"),
])
def test_a_job_that_cannot_be_run_is_a_problem_and_creates_nothing(server, body, status, slug):
    answer, _, problem = call(server, "POST", "/jobs", {"jobId": "never", **body})
    assert answer == status and problem["type"].endswith(slug), problem
    assert call(server, "GET", "/jobs/never")[0] == 404


def test_callers_without_the_right_create_and_cancel_nothing(server):
    body = {"jobId": "not-yours", "deviceIds": ["lamp-9"], "desired": {"a": 1}}
    assert call(server, "POST", "/jobs", body, bearer(device="lamp-9"))[0] == 403
    assert call(server, "POST", "/jobs", body, bearer(scopes=["devices.read"]))[0] == 403
    assert call(server, "GET", "/jobs/not-yours", headers=bearer(device="lamp-9"))[0] == 403
    assert call(server, "GET", "/devices/lamp-8/jobs", headers=bearer(device="lamp-9"))[0] == 403
    assert call(server, "GET", "/jobs/not-yours")[0] == 404


def test_a_devices_jobs_are_paged_by_limit_and_a_signed_cursor(server):
    job_ids = ["mine-a", "mine-b", "mine-c"]
    for job_id in job_ids:
        status, _, job = call(server, "POST", "/jobs", {"jobId": job_id, "deviceIds": ["lamp-11"],
                                                        "desired": {job_id.replace("-", "_"): 1}})
        assert status == 201, job
    for job_id in job_ids:
        wait_for(server, job_id, lambda job: job["counts"]["IN_PROGRESS"] == 1)
    device = bearer(device="lamp-11")  # the device reads its own
    for limit in (1, 2):
        walked, pages, cursor = [], 0, None
        while True:
            query = f"?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
            status, _, page = call(server, "GET", f"/devices/lamp-11/jobs{query}", headers=device)
            assert status == 200 and 0 < len(page["items"]) <= limit, page
            walked += [entry["jobId"] for entry in page["items"]]
            pages, cursor = pages + 1, page["nextCursor"]
            if cursor is None:
                break
        assert walked == job_ids and pages == -(-len(job_ids) // limit)
    status, _, first = call(server, "GET", "/devices/lamp-11/jobs?limit=1", headers=device)
    assert first["items"][0]["execution"] == {**first["items"][0]["execution"], "deviceId": "lamp-11",
                                              "state": "IN_PROGRESS"}
    status, _, listed = call(server, "GET", "/jobs/mine-a/executions")
    import datetime

    def moment(text):
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

    # when the write was made, as the job lists it (the mark's time and the runner's record, ms apart)
    assert abs(moment(first["items"][0]["execution"]["updatedAt"]) - moment(listed["items"][0]["updatedAt"])) < 5
    status, _, problem = call(server, "GET", "/devices/no-such-lamp/jobs")
    assert status == 404 and problem["type"].endswith("device-not-found")  # as the device's other routes
    cursor = first["nextCursor"]
    tampered = cursor[:-1] + ("A" if cursor[-1] != "A" else "B")
    malformed = ("abc", "", cursor[:-3])  # of no form the service issues: the same problem type, not bad-request
    listings = ("/jobs", "/jobs/mine-a/executions", "/devices/lamp-11/jobs")
    for path in (f"/devices/lamp-11/jobs?cursor={tampered}", f"/devices/lamp-10/jobs?cursor={cursor}",
                 f"/jobs?cursor={cursor}", *(f"{listing}?cursor={text}" for text in malformed for listing in listings)):
        status, _, problem = call(server, "GET", path)
        assert status == 400 and problem["type"].endswith("invalid-cursor"), (path, problem)
    status, _, whole = call(server, "GET", "/devices/lamp-11/jobs")
    assert [entry["jobId"] for entry in whole["items"]] == job_ids and whole["nextCursor"] is None
