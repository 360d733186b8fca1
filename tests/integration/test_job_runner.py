"""The job runner (jobs/runner.py) on DynamoDB Local: every targeted device gets the job's write
exactly once and the job's counts agree with its executions, when the runner's answers are lost
at random (the fault forwarder), when a runner is cut off mid-page and another one finishes, and
when two runners whose leases lapse write the same pages at once. A naive runner (page the list
and PATCH each device, remembering its progress per page) writes devices twice when it is
restarted mid-page, in the same harness."""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from dataclasses import replace

import pytest
from botocore.exceptions import ClientError

from functions.device_state import DeviceStateManager, FleetIndex, MergePatch, table
from functions.device_state.client import dynamodb_client
from functions.device_state.fleet.cursors import CursorSeal
from functions.device_state.fleet.query import FleetQuery
from functions.device_state.item import job_marks
from functions.device_state.item.schema import PARTITION_KEY
from functions.device_state.jobs import items
from functions.device_state.jobs.runner import DONE, HELD, IDLE, STOP_CHECK_WRITES, STOP_POLL_SECONDS, JobRunner
from functions.device_state.jobs.spec import EXECUTION_STATES, FINAL_STATES, parse
from functions.device_state.jobs.store import JobStore
from functions.device_state.runtime import Runtime
from functions.device_state.table import create_table
from functions.device_state.write.pipeline import WritePipeline
from functions.device_state.write.store import Store
from localdev.faults import Forwarder
from bench.fleet_load import clone_devices
from tests.conftest import new_table_name, table_admin

pytestmark = pytest.mark.dynamodb_local


class Slow:
    """A DynamoDB client whose UpdateItems (``job_writes_only``: the job's writes) take ``delay``
    longer (a runner that falls behind)."""

    def __init__(self, client, delay: float, job_writes_only: bool = False, before_job_write=None):
        self._client, self._delay, self._job_writes_only = client, delay, job_writes_only
        self._before_job_write = before_job_write  # called (in the writer's thread) before each job write is sent
        self.job_writes = 0  # the job's writes this client sent (its mark in the request)
        # (device, monotonic time) as each was sent: a device's first try is always the read-free
        # write naming the mark (a read-modify-write after it sets the whole map, unrecorded)
        self.job_write_starts: list[tuple[str, float]] = []

    def __getattr__(self, name):
        call = getattr(self._client, name)
        if name != "update_item":
            return call

        def slowed(**request):
            job_write = "j1" in request.get("ExpressionAttributeNames", {}).values()  # the mark's name
            if job_write or not self._job_writes_only:
                time.sleep(self._delay)
            self.job_writes += job_write
            if job_write and self._before_job_write is not None:
                self._before_job_write()
            if job_write:
                self.job_write_starts.append((request["Key"][PARTITION_KEY]["S"], time.monotonic()))
            return call(**request)
        return slowed


def pipeline_to(client, name, ahead: float = 0.0) -> WritePipeline:
    """A pipeline whose clock runs ``ahead`` seconds ahead (a runner that comes back later)."""
    runtime = Runtime(clock=lambda: time.time() + ahead)
    return WritePipeline(Store(client, name, runtime), runtime, settle_seconds=2)


class Rig:
    def __init__(self, dynamodb_local, client, name, fleet_index=FleetIndex()):
        self.dynamodb_local, self.client, self.name = dynamodb_local, client, name
        self.fleet_index = fleet_index
        self.manager = DeviceStateManager(client, name, fleet_index=fleet_index)
        self.pipeline = pipeline_to(client, name)
        self.jobs = JobStore(self.pipeline)
        self.cursors = CursorSeal()
        self.forwarders = []

    def forwarder(self) -> Forwarder:
        forwarder = Forwarder(self.dynamodb_local.port)
        self.forwarders.append(forwarder)
        return forwarder

    def runner(self, client=None, ahead: float = 0.0, **options) -> JobRunner:
        pipeline = pipeline_to(client or self.client, self.name, ahead)
        query = FleetQuery(pipeline.store, self.fleet_index, pipeline.runtime.clock, self.cursors)
        return JobRunner(pipeline, query, **options)

    def devices(self, count, prefix="d"):
        """``count`` devices whose state is {"n": 0}: the first created, the rest its clones."""
        ids = [f"{prefix}{number:04d}" for number in range(count)]
        self.manager.create(ids[0], {"n": 0})
        clone_devices(self.client, self.name, self.fleet_index, ids[0], ids[1:], lambda _: {"state": {"n": 0}})
        return ids

    def job(self, **body):
        spec = parse({"jobId": "j1", "desired": {"mode": "eco"}, **body}, time.time())
        self.jobs.create(spec)
        return spec

    def versions(self, ids):
        found = {}
        for start in range(0, len(ids), 100):
            found.update(self.pipeline.store.batch_get_states(ids[start:start + 100]))
        return {device_id: int(found[device_id]["version"]["N"]) for device_id in ids if device_id in found}, found

    def counts_agree_with_executions(self, job_id="j1"):
        head = self.jobs.head(job_id)
        counts = head.counts_by_state
        finals = Counter(execution.state for execution in self.jobs.executions(job_id))
        finals["CANCELED"] += head.run.canceled_queued  # never written: no execution item (see their page)
        assert {state: counts[state] for state in FINAL_STATES} == {state: finals[state] for state in FINAL_STATES}
        assert sum(counts.values()) == head.run.total + 0  # every targeted device in exactly one state
        listed, cursor = Counter(), None
        while True:  # and as GET /jobs/{id}/executions lists them, device by device
            page, cursor = self.manager.jobs().executions(job_id, None, 100, cursor)
            listed.update(execution["state"] for execution in page)
            if not cursor:
                break
        assert {state: n for state, n in counts.items() if n} == dict(listed)
        return counts


