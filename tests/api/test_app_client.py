"""The app client (clients/python, ``AppClient``) against the real dev server (HTTP, WebSocket,
stream processor and fan-out, on DynamoDB Local): a relative write whose answer is lost applies
once when the client sends it again under its key, beside a naive client without a key whose
resend applies it twice; many devices followed on one WebSocket whose connection is cut
mid-stream hand out each device's versions once and in order, beside a naive loop that loses
some; one device past the feed's retention resyncs alone; a refused subscription ends the
follow naming its device; a lease heartbeats past its ttl and says when it was ended; the
problem types of real refusals; the package README's app example as written. Jobs: a job whose
answer is lost is created once under its key (twice by a naive resend without one), followed by
long-polls on its ETag to its end, its executions read, a cancel whose answer is lost answers
the canceled job when sent again under its key (a naive resend is told job-ended), and their
refusals as their problem types."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
import uuid

import pytest
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect

from functions.device_state import table
from functions.device_state.feed.items import change_sk
from functions.device_state.client import dynamodb_client
from tests.api.test_device_client import (FAST_BACKOFF, FOLLOW_SECONDS, AnswerDroppingProxy, CuttableProxy,
                                          package_readme_block, server)  # noqa: F401 - the module's server
from tests.auth import bearer, token
from tests.make_serve import REPO_ROOT
from tests.test_readme_examples import expected_prints

sys.path.insert(0, str(REPO_ROOT / "clients" / "python"))
from device_state_client import (AppClient, Backoff, Change, DeviceExists, FollowError, InvalidJob,  # noqa: E402
                                 JobEnded, JobExists, JobNotFound, Locked, NotFound, PreconditionFailed, Resynced,
                                 TokenCredentials, TransactionFailed)

pytestmark = pytest.mark.dynamodb_local
INCREMENT = [{"op": "increment", "path": "/n", "value": 1}]


def _client(port: int, websocket_port: int | None = None, **options) -> AppClient:
    return AppClient(f"http://127.0.0.1:{port}", TokenCredentials(lambda: token()),
                     websocket_url=f"ws://127.0.0.1:{websocket_port or port}/ws", **options)


def _device(server) -> str:
    device = f"app-{uuid.uuid4().hex[:8]}"
    status, _, body = server.request("POST", "/devices", {"deviceId": device, "state": {"n": 0}, "desired": {"n": 0}})
    assert status == 201, body
    return device


def _read(server, device) -> dict:
    return json.loads(server.request("GET", f"/devices/{device}")[2])


# A relative change of each kind: (the client's call, the same request as a naive client sends it, where it lands).
RELATIVE_WRITES = {
    "patch": (lambda client, device: client.patch(device, INCREMENT),
              lambda device: ("PATCH", f"/devices/{device}", INCREMENT, "application/json-patch+json"), "state"),
    "desire": (lambda client, device: client.desire(device, INCREMENT),
               lambda device: ("PATCH", f"/devices/{device}/desired", INCREMENT, "application/json-patch+json"),
               "desired"),
    "transaction": (lambda client, device: client.transaction([{"deviceId": device, "jsonPatch": INCREMENT}]),
                    lambda device: ("POST", "/transactions", {"operations": [{"deviceId": device, "jsonPatch": INCREMENT}]},
                                    "application/json"), "state"),
}


def _naive_send(port: int, method: str, path: str, body, content_type: str) -> int:
    """What the docs' standard-library snippet does with a retry loop around it: the same
    request again when no answer came, with no Idempotency-Key."""
    for _ in range(2):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request(method, path, body=None if body is None else json.dumps(body),
                               headers={**bearer(), **({} if body is None else {"Content-Type": content_type})})
            return connection.getresponse().status
        except (http.client.HTTPException, OSError):
            continue
        finally:
            connection.close()
    raise AssertionError("no answer twice")


@pytest.mark.parametrize("kind", sorted(RELATIVE_WRITES))
@pytest.mark.parametrize("with_key, applied", [(True, 1), (False, 2)])
def test_a_relative_write_whose_answer_is_lost_applies_once_resent_under_its_key_and_twice_without(
        server, kind, with_key, applied):
    """The answer of the write's first copy is lost after it landed (the relay closes the
    connection instead of answering). The app client sends it again under the same key and
    gets the first answer; the naive client sends it again without one and the service,
    rightly, applies the second copy too."""
    device = _device(server)
    call, naive, section = RELATIVE_WRITES[kind]
    proxy = AnswerDroppingProxy(server.port, drops=1)
    try:
        if with_key:
            answer = call(_client(proxy.port, sleep=lambda seconds: None), device)
            written = answer["devices"][0] if kind == "transaction" else answer
            assert written[section]["n"] == 1 and written["version"] == 2
        else:
            assert _naive_send(proxy.port, *naive(device)) == 200
        assert len(proxy.keys) == 2 and (proxy.keys[0] == proxy.keys[1] is not None) == with_key
    finally:
        proxy.close()
    seen = _read(server, device)
    assert (seen[section]["n"], seen["version"]) == (applied, 1 + applied)


class Followed:
    """Runs a follower in a thread, keeping its events, until every device reached ``until``."""

    def __init__(self, follower, until: int):
        self.follower, self.until, self.events, self.error = follower, until, [], None
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        try:
            for event in self.follower:
                self.events.append(event)
                if all(position >= self.until for position in self.follower.positions.values()):
                    break
        except Exception as error:  # noqa: BLE001 - shown by the test
            self.error = error
        finally:
            self.done.set()

    def wait(self, seconds: float = FOLLOW_SECONDS) -> list:
        assert self.done.wait(seconds), (f"not done in {seconds} s: {self.follower.positions}",
                                         [(event.device_id, event.version) for event in self.events])
        assert self.error is None, self.error
        return self.events

    def versions(self, device: str) -> list[int]:
        return [event.version for event in self.events if event.device_id == device]


def _naive_follow_many(server, devices: list[str], websocket_port: int, until: int, seconds: float) -> dict:
    """The loop an app author writes from a first reading of the docs: on every (re)connect,
    subscribe each device from the version it is at, and keep every change that comes. It
    ends once it has seen, or read, every device at ``until``."""
    seen, reached = {device: [] for device in devices}, dict.fromkeys(devices, 0)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and min(reached.values()) < until:
        try:
            at = {device: _read(server, device)["version"] for device in devices}
            reached = {device: max(reached[device], at[device]) for device in devices}
            with connect(f"ws://127.0.0.1:{websocket_port}/ws", additional_headers=bearer(), open_timeout=5) as socket:
                for device in devices:
                    socket.send(json.dumps({"action": "subscribe", "deviceId": device, "since": at[device]}))
                while time.monotonic() < deadline and min(reached.values()) < until:
                    message = json.loads(socket.recv(timeout=max(deadline - time.monotonic(), 0.01)))
                    if message["type"] == "change":
                        seen[message["deviceId"]].append(message["version"])
                        reached[message["deviceId"]] = max(reached[message["deviceId"]], message["version"])
        except (ConnectionClosed, InvalidHandshake, OSError, TimeoutError):
            time.sleep(0.2)
    return seen


def test_many_devices_on_one_connection_cut_mid_stream_lose_and_repeat_nothing_while_the_naive_loop_loses(server):
    devices, rounds = [_device(server) for _ in range(3)], 20
    proxy, naive_proxy = CuttableProxy(server.port), CuttableProxy(server.port)  # the same cuts, counted apart
    follower = _client(server.port, proxy.port).follow(devices, since=1, backoff=Backoff(**FAST_BACKOFF))
    followed = Followed(follower, until=1 + rounds)
    naive = {}
    naive_thread = threading.Thread(target=lambda: naive.update(_naive_follow_many(
        server, devices, naive_proxy.port, 1 + rounds, FOLLOW_SECONDS)), daemon=True)
    naive_thread.start()
    time.sleep(1)  # both subscribed
    writer = _client(server.port)
    for number in range(1, rounds + 1):
        for device in devices:
            writer.desire(device, {"n": number})
        time.sleep(0.05)
        for each in (proxy, naive_proxy):
            if number % 6 == 0:
                each.cut()  # mid-stream, changes of every device in flight
            if number == 10:  # a window in which nobody can connect, writes going on
                each.stop()
            if number == 13:
                each.start()
    followed.wait()
    naive_thread.join(FOLLOW_SECONDS)
    for device in devices:
        assert followed.versions(device) == list(range(2, 2 + rounds)), device
        assert [event.delta for event in followed.events if event.device_id == device] == [
            {"n": number} for number in range(1, 1 + rounds)]  # the delta as of each version
    assert all(isinstance(event, Change) and event.sections == ("desired",) for event in followed.events)
    assert follower.positions == dict.fromkeys(devices, 1 + rounds)
    refused = sum(reason.startswith("ConnectionRefusedError") for reason in follower.reconnects)  # the stopped relay
    assert proxy.connections == len(follower.reconnects) - refused + 1  # one connection at a time for all three
    assert len(follower.reconnects) >= proxy.cuts, follower.reconnects
    lost = {device: set(range(2, 2 + rounds)) - set(naive.get(device, [])) for device in devices}
    assert any(lost.values()), f"the naive loop lost nothing: {naive}"


def test_one_device_past_the_feeds_retention_resyncs_alone_while_the_others_go_on(server, dynamodb_local):
    expired, fresh = _device(server), _device(server)
    client = _client(server.port)
    client.desire(expired, {"n": 1})
    deadline = time.monotonic() + 30
    while [change["version"] for change in client.changes(expired, since=0)] != [1, 2]:
        assert time.monotonic() < deadline, "version 2 never reached the feed"
        time.sleep(0.2)
    dynamodb_client(dynamodb_local.endpoint).delete_item(  # version 1's change passes the retention, as TTL would
        TableName=server.table, Key={table.PARTITION_KEY: {"S": expired}, table.SORT_KEY: {"S": change_sk(1)}})
    followed = Followed(client.follow([expired, fresh], since=0, backoff=Backoff(**FAST_BACKOFF)), until=3)
    time.sleep(1)
    for device in (expired, fresh):
        client.desire(device, {"n": 9})
    client.desire(fresh, {"n": 10})
    events = followed.wait()
    resynced = [event for event in events if isinstance(event, Resynced)]
    assert [(event.device_id, event.version) for event in resynced] == [(expired, 2)]
    assert resynced[0].device["desired"] == {"n": 1}
    assert followed.versions(expired) == [2, 3] and followed.versions(fresh) == [1, 2, 3]


def test_a_refused_subscription_ends_the_follow_naming_its_device(server):
    mine, other = _device(server), _device(server)
    as_device = AppClient(f"http://127.0.0.1:{server.port}", TokenCredentials(lambda: token(device=mine)))
    follower = as_device.follow([mine, other], since=0, backoff=Backoff(**FAST_BACKOFF))
    with pytest.raises(FollowError, match=f"{other}: 403 forbidden"):
        for _ in follower:
            pass
    assert follower.reconnects == []


def test_a_held_lease_outlives_its_ttl_by_heartbeats_and_hears_when_it_is_ended(server):
    device, client = _device(server), _client(server.port)
    lost = threading.Event()
    # A ttl of 4 s leaves each heartbeat (every 2 s, after the last one's answer) 2 s to land: at
    # 2 s, one late by a second under make test's load let the lease lapse.
    with client.lease(device, ttl_seconds=4, owner="test", on_lost=lambda error: lost.set()) as lease:
        time.sleep(5)  # past the ttl: heartbeats at about 2 s and 4 s kept it
        assert client.patch(device, {"leased": True}, lease_token=lease.token)["version"] == 2
        with pytest.raises(Locked):
            client.patch(device, {"leased": False})
        assert client.lease_status(device)["holder"]["owner"] == "test"
        client.end_lease(device, lease.fencing_token)  # a back-end ends it
        assert lost.wait(5) and lease.lost.slug == "lease-gone"
    assert client.patch(device, {"leased": False})["version"] == 3  # nobody holds it


def test_real_refusals_come_as_their_problem_types_with_their_members(server):
    device, client = _device(server), _client(server.port)
    with pytest.raises(DeviceExists) as exists:
        client.create(device)
    assert exists.value.current_version == 1 and exists.value.device_id == device
    with pytest.raises(PreconditionFailed) as moved:
        client.patch(device, {"n": 5}, if_match=7)
    assert (moved.value.slug, moved.value.current_version) == ("version-conflict", 1)
    with pytest.raises(NotFound):
        client.history(device, 99)
    with pytest.raises(TransactionFailed) as failed:
        client.transaction([{"deviceId": device, "check": True, "ifMatch": '"3"'},
                            {"deviceId": f"{device}-none", "mergePatch": {"n": 1}}])
    assert [(operation["index"], operation["status"]) for operation in failed.value.operations] == [(0, 412), (1, 404)]
    assert _read(server, device)["version"] == 1


def test_the_package_readmes_app_example_runs_as_written(server, tmp_path):
    code = package_readme_block("app")
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT / "clients" / "python"),
                   "URL": f"http://127.0.0.1:{server.port}/", "TOKEN": token()}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environment, capture_output=True,
                            text=True, timeout=FOLLOW_SECONDS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected_prints(code)
    assert _read(server, "porch-lamp")["state"] == {"room": "porch", "job": "firmware"}


# --- jobs ----------------------------------------------------------------------------------------


def _job_id() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


def _until(read, predicate, seconds: float = 30):
    deadline = time.monotonic() + seconds
    while True:
        value = read()
        if predicate(value):
            return value
        assert time.monotonic() < deadline, value
        time.sleep(0.2)


@pytest.mark.parametrize("with_key, created", [(True, 1), (False, 2)])
def test_a_job_whose_answer_is_lost_is_created_once_resent_under_its_key_and_twice_without(server, with_key, created):
    device, mark = _device(server), uuid.uuid4().hex
    proxy = AnswerDroppingProxy(server.port, drops=1)
    try:
        if with_key:
            job = _client(proxy.port, sleep=lambda seconds: None).create_job({"mark": mark}, device_ids=[device])
            assert job["status"] == "IN_PROGRESS" and job["desired"] == {"mark": mark}
        else:
            assert _naive_send(proxy.port, "POST", "/jobs", {"deviceIds": [device], "desired": {"mark": mark}},
                               "application/json") == 201
        assert len(proxy.keys) == 2 and (proxy.keys[0] == proxy.keys[1] is not None) == with_key
    finally:
        proxy.close()
    made = [job for job in _client(server.port).jobs() if job["desired"] == {"mark": mark}]
    assert len(made) == created


def test_a_job_followed_by_long_polls_to_its_end_its_executions_and_its_refusals_as_types(server):
    client, confirming, refusing, ghost = _client(server.port), _device(server), _device(server), "ghost-job-device"
    job_id = _job_id()
    job = client.create_job({"mode": "eco"}, device_ids=[confirming, refusing, ghost], job_id=job_id,
                            expires_in=3600, max_per_minute=6000,
                            abort=[{"on": "TIMED_OUT", "thresholdPercent": 90, "minExecuted": 3}])
    assert (job["jobId"], job["rollout"], job["expiresIn"]) == (job_id, {"maxPerMinute": 6000}, 3600)
    seen, both_written = [], threading.Event()

    def follow():
        for job in client.follow_job(job_id, wait_seconds=5):
            seen.append(job)
            if job["counts"]["IN_PROGRESS"] == 2:
                both_written.set()

    following = threading.Thread(target=follow, daemon=True)
    following.start()
    assert both_written.wait(30), seen  # the follower saw both written before either device answers
    client.report(confirming, {"mode": "eco"})
    status, _, body = server.request("POST", f"/devices/{refusing}/desired/acks",
                                     {"acks": [{"path": "/mode", "version": 2, "code": 409, "reason": "busy"}]},
                                     headers=bearer(device=refusing))
    assert status == 200, body
    following.join(60)
    assert not following.is_alive() and seen, seen
    assert {state: count for state, count in seen[-1]["counts"].items() if count} == {
        "SUCCEEDED": 1, "FAILED": 1, "REMOVED": 1}
    moments = [(job["status"], job["counts"], job["total"], job.get("completedAt")) for job in seen]
    assert all(before != after for before, after in zip(moments, moments[1:])), moments  # each a change
    executions = {execution["deviceId"]: execution for execution in client.executions(job_id, page_size=1)}
    assert {device: execution["state"] for device, execution in executions.items()} == {
        confirming: "SUCCEEDED", refusing: "FAILED", ghost: "REMOVED"}
    failed = list(client.executions(job_id, state="FAILED"))
    assert [(execution["deviceId"], execution["code"], execution["reason"]) for execution in failed] == [
        (refusing, 409, "busy")]
    assert len(list(client.executions(job_id, limit=2))) == 2
    assert job_id in [job["jobId"] for job in client.jobs(page_size=2)]
    assert job_id not in [job["jobId"] for job in client.jobs(status="CANCELED")]
    with pytest.raises(JobExists) as exists:
        client.create_job({"mode": "eco"}, device_ids=[confirming], job_id=job_id)
    assert exists.value.job_id == job_id
    with pytest.raises(InvalidJob) as invalid:
        client.create_job({"mode": None}, device_ids=[confirming])
    assert invalid.value.member == "desired"
    with pytest.raises(JobNotFound):
        client.job("none-such")
    with pytest.raises(JobNotFound):
        list(client.follow_job("none-such"))


def test_cancel_then_cancel_again_is_job_ended_and_force_takes_the_leaves_back(server):
    client, device, job_id = _client(server.port), _device(server), _job_id()
    client.create_job({"mode": "eco"}, device_ids=[device], job_id=job_id)
    _until(lambda: client.job(job_id), lambda job: job["counts"]["IN_PROGRESS"] == 1)
    assert client.cancel_job(job_id)["status"] == "CANCELED"
    with pytest.raises(JobEnded) as ended:
        client.cancel_job(job_id)
    assert ended.value.job_status == "CANCELED"
    assert client.cancel_job(job_id, force=True)["status"] == "CANCELED"
    _until(lambda: client.job(job_id), lambda job: job["counts"]["CANCELED"] == 1)
    # the execution is CANCELED first, then the job's leaf is taken back (jobs/runner.py _force_page)
    _until(lambda: _read(server, device)["desired"], lambda desired: "mode" not in desired)
    with pytest.raises(JobNotFound):
        client.cancel_job("none-such")


@pytest.mark.parametrize("resent_by", ["client", "naive"])
def test_a_cancel_whose_answer_is_lost_answers_the_canceled_job_where_a_naive_resend_is_told_job_ended(
        server, resent_by):
    client, device, job_id = _client(server.port), _device(server), _job_id()
    client.create_job({"mode": "eco"}, device_ids=[device], job_id=job_id)
    proxy = AnswerDroppingProxy(server.port, drops=1)
    try:
        if resent_by == "client":
            assert _client(proxy.port, sleep=lambda seconds: None).cancel_job(job_id)["status"] == "CANCELED"
        else:
            assert _naive_send(proxy.port, "POST", f"/jobs/{job_id}/cancel", None, "application/json") == 409
        assert len(proxy.keys) == 2  # the first cancel applied, its answer lost; sent again
        if resent_by == "client":
            assert proxy.keys[0] is not None and proxy.keys[1] == proxy.keys[0]  # under its key
    finally:
        proxy.close()
    assert client.job(job_id)["status"] == "CANCELED"
