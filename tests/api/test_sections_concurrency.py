"""16 reporters, each on its own member of reported, and 4 desired writers on one device,
through the real server on DynamoDB Local: every write is applied once, the version is 1 +
the acknowledged writes, and delta and metadata agree with the final sections. A naive
client (read reported, PUT it back whole) loses reports in the same harness."""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from functions.device_state.model.sections import delta
from tests.api.test_http import launch

pytestmark = [pytest.mark.dynamodb_local, pytest.mark.concurrency]
REPORTERS, DESIRERS, STEPS = 16, 4, 8
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture(scope="module")
def server(dynamodb_local):
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"sec-{uuid.uuid4().hex[:8]}",
                                WORKERS="8", STREAM_PROCESSOR="off")
    yield candidate
    process.terminate()
    process.wait(timeout=20)


def run(workers):
    barrier = threading.Barrier(len(workers))
    errors = []

    def start(work):
        barrier.wait()
        try:
            work()
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=start, args=(work,)) for work in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_reporters_and_desired_writers_on_one_device_lose_nothing(server):
    assert server.request("POST", "/devices", {"deviceId": "busy", "state": {}})[0] == 201
    statuses, last_versions, lock = [], {}, threading.Lock()

    def writer(section, member):
        def work():
            for step in range(STEPS):
                status, _, body = server.request("PATCH", f"/devices/busy/{section}", {member: step}, headers=MERGE)
                with lock:
                    statuses.append(status)
                    if status == 200:
                        last_versions[member] = json.loads(body)["version"]
        return work

    run([writer("reported", f"r{i}") for i in range(REPORTERS)] + [writer("desired", f"r{j}") for j in range(DESIRERS)])
    assert statuses == [200] * ((REPORTERS + DESIRERS) * STEPS)
    device = json.loads(server.request("GET", "/devices/busy?include=metadata")[2])
    assert device["version"] == 1 + len(statuses)
    assert device["reported"] == {f"r{i}": STEPS - 1 for i in range(REPORTERS)}
    assert device["desired"] == {f"r{j}": STEPS - 1 for j in range(DESIRERS)}
    assert device["delta"] == delta(device["desired"], device["reported"]) == {}
    for member, version in last_versions.items():
        section = "reported" if member not in device["desired"] else None
        if section:
            assert device["metadata"]["reported"][member]["version"] == version
    for j in range(DESIRERS):  # confirmed when the report came at or after the desire
        entry = device["metadata"]["desired"][f"r{j}"]
        reported_version = device["metadata"]["reported"][f"r{j}"]["version"]
        assert entry.get("confirmedVersion") == (reported_version if reported_version >= entry["version"] else None)


def test_control_naive_read_then_put_of_reported_loses_reports(server):
    assert server.request("POST", "/devices", {"deviceId": "naive", "state": {}})[0] == 201
    acknowledged = []

    def reporter(member):
        def work():
            for step in range(STEPS):
                reported = json.loads(server.request("GET", "/devices/naive")[2])["reported"]
                reported[member] = step
                if server.request("PUT", "/devices/naive/reported", {"reported": reported})[0] == 200:
                    acknowledged.append((member, step))
        return work

    run([reporter(f"r{i}") for i in range(REPORTERS)])
    final = json.loads(server.request("GET", "/devices/naive")[2])["reported"]
    last = {}
    for member, step in acknowledged:
        last[member] = max(step, last.get(member, -1))
    lost = {member for member, step in last.items() if final.get(member) != step}
    assert len(acknowledged) >= REPORTERS * STEPS * 0.9
    assert lost, "the naive control lost nothing: the harness could not have caught a loss"