def run_until_done(runner, job_id="j1", seconds=60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        progress = runner.run(job_id, 5)
        if progress.status == DONE:
            return
        if progress.status == IDLE and progress.wake_ms:
            time.sleep(max(0.0, min(progress.wake_ms / 1000 - time.time(), 2)) + 0.05)
        elif progress.status == HELD:
            time.sleep(0.2)
    raise AssertionError("the job did not complete")


@pytest.fixture
def rig(dynamodb_local, local_table):
    rig = Rig(dynamodb_local, *local_table)
    yield rig
    for forwarder in rig.forwarders:
        forwarder.close()


def test_a_listed_job_writes_each_device_once_and_its_counts_agree_with_its_executions(rig):
    ids = rig.devices(250)
    rig.job(deviceIds=[*ids, "ghost"], timeoutSeconds=600)
    assert rig.runner().run("j1", 60).status == IDLE  # every device written, the executions in progress
    head = rig.jobs.head("j1")
    assert head.counts_by_state["IN_PROGRESS"] == 250 and head.counts_by_state["REMOVED"] == 1, head.counts_by_state
    for device_id in ids[:10]:  # these devices confirm; the others never answer
        rig.manager.as_device(device_id).update_with_retry(device_id, MergePatch({"mode": "eco"}), section="reported")
    run_until_done(rig.runner(ahead=601))  # the runner comes back after the executions' deadline
    counts = rig.counts_agree_with_executions()
    assert counts["SUCCEEDED"] == 10 and counts["TIMED_OUT"] == 240 and counts["REMOVED"] == 1
    assert rig.jobs.head("j1").record.status == "COMPLETED"
    versions, found = rig.versions(ids)
    assert Counter(versions[device_id] for device_id in ids[10:]) == {2: 240}
    assert all(job_marks.mark_of(found[device_id], "j1")[0] == 2 for device_id in ids)


def test_a_job_whose_last_executions_the_stream_made_final_is_due_and_completes(rig):
    """The tracker writes the last finals with no word to the runner, which left the job idle
    until the executions' deadline: the job is due at once, and a runner completes it."""
    from functions.device_state.jobs.executions import Verdict
    from functions.device_state.jobs.finals import Final, Finals

    ids = rig.devices(3)
    spec = rig.job(deviceIds=ids, timeoutSeconds=3600)
    assert rig.runner().run("j1", 60).status == IDLE
    now_ms = int(time.time() * 1000)
    assert not rig.jobs.head("j1").due(now_ms)  # idle until the deadline, an hour ahead
    versions, _ = rig.versions(ids)
    finals = [Final(device_id, Verdict("SUCCEEDED", now_ms), versions[device_id], True) for device_id in ids]
    Finals(rig.pipeline).record("j1", items.retire_at(spec), finals[:2])
    assert not rig.jobs.head("j1").due(now_ms)  # one still in progress: nothing for a runner to do
    Finals(rig.pipeline).record("j1", items.retire_at(spec), finals[2:])
    assert rig.jobs.head("j1").due(now_ms) and rig.manager.due_jobs().job_ids == ("j1",)
    assert rig.runner().run("j1", 60).status == DONE
    assert rig.jobs.head("j1").record.status == "COMPLETED" and rig.counts_agree_with_executions()["SUCCEEDED"] == 3


def test_a_job_whose_abort_criterion_the_stream_met_is_due_and_aborts(rig):
    """A device's failure the tracker made final meets the abort criterion with no word to the
    runner, which left the job idle until the executions' deadline: the job is due at once, and
    a runner aborts it (not an hour later, when the deadline would wake it)."""
    from functions.device_state.jobs.executions import Verdict
    from functions.device_state.jobs.finals import Final, Finals

    ids = rig.devices(3)
    spec = rig.job(deviceIds=ids, timeoutSeconds=3600,
                   abort=[{"on": "FAILED", "thresholdPercent": 50, "minExecuted": 1}])
    assert rig.runner().run("j1", 60).status == IDLE
    now_ms = int(time.time() * 1000)
    versions, _ = rig.versions(ids)
    Finals(rig.pipeline).record("j1", items.retire_at(spec), [Final(ids[0], Verdict("SUCCEEDED", now_ms),
                                                                    versions[ids[0]], True)])
    assert not rig.jobs.head("j1").due(now_ms)  # 0 % failed: nothing for a runner to do
    Finals(rig.pipeline).record("j1", items.retire_at(spec), [Final(ids[1], Verdict("FAILED", now_ms, 500, "x"),
                                                                    versions[ids[1]], True)])
    assert rig.jobs.head("j1").due(now_ms) and rig.manager.due_jobs().job_ids == ("j1",)
    rig.runner().run("j1", 60)
    head = rig.jobs.head("j1")
    assert head.record.status == "ABORTED" and head.record.aborted_by["on"] == "FAILED"
    assert not head.due(now_ms)  # aborted: what is in progress waits for its deadline, as before


def test_lost_answers_at_random_write_each_device_once(rig):
    ids = rig.devices(200)
    forwarder = rig.forwarder()
    forwarder.random_loss = ("UpdateItem", 0.3, random.Random(7))
    rig.job(deviceIds=ids, timeoutSeconds=1)
    run_until_done(rig.runner(dynamodb_client(forwarder.endpoint, "us-east-1")))
    assert len(forwarder.lost) > 20
    versions, _ = rig.versions(ids)
    assert Counter(versions.values()) == {2: 200}  # created, then the job's write: once each
    assert rig.counts_agree_with_executions()["TIMED_OUT"] == 200


def test_a_runner_cut_off_mid_page_and_another_that_finishes_write_each_device_once(rig):
    ids = rig.devices(150)
    forwarder = rig.forwarder()
    landed = []

    def thirtieth_job_write(body):
        landed.append(1) if b"j1" in body else None
        return len(landed) == 30

    # the 30th write lands, its answer is lost, and from then on nothing reaches DynamoDB
    forwarder.lose("UpdateItem", when=thirtieth_job_write, then=lambda: setattr(forwarder, "unreachable", True))
    rig.job(deviceIds=ids, timeoutSeconds=1)
    cut_off = rig.runner(dynamodb_client(forwarder.endpoint, "us-east-1"), lease_seconds=1)
    with pytest.raises(Exception):
        cut_off.run("j1", 3)
    run = rig.jobs.head("j1").run
    assert run.batch is not None and run.owner == cut_off.owner  # it died holding a claimed batch
    run_until_done(rig.runner())
    versions, _ = rig.versions(ids)
    assert Counter(versions.values()) == {2: 150}
    assert rig.counts_agree_with_executions()["TIMED_OUT"] == 150


def test_two_runners_whose_leases_lapse_write_each_device_once(rig):
    ids = rig.devices(200)
    rig.job(deviceIds=ids, timeoutSeconds=1)
    # a runner's writes outlast its lease (it starts none in its last third): it lapses with them in
    # flight, and the other runner takes the batch up and writes the same devices beside them
    clients = [Slow(dynamodb_client(rig.dynamodb_local.endpoint, "us-east-1"), 1.5, job_writes_only=True)
               for _ in range(2)]
    runners = [rig.runner(client, lease_seconds=1.0, concurrency=32) for client in clients]
    errors = []

    def work(runner):
        try:
            run_until_done(runner)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(runner,)) for runner in runners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert all(client.job_writes >= 30 for client in clients), [client.job_writes for client in clients]
    assert sum(client.job_writes for client in clients) > 200  # some devices were sent the job's write twice
    versions, _ = rig.versions(ids)
    assert Counter(versions.values()) == {2: 200}
    assert rig.counts_agree_with_executions()["TIMED_OUT"] == 200


def test_a_write_landing_after_a_lapsed_runners_batch_was_canceled_is_counted_once(rig):
    """A runner stalls mid-batch past its lease; the job is canceled and the next runner takes the
    stop up, finding the stalled writes on no device; then they land, and a device confirms one.
    Each device still gets the job's write once, the stalled runner starts no write after its
    lease, and each execution is counted once, CANCELED: the counts are those listed."""
    ids = rig.devices(12)
    rig.job(deviceIds=ids, timeoutSeconds=600)
    forwarder, stalled, released = rig.forwarder(), threading.Event(), threading.Event()

    def stall_the_sixth(body):  # the forwarder holds every request while this waits: the runner stalls
        if b'"d0005"' in body and b"j1" in body and not stalled.is_set():
            stalled.set()
            released.wait(30)
        return False

    forwarder.lose("UpdateItem", when=stall_the_sixth)
    recorded = Slow(dynamodb_client(forwarder.endpoint, "us-east-1"), 0, job_writes_only=True)
    lapsing = rig.runner(recorded, lease_seconds=1, concurrency=2)
    progress = []
    worker = threading.Thread(target=lambda: progress.append(lapsing.run("j1", 20)))
    worker.start()
    try:
        assert stalled.wait(20)
        rig.manager.jobs().cancel("j1")
        time.sleep(1.5)  # its lease lapses
        assert rig.runner().run("j1", 10).status == IDLE  # the stop taken up: the stalled writes found nowhere
    finally:
        released_at = time.monotonic()
        released.set()
        worker.join(30)
    assert progress and progress[0].status == HELD  # its late writes landed; the job was no longer its own
    versions, found = rig.versions(ids)
    assert max(versions.values()) == 2 and job_marks.mark_of(found["d0005"], "j1") is not None  # landed late, once
    # no write started after its lease: those that landed are those it sent before the stall ended
    # (how many that is depends on how far the other worker got before the sixth reached the forwarder)
    assert all(started < released_at for _, started in recorded.job_write_starts)
    sent = [device_id for device_id, _ in recorded.job_write_starts]
    assert len(sent) == len(set(sent)) and {d for d, version in versions.items() if version == 2} == set(sent)
    before = rig.pipeline.store.get_state("d0005")
    rig.manager.as_device("d0005").update_with_retry("d0005", MergePatch({"mode": "eco"}), section="reported")
    tracker = rig.manager.job_tracker()  # what the stream processor does with the confirming report
    tracker.see(before, rig.pipeline.store.get_state("d0005"))
    tracker.flush()
    counts = rig.counts_agree_with_executions()
    listed, _ = rig.manager.jobs().executions("j1", None, 100)
    assert Counter(execution["state"] for execution in listed) == +Counter(counts)  # as listed, each once
    assert {execution["deviceId"]: execution["state"] for execution in listed}["d0005"] == "CANCELED"


def test_a_filter_job_targets_the_matching_devices_page_by_page(dynamodb_local):
    fleet = FleetIndex.parse("reported/battery:number")
    client, admin = dynamodb_client(dynamodb_local.endpoint, "us-east-1"), table_admin(dynamodb_local.endpoint)
    name = new_table_name()
    create_table(admin, name, fleet_index=fleet, stream=False)
    try:
        rig = Rig(dynamodb_local, client, name, fleet)
        rig.manager.reindex()
        ids = rig.devices(240)
        for number, device_id in enumerate(ids):
            rig.manager.update_with_retry(device_id, MergePatch({"battery": number % 100}), section="reported")
        low = [device_id for number, device_id in enumerate(ids) if number % 100 < 20]
        rig.job(filter="lt(reported/battery,20)", timeoutSeconds=1)
        run_until_done(rig.runner())
        versions, found = rig.versions(ids)
        assert {device_id for device_id in ids if job_marks.mark_of(found[device_id], "j1")} == set(low)
        assert all(versions[device_id] == 3 for device_id in low)  # created, reported, the job's write
        head = rig.jobs.head("j1")
        assert head.run.total == len(low) and rig.counts_agree_with_executions()["TIMED_OUT"] == len(low)
    finally:
        admin.delete_table(TableName=name)


@pytest.fixture
def battery_rig(dynamodb_local):
    """A rig whose table indexes reported/battery, for filter jobs; the table deleted after."""
    fleet = FleetIndex.parse("reported/battery:number")
    client, admin = dynamodb_client(dynamodb_local.endpoint, "us-east-1"), table_admin(dynamodb_local.endpoint)
    name = new_table_name()
    create_table(admin, name, fleet_index=fleet, stream=False)
    rig = Rig(dynamodb_local, client, name, fleet)
    rig.manager.reindex()
    yield rig
    admin.delete_table(TableName=name)


class SmallQueryPages:
    """A fleet query whose pages hold ``size`` devices, so that a few devices span many pages."""

    def __init__(self, query, size=5):
        self.query, self.size = query, size

    def page_items(self, text, limit, cursor, max_limit=None):
        return self.query.page_items(text, self.size, cursor, max_limit=self.size)


def test_a_job_canceled_while_finding_devices_completes_once_the_stream_makes_its_last_executions_final(battery_rig):
    """Canceled while its query still had devices to find, a job targets no more: the written
    ones end by the stream's finals with no word to the runner, whose wake lies at the
    executions' deadline (an hour ahead), so the job is due at once and completes then."""
    from functions.device_state.jobs.executions import Verdict
    from functions.device_state.jobs.finals import Final, Finals

    rig = battery_rig
    ids = rig.devices(40)
    for device_id in ids:
        rig.manager.update_with_retry(device_id, MergePatch({"battery": 5}), section="reported")
    spec = rig.job(filter="lt(reported/battery,100)", timeoutSeconds=3600)
    runner = rig.runner()
    runner._query = SmallQueryPages(runner._query)
    step = runner._step

    def canceled_once_written(head, writes, deadline):
        if head.run.at > 0 and head.targeting and head.run.stop is None:
            rig.manager.jobs().cancel("j1")  # some written, more to find
        return step(head, writes, deadline)

    runner._step = canceled_once_written
    assert runner.run("j1", 30).status == IDLE
    head = rig.jobs.head("j1")
    assert head.record.status == "CANCELED" and not head.run.targeted and 0 < head.run.total < len(ids)
    versions, found = rig.versions(ids)
    written = [device_id for device_id in ids if job_marks.mark_of(found[device_id], "j1")]
    assert written and head.counts_by_state["IN_PROGRESS"] == len(written)
    now_ms = int(time.time() * 1000)
    assert not head.due(now_ms)  # in progress until their confirmations or the deadline
    Finals(rig.pipeline).record("j1", items.retire_at(spec), [
        Final(device_id, Verdict("SUCCEEDED", now_ms), versions[device_id], True) for device_id in written])
    assert rig.jobs.head("j1").due(now_ms) and rig.manager.due_jobs().job_ids == ("j1",)
    assert rig.runner().run("j1", 60).status == DONE
    head = rig.jobs.head("j1")
    assert head.record.status == "CANCELED" and head.record.completed_ms is not None
    assert rig.counts_agree_with_executions()["SUCCEEDED"] == len(written)


class Throttled:
    """A DynamoDB client that throttles every UpdateItem on ``device_id``'s items while ``on``."""

    def __init__(self, client, device_id: str):
        self._client, self._device_id, self.on = client, device_id, True

    def __getattr__(self, name):
        call = getattr(self._client, name)
        if name != "update_item":
            return call

        def throttled(**request):
            if self.on and request["Key"][PARTITION_KEY]["S"] == self._device_id:
                raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"},
                                   "ResponseMetadata": {"HTTPStatusCode": 400}}, "UpdateItem")
            return call(**request)
        return throttled


@pytest.mark.parametrize("blocked_by", ["lease", "throttling"])
def test_a_forced_cancel_whose_removal_does_not_apply_removes_the_leaves_when_it_can(rig, blocked_by):
    """A forced cancel meets a device on its first page that another holds a lease on (its
    removal refused, 423), or whose writes DynamoDB throttles: its execution is CANCELED and every
    other device's leaves are removed, the next page's too, so the job idles with the job's leaf
    on that device alone, due again a minute later (not at every turn of the schedule). Once the
    lease ended (the throttling passed), a runner coming back after the executions' deadline
    removes it, and the job completes. A runner that does not try again (or lets the lease's refusal escape) leaves the leaf on the device for
    good; one that waits on that device leaves the pages after it undone."""
    ids = rig.devices(120)  # two target pages
    rig.job(deviceIds=ids, timeoutSeconds=600)
    assert rig.runner().run("j1", 60).status == IDLE
    client = Throttled(rig.client, ids[1])
    if blocked_by == "lease":
        client.on, lease = False, rig.manager.lease(ids[1], ttl_seconds=60).acquire()
    rig.manager.jobs().cancel("j1", force=True)
    assert rig.runner(client).run("j1", 60).status == IDLE  # no error escaping: the schedule takes it up again
    head = rig.jobs.head("j1")
    assert {execution.state for execution in rig.jobs.executions("j1")} == {"CANCELED"}
    assert head.run.forced == head.run.at and head.run.force_left == (1,)  # both pages gone through
    versions, found = rig.versions(ids)
    assert [device_id for device_id in ids if job_marks.mark_of(found[device_id], "j1")] == ids
    assert [device_id for device_id in ids if rig.manager.get(device_id).desired] == [ids[1]]
    now_ms = int(time.time() * 1000)
    assert head.record.completed_ms is None and not head.due(now_ms) and head.due(now_ms + 61_000)
    lease.release() if blocked_by == "lease" else setattr(client, "on", False)
    run_until_done(rig.runner(client, ahead=700))  # after the 600 s window: TIMED_OUT, were it still in progress
    assert rig.manager.get(ids[1]).desired == {}
    assert rig.jobs.head("j1").record.status == "CANCELED" and rig.counts_agree_with_executions()["CANCELED"] == 120


def test_a_forced_cancel_removes_a_nested_leaf_and_the_object_it_leaves_empty_not_what_others_hold(rig):
    """Nulls at the job's leaves alone left {"fan": {}} on the device, a leaf of its own that the
    delta asked for (found by a hostile review); an object still holding another leaf stays."""
    ids = rig.devices(2)
    rig.manager.update_with_retry(ids[1], MergePatch({"fan": {"mode": "auto"}, "keep": 1}), section="desired")
    rig.job(deviceIds=ids, timeoutSeconds=600, desired={"fan": {"speed": 3}})
    assert rig.runner().run("j1", 30).status == IDLE
    assert [rig.manager.get(device_id).desired for device_id in ids] == [
        {"fan": {"speed": 3}}, {"fan": {"mode": "auto", "speed": 3}, "keep": 1}]
    rig.manager.jobs().cancel("j1", force=True)
    run_until_done(rig.runner())
    assert [rig.manager.get(device_id).desired for device_id in ids] == [{}, {"fan": {"mode": "auto"}, "keep": 1}]


def test_a_forced_cancel_whose_runner_died_between_a_cancel_and_its_removal_removes_it_on_the_next_run(
        rig, monkeypatch):
    """The runner records a device's CANCELED, then dies before removing its leaves (before it
    records the page): the next runner finds the execution final and removes them all the same,
    where a runner that passes over final executions leaves that leaf for good."""
    ids = rig.devices(3)
    rig.job(deviceIds=ids, timeoutSeconds=600)
    assert rig.runner().run("j1", 30).status == IDLE
    rig.manager.jobs().cancel("j1", force=True)
    remove = JobRunner._remove_owned

    def dies_once(self, spec, device_id, version):
        if device_id == ids[1]:
            monkeypatch.setattr(JobRunner, "_remove_owned", remove)
            raise RuntimeError("the invocation timed out")
        return remove(self, spec, device_id, version)

    monkeypatch.setattr(JobRunner, "_remove_owned", dies_once)
    with pytest.raises(RuntimeError):
        rig.runner().run("j1", 30)
    assert rig.manager.get(ids[1]).desired == {"mode": "eco"} and rig.jobs.head("j1").run.forced == 0
    run_until_done(rig.runner())
    assert [rig.manager.get(device_id).desired for device_id in ids] == [{}, {}, {}]
    assert rig.counts_agree_with_executions()["CANCELED"] == 3


def test_a_device_whose_value_moves_ahead_of_the_targeting_cursor_is_targeted_and_counted_once(battery_rig):
    """Found on a first query page and not written yet, a device's battery moves ahead of the query's
    cursor, so a later page finds it again: the naive control (the query's pages one after
    another) holds it twice; the job targets it once, writes each device once and completes with
    its counts agreeing."""
    rig = battery_rig
    ids = rig.devices(80)  # about 5 in each of the index's 16 shards: a shard is read over several pages
    for number, device_id in enumerate(ids):
        rig.manager.update_with_retry(device_id, MergePatch({"battery": number + 1}), section="reported")
    rig.job(filter="lt(reported/battery,100)", timeoutSeconds=1)
    runner = rig.runner()
    runner._query = SmallQueryPages(runner._query)
    naive_query = SmallQueryPages(rig.runner()._query)
    assert rig.jobs.take_lease("j1", runner.owner, 30)
    runner._target_page(rig.jobs.head("j1"))  # the first query page, none written
    first, cursor = naive_query.page_items("lt(reported/battery,100)", 5, None)  # the same page
    moved = min(first, key=lambda item: int(item["reported"]["M"]["battery"]["N"]))[PARTITION_KEY]["S"]
    rig.manager.update_with_retry(moved, MergePatch({"battery": 50}), section="reported")  # ahead of the cursor
    naive = []
    while cursor is not None:
        found, cursor = naive_query.page_items("lt(reported/battery,100)", 5, cursor)
        naive += found
    naive_ids = Counter(item[PARTITION_KEY]["S"] for item in [*first, *naive])
    assert naive_ids[moved] == 2  # the control: the query's pages hold it twice
    head = rig.jobs.head("j1")
    while not head.run.targeted:  # targeting runs ahead of the writes (up to two batches): here all of it
        head = runner._target_page(head)
    assert Counter(device_id for page in rig.jobs.pages("j1", 0, 100) for device_id in page.ids) == Counter(ids)
    rig.jobs.release_lease("j1", runner.owner)
    run_until_done(runner)
    targeted = Counter(device_id for page in rig.jobs.pages("j1", 0, 100) for device_id in page.ids)
    assert targeted == Counter(ids)  # each device once
    versions, _ = rig.versions(ids)
    assert {device_id: version - (device_id == moved) for device_id, version in versions.items()} == dict.fromkeys(
        ids, 3)  # created, reported (the moved one twice), the job's write
    counts = rig.counts_agree_with_executions()
    assert counts["TIMED_OUT"] == 80 and rig.jobs.head("j1").record.status == "COMPLETED"


def test_a_device_whose_mark_a_later_write_dropped_is_not_targeted_again(battery_rig, monkeypatch):
    """A long snapshot job: a device written on its first page keeps the job's mark a day past its
    execution's deadline; a write after that drops it, and the device's value moves ahead of the
    query's cursor, so the query finds it again with no mark. The job, run on later, sweeps the
    execution final at its deadline and reads the finals of what it finds once its marks may be
    gone: the device is not targeted nor written again, and the job completes with its counts."""
    from functions.device_state.jobs.device_write import JobWrites

    rig = battery_rig
    ids = rig.devices(40)
    for number, device_id in enumerate(ids):
        rig.manager.update_with_retry(device_id, MergePatch({"battery": number + 1}), section="reported")
    spec = rig.job(filter="lt(reported/battery,100)", timeoutSeconds=2)
    runner = rig.runner()
    runner._query = SmallQueryPages(runner._query)
    monkeypatch.setattr(runner, "_target_beside", lambda *_: None)  # the first page's steps one by one
    assert rig.jobs.take_lease("j1", runner.owner, 30)
    runner._target_page(rig.jobs.head("j1"))
    claimed, pages = runner._claim(rig.jobs.head("j1"))
    runner._write_batch(claimed, JobWrites(runner._pipeline, spec), pages)  # the first page written
    victim = min(pages[0].ids)
    rig.jobs.release_lease("j1", runner.owner)
    days_later = 2 * 24 * 3600
    later = DeviceStateManager(rig.client, rig.name, fleet_index=rig.fleet_index,
                               clock=lambda: time.time() + days_later)
    later.replace_section(victim, "reported", {"battery": 50})  # a write that reads the item drops old marks
    assert job_marks.mark_of(rig.pipeline.store.get_state(victim), "j1") is None
    versions_before, _ = rig.versions([victim])
    runner = rig.runner(ahead=days_later)
    runner._query = SmallQueryPages(runner._query)
    run_until_done(runner)
    targeted = Counter(device_id for page in rig.jobs.pages("j1", 0, 100) for device_id in page.ids)
    assert targeted == Counter(ids)  # each device once
    assert rig.versions([victim])[0] == versions_before  # not written again
    assert rig.counts_agree_with_executions()["TIMED_OUT"] == 40
    assert rig.jobs.head("j1").record.status == "COMPLETED"


@pytest.mark.parametrize("naive", [False, True], ids=["finals-consulted", "naive-finals-ignored"])
def test_a_device_refused_in_a_batch_tried_again_is_not_written_after_its_execution_failed(battery_rig, monkeypatch,
                                                                                           naive):
    """A filter job's batch: d0000 is leased (its write refused: FAILED 423, nothing written) and
    d0001's outcome is not known, so the batch is written again at the next step, after d0000's
    lease ended. d0000 is not written again: its execution is final. The naive control, which does
    not look at the finals, writes it after its FAILED, and its counts no longer add up."""
    from functions.device_state.jobs.device_write import JobWrites, Outcome

    rig = battery_rig
    ids = rig.devices(2)
    for device_id in ids:
        rig.manager.update_with_retry(device_id, MergePatch({"battery": 5}), section="reported")
    lease = rig.manager.lease("d0000", ttl_seconds=60).acquire()
    original, unknown_once = JobWrites.write, {"d0001"}

    def write(self, device_id):
        if device_id in unknown_once:
            unknown_once.discard(device_id)
            return Outcome()  # not known this time (throttled, its answer lost)
        return original(self, device_id)

    monkeypatch.setattr(JobWrites, "write", write)
    if naive:
        monkeypatch.setattr(JobStore, "finals", lambda self, job_id, device_ids: {})
    rig.job(filter="lt(reported/battery,20)", timeoutSeconds=600)
    runner = rig.runner()
    step, steps = runner._step, []

    def counted_step(head, writes, deadline):
        steps.append(head)
        if len(steps) == 3:
            lease.release()  # between the batch's two tries
        return step(head, writes, deadline)

    runner._step = counted_step
    runner.run("j1", 30)  # returns once the job is idle
    versions, found = rig.versions(ids)
    head = rig.jobs.head("j1")
    executions = {execution.device_id: execution.state for execution in rig.jobs.executions("j1")}
    assert executions["d0000"] == "FAILED"
    if naive:
        assert job_marks.mark_of(found["d0000"], "j1") is not None  # written after its FAILED
        assert sum(head.counts_by_state.values()) > head.run.total
        return
    assert job_marks.mark_of(found["d0000"], "j1") is None and versions["d0000"] == 2  # created, reported
    assert sum(head.counts_by_state.values()) == head.run.total == 2
    assert head.counts_by_state["IN_PROGRESS"] == 1 and head.counts_by_state["FAILED"] == 1


def _judged_by_the_stream(rig, spec, device_id: str, state: str, version: int) -> None:
    """What the stream processor records once it sees the device confirm (or go): its final state."""
    from functions.device_state.jobs.executions import Verdict
    from functions.device_state.jobs.finals import Final, Finals

    Finals(rig.pipeline).record(spec.job_id, items.retire_at(spec),
                                [Final(device_id, Verdict(state, int(time.time() * 1000)), version, True)])


def _once_written(monkeypatch, device_id: str, then) -> None:
    """The job's write of ``device_id`` lands, then ``then(outcome)`` answers for it, once."""
    from functions.device_state.jobs.device_write import JobWrites

    write, left = JobWrites.write, {device_id}

    def written(self, writing):
        outcome = write(self, writing)
        if writing in left:
            left.discard(writing)
            return then(outcome)
        return outcome

    monkeypatch.setattr(JobWrites, "write", written)


@pytest.mark.parametrize("naive", [False, True], ids=["runner", "naive-control"])
def test_a_write_whose_answer_was_lost_and_the_stream_judged_before_its_retry_counts_as_written(
        rig, monkeypatch, naive):
    """d0001's write lands, its answer lost, and the device confirms before the batch is tried
    again: the retry finds its execution SUCCEEDED and does not write it again, and it still counts
    as written, so d0000 and d0002 count IN_PROGRESS, as listed, and a cancel leaves none of them
    CANCELED. The naive control (a runner counting as written only what its pages record) counts
    one device QUEUED that is not, and cancels it a second time."""
    from functions.device_state.jobs.device_write import Outcome

    ids = rig.devices(3)
    spec = rig.job(deviceIds=ids, timeoutSeconds=600)

    def confirmed_and_its_answer_lost(outcome):
        rig.manager.as_device("d0001").update_with_retry("d0001", MergePatch({"mode": "eco"}), section="reported")
        _judged_by_the_stream(rig, spec, "d0001", "SUCCEEDED", outcome.version)
        return Outcome()

    _once_written(monkeypatch, "d0001", confirmed_and_its_answer_lost)
    if naive:
        finals = JobStore.finals
        monkeypatch.setattr(JobStore, "finals", lambda self, job_id, device_ids: {
            device_id: replace(execution, written=False) for device_id, execution in finals(self, job_id, device_ids).items()})
    assert rig.runner().run("j1", 20).status == IDLE
    head = rig.jobs.head("j1")
    if naive:
        assert head.counts_by_state["QUEUED"] == 1 and head.counts_by_state["IN_PROGRESS"] == 1
        return
    assert rig.counts_agree_with_executions() == {**dict.fromkeys(EXECUTION_STATES, 0), "IN_PROGRESS": 2,
                                                  "SUCCEEDED": 1}
    rig.manager.jobs().cancel("j1")
    for device_id in ("d0000", "d0002"):
        _judged_by_the_stream(rig, spec, device_id, "SUCCEEDED", rig.versions([device_id])[0][device_id])
    run_until_done(rig.runner())
    assert rig.counts_agree_with_executions()["SUCCEEDED"] == 3


def test_a_runner_dead_mid_batch_whose_written_device_was_deleted_counts_it_written_at_a_cancel(rig, monkeypatch):
    """The runner writes d0001 and dies; the device is deleted (the stream records REMOVED) and
    the job canceled: the next runner's stop finds d0001 final and written, so it is not counted
    QUEUED too and canceled again, and the job completes only once d0000 and d0002 are final."""
    ids = rig.devices(3)
    spec = rig.job(deviceIds=ids, timeoutSeconds=600)

    def deleted_and_the_runner_dies(outcome):
        rig.manager.delete("d0001")
        _judged_by_the_stream(rig, spec, "d0001", "REMOVED", outcome.version)
        raise RuntimeError("the invocation timed out")

    _once_written(monkeypatch, "d0001", deleted_and_the_runner_dies)
    with pytest.raises(RuntimeError):
        rig.runner().run("j1", 20)
    rig.manager.jobs().cancel("j1")
    rig.runner().run("j1", 10)
    counts = rig.counts_agree_with_executions()
    assert (counts["IN_PROGRESS"], counts["REMOVED"], counts["CANCELED"]) == (2, 1, 0)
    assert rig.jobs.head("j1").record.completed_ms is None
    for device_id in ("d0000", "d0002"):
        _judged_by_the_stream(rig, spec, device_id, "SUCCEEDED", rig.versions([device_id])[0][device_id])
    run_until_done(rig.runner())
    assert rig.counts_agree_with_executions()["SUCCEEDED"] == 2


def test_a_leaf_another_writer_removed_before_the_deadline_is_superseded_when_judged_after_it(rig):
    """Another writer removes d0000's leaf and sets d0001's, both before the deadline; judged
    after it (a late stream record, the sweep, a forced cancel), each is SUPERSEDED when that
    write was made, not TIMED_OUT as if the removal happened when it was judged."""
    from functions.device_state.jobs.executions import judge

    ids = rig.devices(2)
    spec = rig.job(deviceIds=ids, timeoutSeconds=60)
    assert rig.runner().run("j1", 20).status == IDLE
    rig.manager.update_with_retry(ids[0], MergePatch({"mode": None}), section="desired")
    rig.manager.update_with_retry(ids[1], MergePatch({"mode": "x"}), section="desired")
    written = time.time()
    _, found = rig.versions(ids)
    for device_id in ids:
        version, deadline_ms = job_marks.mark_of(found[device_id], "j1")
        verdict = judge(spec.leaves, version, deadline_ms, found[device_id], deadline_ms / 1000 + 5)
        assert verdict.state == "SUPERSEDED" and verdict.at_ms <= written * 1000 < deadline_ms


def test_a_key_that_refused_a_create_and_lapsed_before_its_replay_was_read_is_written_afresh(rig, monkeypatch):
    """The create's transaction is refused on its Idempotency-Key's entry, which lapses before the
    replay reads it (its 24 hours end between the two): the create is sent again, and answers the
    replay that the key still names, not the bare refusal (a 500)."""
    from functions.device_state.jobs.service import JobService
    from functions.device_state.write.keyed import IdempotencyKey

    ids = rig.devices(1)
    service, key = rig.manager.jobs(), IdempotencyKey("k1", "POST.jobs", "same-body")
    body = {"jobId": "j1", "deviceIds": ids, "desired": {"mode": "eco"}}
    first, replayed = service.create(body, key)
    assert not replayed
    reads, real = [], JobService._replayed

    def lapsed_twice(self, key):  # unseen before the write, lapsed just after its refusal
        reads.append(key)
        return None if len(reads) <= 2 else real(self, key)

    monkeypatch.setattr(JobService, "_replayed", lapsed_twice)
    again, replayed = service.create(body, key)
    assert replayed and again.record.spec.job_id == "j1" and len(reads) == 3


class NaiveRunner:
    """Page the list and PATCH each device, saving its progress after each page (what a script
    does): restarted mid-page, it writes the page's first devices again."""

    def __init__(self, manager, ids, page_size=items.PAGE_SIZE):
        self.manager, self.ids, self.page_size = manager, ids, page_size
        self.done_pages = 0

    def run(self, stop_after=None):
        written = 0
        for start in range(self.done_pages * self.page_size, len(self.ids), self.page_size):
            for device_id in self.ids[start:start + self.page_size]:
                if stop_after is not None and written == stop_after:
                    raise RuntimeError("killed")
                self.manager.update_with_retry(device_id, MergePatch({"mode": "eco"}), section="desired")
                written += 1
            self.done_pages += 1


def test_control_a_naive_runner_restarted_mid_page_writes_devices_twice(rig):
    ids = rig.devices(150)
    naive = NaiveRunner(rig.manager, ids)
    with pytest.raises(RuntimeError):
        naive.run(stop_after=130)  # killed mid-way through the second page
    naive.run()
    versions, _ = rig.versions(ids)
    assert Counter(versions.values()) == {2: 120, 3: 30}  # 30 devices got the change twice


def test_the_job_states_are_each_counted():
    assert set(EXECUTION_STATES) >= {"QUEUED", "IN_PROGRESS", "SUCCEEDED", "TIMED_OUT", "CANCELED"}


def test_a_cancel_lets_few_more_writes_begin_however_fast_the_batch_writes(rig):
    """The batch reads its run again after every STOP_CHECK_WRITES writes begun, not only once a
    second: at 16 writes in flight, each held 20 ms, a batch that looked once a second began
    hundreds of the 360 writes left after the cancel before it saw it."""
    ids = rig.devices(400)  # one batch
    rig.job(deviceIds=ids, timeoutSeconds=600)
    begun, canceled_at, gate = itertools.count(1), [], threading.Lock()

    def cancel_at_the_40th():
        with gate:  # no write begins while the cancel is made: it lands before the look the 64th write asks
            if next(begun) == 40:
                rig.jobs.stop("j1", items.STOP_CANCEL, "CANCELED")
                canceled_at.append(time.monotonic())

    recorded = Slow(dynamodb_client(rig.dynamodb_local.endpoint, "us-east-1"), 0.02, job_writes_only=True,
                    before_job_write=cancel_at_the_40th)
    runner, deadline = rig.runner(recorded), time.monotonic() + 60
    while rig.jobs.head("j1").run.stopped_ms is None and time.monotonic() < deadline:  # until it takes the stop up
        runner.run("j1", 5)
    after = [device_id for device_id, start in recorded.job_write_starts if start > canceled_at[0]]
    # up to the look the 64th write asks for (24), and those its 16 writers begin while it is answered:
    # a round or two, as writes and the look alike wait on DynamoDB Local (26 to 32 measured; a
    # batch that looked once a second, 139 to 222)
    assert len(after) <= STOP_CHECK_WRITES + 2 * 16, len(after)
    versions, _ = rig.versions(ids)
    counts = rig.counts_agree_with_executions()
    written = sum(1 for version in versions.values() if version == 2)
    assert counts["IN_PROGRESS"] == written and counts["CANCELED"] == 400 - written and counts["QUEUED"] == 0
    assert written == len(recorded.job_write_starts)  # each once


def test_a_paced_job_keeps_its_rate_and_a_cancel_stops_queuing_then_force_removes_what_it_owns(rig):
    ids = rig.devices(200)
    rig.job(deviceIds=ids, rollout={"maxPerMinute": 600}, timeoutSeconds=600)
    recorded = Slow(dynamodb_client(rig.dynamodb_local.endpoint, "us-east-1"), 0, job_writes_only=True)
    runner = rig.runner(recorded)
    worker = threading.Thread(target=lambda: runner.run("j1", 30))
    worker.start()
    # 3 s of writing at 10 a second, counted from the first write: the runner's start (reading the
    # job, claiming its first batch) took 1.7 s of a 3 s window from the thread's start once, under
    # the full suite on 2 cores, and left 13 writes where the rate makes 30
    deadline = time.monotonic() + 30
    while not recorded.job_write_starts:
        assert time.monotonic() < deadline, "the runner wrote nothing"
        time.sleep(0.01)
    time.sleep(3)
    rig.jobs.stop("j1", items.STOP_CANCEL, "CANCELED")
    stopped = time.monotonic()
    worker.join()
    head = rig.jobs.head("j1")
    counts = head.counts_by_state
    written = [items.unpack_write(packed)[1] for page in rig.jobs.pages("j1", 0, 1) for packed in page.writes
               if packed]
    assert len(written) >= 15 and counts["IN_PROGRESS"] == len(written)
    # the batch looks for a stop every STOP_POLL_SECONDS: no write starts much later (not a count of
    # writes, which a loaded machine's slow stop write inflates at the job's rate). A stop heeded only
    # when the batch ends (BATCH_SECONDS) starts writes 7 s after it
    assert max(start for _, start in recorded.job_write_starts) <= stopped + STOP_POLL_SECONDS + 1.5
    assert counts["CANCELED"] == 200 - len(written) and counts["QUEUED"] == 0
    started = head.run.started_ms
    # the k-th write went no earlier than its turn: never more than 600 x elapsed / 60 + 1 written
    assert all(at >= started + 100 * number - 5 for number, at in enumerate(sorted(written)))
    versions, found = rig.versions(ids)
    assert Counter(versions.values()) == {2: len(written), 1: 200 - len(written)}  # the canceled never written
    owned = [device_id for device_id in ids if versions[device_id] == 2]
    rig.manager.update_with_retry(owned[0], MergePatch({"mode": "manual"}), section="desired")
    rig.jobs.stop("j1", items.STOP_CANCEL, "CANCELED", force=True)
    run_until_done(rig.runner())
    executions = {execution.device_id: execution.state for execution in rig.jobs.executions("j1")}
    assert executions[owned[0]] == "SUPERSEDED" and rig.manager.get(owned[0]).desired == {"mode": "manual"}
    assert all(executions[device_id] == "CANCELED" and "mode" not in rig.manager.get(device_id).desired
               for device_id in owned[1:])
    assert rig.counts_agree_with_executions()["CANCELED"] == 200 - 1
    assert rig.jobs.head("j1").record.status == "CANCELED"


def test_a_cancel_ends_a_batch_of_four_pages_within_a_second_and_what_it_left_is_canceled(rig):
    ids = rig.devices(400)
    rig.job(deviceIds=ids, timeoutSeconds=600)
    slow = Slow(dynamodb_client(rig.dynamodb_local.endpoint, "us-east-1"), 0.1)  # 16 writers: about 160 a second
    runner = rig.runner(slow)
    worker = threading.Thread(target=lambda: runner.run("j1", 30))
    worker.start()
    deadline = time.monotonic() + 20
    while slow.job_writes < 50:  # the batch (all four pages) is being written
        assert time.monotonic() < deadline
        time.sleep(0.05)
    rig.manager.jobs().cancel("j1")
    canceled_at = slow.job_writes
    worker.join()
    versions, _ = rig.versions(ids)
    written = sum(version == 2 for version in versions.values())
    assert written < canceled_at + 16 * 15  # within about a second of the cancel (16 writers, 0.1 s each)
    counts = rig.counts_agree_with_executions()
    assert counts["IN_PROGRESS"] == written and counts["CANCELED"] == 400 - written and counts["QUEUED"] == 0


def _in_the_most_jobs(rig, device_ids) -> None:
    """The devices hold the most job marks already: a job's write fails there."""
    full = {f"other{number}": {"N": str(job_marks.pack(int(time.time() * 1000) + 600_000, 1))} for number in range(10)}
    for device_id in device_ids:
        rig.client.update_item(TableName=rig.name, Key=table.state_key(device_id),
                               UpdateExpression="SET #j = :m", ExpressionAttributeNames={"#j": table.JOB_MARKS},
                               ExpressionAttributeValues={":m": {"M": full}})


def test_an_abort_criterion_met_stops_the_job_and_cancels_what_is_queued(rig):
    ids = rig.devices(250)
    _in_the_most_jobs(rig, ids[:30])
    rig.job(deviceIds=ids, timeoutSeconds=600,
            abort=[{"on": "FAILED", "thresholdPercent": 50, "minExecuted": 10}])
    rig.runner().run("j1", 30)
    head = rig.jobs.head("j1")
    counts = head.counts_by_state
    assert head.record.status == "ABORTED" and head.record.aborted_by["on"] == "FAILED"
    assert counts["FAILED"] == 30 and counts["IN_PROGRESS"] == 70 and counts["CANCELED"] == 150
    versions, _ = rig.versions(ids)
    assert all(versions[device_id] == 1 for device_id in ids[100:])  # queued when it aborted: never written


def test_a_forced_cancel_of_an_aborted_job_takes_back_the_leaves_still_in_progress_and_it_stays_aborted(rig):
    """An abort stops queuing and leaves what is in progress; forcing a cancel then was 409
    job-ended, so a failing rollout's leaves stayed on its devices (found by a hostile review)."""
    ids = rig.devices(20)
    _in_the_most_jobs(rig, ids[:6])
    rig.job(deviceIds=ids, timeoutSeconds=600, abort=[{"on": "FAILED", "thresholdPercent": 50, "minExecuted": 5}])
    rig.runner().run("j1", 30)
    head = rig.jobs.head("j1")
    assert head.record.status == "ABORTED" and head.counts_by_state["IN_PROGRESS"] == 14, head.counts_by_state
    answered, _ = rig.manager.jobs().cancel("j1", force=True)
    assert answered.record.status == "ABORTED"
    run_until_done(rig.runner())
    counts = rig.counts_agree_with_executions()
    assert (counts["FAILED"], counts["CANCELED"], counts["IN_PROGRESS"]) == (6, 14, 0), counts
    assert rig.jobs.head("j1").record.status == "ABORTED"
    assert [rig.manager.get(device_id).desired for device_id in ids[6:]] == [{}] * 14


@pytest.mark.parametrize("abort", [True, False], ids=["abort-criterion", "control-none"])
def test_an_abort_criterion_met_while_a_paced_batch_writes_ends_the_batch_then(rig, abort):
    """A paced batch claims what its rollout allows over 10 s, and its look-out read the run item
    alone: a criterion the devices' refusals met went unseen until the batch ended (19 devices
    more written over 9.5 s, found by a hostile review). The control, with no criterion, writes on."""
    from functions.device_state.jobs.executions import Verdict
    from functions.device_state.jobs.finals import Final, Finals

    ids = rig.devices(30)
    spec = rig.job(deviceIds=ids, timeoutSeconds=3600, rollout={"maxPerMinute": 240},  # 4 a second: 7.5 s for 30
                   **({"abort": [{"on": "FAILED", "thresholdPercent": 50, "minExecuted": 2}]} if abort else {}))
    writes = itertools.count()

    def refused_by_the_first_two():  # as the tracker records the refusals of the devices written first
        if next(writes) == 2:
            now_ms = int(time.time() * 1000)
            Finals(rig.pipeline).record("j1", items.retire_at(spec), [
                Final(device_id, Verdict("FAILED", now_ms, 400, "no"), 2, True) for device_id in ids[:2]])

    client = Slow(dynamodb_client(rig.dynamodb_local.endpoint, "us-east-1"), 0, job_writes_only=True,
                  before_job_write=refused_by_the_first_two)
    rig.runner(client).run("j1", 30)
    written = client.job_writes
    if abort:
        assert written <= 2 + 4 * (2 * STOP_POLL_SECONDS + 1), written  # a look a second (one may just miss it)
        rig.runner().run("j1", 30)  # the next step aborts it (what it wrote waits for its deadline)
        head = rig.jobs.head("j1")
        assert head.record.status == "ABORTED" and head.counts_by_state["CANCELED"] == 30 - written
    else:
        assert written == 30


def test_the_schedule_finds_a_new_job_and_make_serves_loop_runs_it_to_the_end(rig):
    from localdev import jobs as local_runner

    ids = rig.devices(20)
    rig.job(deviceIds=ids, timeoutSeconds=1)
    assert rig.manager.due_jobs().job_ids == ("j1",)
    done = threading.Event()
    loop = threading.Thread(target=local_runner.serve, args=(rig.manager, done.is_set))
    loop.start()
    try:
        deadline = time.monotonic() + 30
        while rig.jobs.head("j1").record.completed_ms is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        done.set()
        loop.join()
    assert rig.jobs.head("j1").record.status == "COMPLETED" and rig.manager.due_jobs().job_ids == ()
    assert rig.counts_agree_with_executions()["TIMED_OUT"] == 20


def test_a_continuous_job_writes_each_device_that_comes_to_match_once_until_it_ends(dynamodb_local):
    from datetime import datetime, timedelta, timezone

    fleet = FleetIndex.parse("reported/battery:number")
    client, admin = dynamodb_client(dynamodb_local.endpoint, "us-east-1"), table_admin(dynamodb_local.endpoint)
    name = new_table_name()
    create_table(admin, name, fleet_index=fleet, stream=False)
    try:
        rig = Rig(dynamodb_local, client, name, fleet)
        rig.manager.reindex()
        ids = rig.devices(20)
        for number, device_id in enumerate(ids):
            rig.manager.update_with_retry(device_id, MergePatch({"battery": 10 if number < 5 else 90}),
                                          section="reported")
        ends = (datetime.now(timezone.utc) + timedelta(seconds=12)).isoformat().replace("+00:00", "Z")
        rig.job(filter="lt(reported/battery,20)", targets="continuous", endsAt=ends, timeoutSeconds=1)
        runner = rig.runner(requery_seconds=1)
        assert runner.run("j1", 4).status in (IDLE, "busy")
        for device_id in ids[15:17]:  # two devices come to match; the first five match again
            rig.manager.update_with_retry(device_id, MergePatch({"battery": 5}), section="reported")
        run_until_done(runner, seconds=60)
        versions, found = rig.versions(ids)
        written = {device_id for device_id in ids if job_marks.mark_of(found[device_id], "j1")}
        assert written == set(ids[:5]) | set(ids[15:17])
        assert all(versions[device_id] == 3 for device_id in ids[:5])  # created, reported, the job once
        assert all(versions[device_id] == 4 for device_id in ids[15:17])  # created, reported twice, the job once
        head = rig.jobs.head("j1")
        assert head.run.total == 7 and head.record.status == "COMPLETED"
        assert rig.counts_agree_with_executions()["TIMED_OUT"] == 7
    finally:
        admin.delete_table(TableName=name)


def test_a_filtered_list_stops_after_its_reads_with_a_cursor_and_paging_on_finds_every_match(rig, monkeypatch):
    """``executions(state=…)`` and ``list(status=…)`` read at most ``MAX_READS_PER_PAGE`` times a
    request (here 1), so a large job's list is not read whole at once: a page may hold fewer items
    than asked, with a cursor, and the pages together hold every match, once."""
    from functions.device_state.jobs import service

    monkeypatch.setattr(service, "MAX_READS_PER_PAGE", 1)
    ids = rig.devices(250)
    rig.job(deviceIds=ids, timeoutSeconds=600)
    assert rig.runner().run("j1", 60).status == IDLE  # every execution IN_PROGRESS
    jobs = rig.manager.jobs()
    pages, cursor = [], None
    while True:
        found, cursor = jobs.executions("j1", "IN_PROGRESS", 150, cursor)
        pages.append([execution["deviceId"] for execution in found])
        if cursor is None:
            break
    assert [len(page) for page in pages] == [100, 100, 50]  # one read a request: a target page of 100 devices
    assert [device_id for page in pages for device_id in page] == ids
    sizes, cursor = [], None
    while True:  # ending on a short page's last entry: no empty page after it
        found, cursor = jobs.executions("j1", None, 50, cursor)
        sizes.append(len(found))
        if cursor is None:
            break
    assert sizes == [50] * 5
    for number in range(3):
        rig.jobs.create(parse({"jobId": f"other-{number}", "desired": {"mode": "eco"}, "deviceIds": ids[:1]},
                              time.time()))
    listed, cursor, requests = [], None, 0
    while True:
        found, cursor = jobs.list("IN_PROGRESS", 2, cursor)
        listed += [job["jobId"] for job in found]
        requests += 1
        if cursor is None:
            break
    assert sorted(listed) == ["j1", "other-0", "other-1", "other-2"] and requests >= 2
    assert jobs.list("COMPLETED", 2)[0] == [] and jobs.list("COMPLETED", 2)[1] is not None  # none in 1 read: go on


def test_no_write_begins_after_the_jobs_end(rig):
    """A paced batch claims the writes due over its next 10 s; the job ends 3 s after its first:
    the writes whose turn comes later do not begin (they are CANCELED at the stop), where the
    batch went on writing up to 10 s past endsAt."""
    import datetime

    ids = rig.devices(10)
    ends = time.time() + 3
    rig.job(deviceIds=ids, timeoutSeconds=1, rollout={"maxPerMinute": 60},
            endsAt=datetime.datetime.fromtimestamp(ends, datetime.timezone.utc).isoformat().replace("+00:00", "Z"))
    run_until_done(rig.runner(), seconds=30)
    _, found = rig.versions(ids)
    marks = [job_marks.mark_of(found[device_id], "j1") for device_id in ids]
    begun = [deadline_ms - 1000 for _, deadline_ms in filter(None, marks)]  # the write's time: its deadline less 1 s
    assert 1 <= len(begun) < 10 and max(begun) <= ends * 1000 + 1000, (begun, ends)  # within a write's second
    counts = rig.counts_agree_with_executions()
    assert counts["CANCELED"] == 10 - len(begun) and counts["TIMED_OUT"] == len(begun)
