"""Device leases: FIFO order, mutual exclusion, crash recovery and fencing, waits and
release. Single-threaded behaviour on both engines; everything with real threads on
DynamoDB Local only."""

from __future__ import annotations

import dataclasses
import threading
import time
from decimal import Decimal

import pytest

from functions.device_state import (
    DeviceLocked,
    DeviceNotFound,
    DeviceStateManager,
    InvalidLease,
    JsonPatch,
    LeaseBusy,
    LeaseLost,
    LeaseNotHeld,
    MergePatch,
    StorageUnavailable,
    UnknownLease,
    UpdateObserver,
)
from functions.device_state import table
from functions.device_state.client import dynamodb_client
from functions.device_state.leases.queue import LeaseQueue
from localdev.faults import Forwarder
from tests.helpers import RecordingClient


class LeaseEvents(UpdateObserver):
    def __init__(self):
        self.acquired, self.busy, self.reclaimed, self.lost = [], 0, 0, 0

    def lease_acquired(self, device_id, waited):
        self.acquired.append(waited)

    def lease_busy(self, device_id):
        self.busy += 1

    def lease_reclaimed(self, device_id, rows):
        self.reclaimed += rows

    def lease_lost(self, device_id):
        self.lost += 1


def lease_rows(client, name, device_id="lamp-1"):
    return client.query(
        TableName=name, ConsistentRead=True,
        KeyConditionExpression="deviceId = :d AND begins_with(sk, :p)",
        ExpressionAttributeValues={":d": {"S": device_id}, ":p": {"S": table.LEASE_SK_PREFIX}},
    )["Items"]


@pytest.fixture
def lamp(manager):
    manager.create("lamp-1", {"power": "on", "n": 0})
    return manager


# ------------------------------------------------------------- both engines


def test_a_lease_needs_an_existing_device_and_sane_numbers(manager):
    with pytest.raises(DeviceNotFound):
        manager.lease("nope").acquire()
    manager.create("lamp-1", {})
    for bad in (0, 901, "x"):
        with pytest.raises(InvalidLease):
            manager.lease("lamp-1", ttl_seconds=bad)
    for wait_seconds in (-1, "abc", None, True, float("nan"), Decimal("NaN"), 10 ** 400):
        with pytest.raises(InvalidLease):
            manager.lease_queue().acquire("lamp-1", 10, wait_seconds=wait_seconds)
    for owner in (5, {"a": 1}, "", "o" * 129):  # before anything is sent: no ticket drawn for them
        with pytest.raises(InvalidLease):
            manager.lease_queue().acquire("lamp-1", 10, owner=owner)
    lease = manager.lease("lamp-1", owner="o" * 128).acquire()
    assert lease.fencing_token == 1
    with pytest.raises(TypeError, match="a Lease or its lease token"):
        manager.fenced({"lamp-1": lease.fencing_token})  # a number that orders leases, no token
    with pytest.raises(InvalidLease):
        manager.lease_queue().heartbeat("lamp-1", "not-a-lease-id")


def test_tickets_are_increasing_fencing_tokens_and_status_names_the_holder(lamp, engine):
    first = lamp.lease("lamp-1", ttl_seconds=30, owner="firmware-job").acquire()
    status = lamp.lease_queue().status("lamp-1")
    assert (status.holder_token, status.holder_owner, status.waiting) == (first.fencing_token, "firmware-job", 0)
    assert status.holder_expires_at == pytest.approx(time.time() + 30, abs=5)
    assert first.release() is True
    assert lamp.lease_queue().status("lamp-1").holder_token is None
    second = lamp.lease("lamp-1").acquire()
    assert second.fencing_token > first.fencing_token
    second.release()
    assert lease_rows(*engine) == []


def test_no_wait_fails_at_once_and_withdraws_its_ticket(lamp, engine):
    events = LeaseEvents()
    lamp = DeviceStateManager(lamp.client, lamp.table_name, observer=events)
    holder = lamp.lease("lamp-1", ttl_seconds=30).acquire()
    started = time.monotonic()
    with pytest.raises(LeaseBusy) as busy:
        lamp.lease("lamp-1", wait_seconds=0).acquire()
    assert time.monotonic() - started < 2
    assert busy.value.holder_expires_at == pytest.approx(holder.expires_at, abs=0.01)
    assert events.busy == 1
    assert [int(row["ticket"]["N"]) for row in lease_rows(*engine)] == [holder.fencing_token]
    holder.release()


def test_a_bounded_wait_gives_up_after_the_wait_and_withdraws(lamp, engine):
    holder = lamp.lease("lamp-1", ttl_seconds=30).acquire()
    started = time.monotonic()
    with pytest.raises(LeaseBusy):
        lamp.lease("lamp-1", wait_seconds=0.4).acquire()
    assert time.monotonic() - started >= 0.4
    assert len(lease_rows(*engine)) == 1
    holder.release()


def test_a_wait_counts_from_the_call_so_a_slow_first_read_spends_it_too(lamp):
    """The route's wait is what is left of the Lambda's time: counted from after the device's
    first read, a read that took long (DynamoDB stalling) ran the request past it (found by a
    hostile review: 30 to 33 s against the function's 28). A fake clock: the first read takes 10 s."""
    holder = lamp.lease("lamp-1", ttl_seconds=30).acquire()
    now, slept = [0.0], []

    class SlowFirstRead(RecordingClient):
        def get_item(self, **request):
            if "get_item" not in self.calls:
                now[0] += 10
            self.calls.append("get_item")
            return lamp.client.get_item(**request)

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    waiter = DeviceStateManager(SlowFirstRead(lamp.client), lamp.table_name, monotonic=lambda: now[0], sleep=sleep)
    with pytest.raises(LeaseBusy):
        waiter.lease("lamp-1", wait_seconds=5).acquire()
    assert sum(slept) < 1, slept  # the 5 s were gone with the read: no waiting after it
    holder.release()


def test_writes_to_a_leased_device_need_the_holders_token(lamp):
    lease = lamp.lease("lamp-1", ttl_seconds=30).acquire()
    refused = [
        lambda m: m.update_with_retry("lamp-1", MergePatch({"power": "off"})),
        lambda m: m.update_with_retry("lamp-1", JsonPatch([{"op": "increment", "path": "/n", "value": 1}])),
        lambda m: m.update_with_retry("lamp-1", lambda state: {**state, "x": 1}),
        lambda m: m.update("lamp-1", MergePatch({"power": "off"}), expected_version=1),
        lambda m: m.replace("lamp-1", {"power": "off"}),
        lambda m: m.replace("lamp-1", {"power": "off"}, expected_version=1),
        lambda m: m.put("lamp-1", {"power": "off"}),
        lambda m: m.delete("lamp-1"),
    ]
    for write in refused:
        with pytest.raises(DeviceLocked) as locked:
            write(lamp)
        assert locked.value.lease_expires_at == pytest.approx(lease.expires_at, abs=0.01)
        with pytest.raises(DeviceLocked):
            write(lamp.fenced({"lamp-1": "0" * 32}))  # a guessed token opens nothing
        with pytest.raises(DeviceLocked):
            write(lamp.fenced({"lamp-1": str(lease.fencing_token)}))  # nor does the public fencing token
    assert lamp.get("lamp-1").version == 1  # nothing was written
    fenced = lease.manager
    fenced.update_with_retry("lamp-1", JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))
    fenced.update_with_retry("lamp-1", MergePatch({"power": "off"}))
    device = lamp.fenced({"lamp-1": lease.lease_token}).replace("lamp-1", {"power": "dim", "n": 1})
    assert (device.version, device.state) == (4, {"power": "dim", "n": 1})
    lease.release()
    with pytest.raises(LeaseNotHeld):
        fenced.fenced({"lamp-1": lease.lease_token}).replace("lamp-1", {})
    with pytest.raises(LeaseLost):
        fenced.replace("lamp-1", {})  # the Lease itself knows it was released
    assert lamp.replace("lamp-1", {"power": "on"}).version == 5  # free again


def test_heartbeat_extends_and_a_released_lease_cannot_be_heartbeated(lamp):
    events = LeaseEvents()
    lamp = DeviceStateManager(lamp.client, lamp.table_name, observer=events)
    lease = lamp.lease("lamp-1", ttl_seconds=5).acquire()
    before = lease.expires_at
    time.sleep(0.05)
    lease.heartbeat()
    assert lease.expires_at > before
    queue = lamp.lease_queue()
    grant = queue.heartbeat("lamp-1", lease.lease_id, ttl_seconds=100)
    assert grant.expires_at == pytest.approx(time.time() + 100, abs=5)
    assert queue.status("lamp-1").holder_expires_at == pytest.approx(grant.expires_at, abs=0.01)
    lease.release()
    with pytest.raises(LeaseLost):
        queue.heartbeat("lamp-1", lease.lease_id)
    with pytest.raises(LeaseLost):
        lease.heartbeat()
    assert events.lost == 2
    assert queue.release("lamp-1", lease.lease_id) is False  # already gone: nothing to do
    forged = f"{lease.fencing_token}.{'0' * 32}"
    with pytest.raises(LeaseLost):
        queue.heartbeat("lamp-1", forged)


def test_the_context_manager_releases_on_an_exception(lamp, engine):
    with pytest.raises(RuntimeError):
        with lamp.lease("lamp-1", ttl_seconds=30) as lease:
            lease.manager.update_with_retry("lamp-1", MergePatch({"power": "off"}))
            raise RuntimeError("the job failed")
    assert lamp.lease_queue().status("lamp-1").holder_token is None
    assert lease_rows(*engine) == []
    assert lamp.update_with_retry("lamp-1", MergePatch({"power": "on"})).version == 3


def test_expired_rows_are_ignored_at_once_and_reaped(lamp, engine):
    events = LeaseEvents()
    lamp = DeviceStateManager(lamp.client, lamp.table_name, observer=events)
    crashed = lamp.lease("lamp-1", ttl_seconds=1).acquire()  # never heartbeats, never releases
    time.sleep(1.1)
    # expiresAt (TTL) has passed or is about to, but neither engine deletes anything: the row is still there.
    assert len(lease_rows(*engine)) == 1
    lamp.update_with_retry("lamp-1", MergePatch({"power": "off"}))  # the device is free again
    lease = lamp.lease("lamp-1", wait_seconds=0).acquire()
    assert lease.fencing_token > crashed.fencing_token
    assert events.reclaimed == 1
    assert [int(row["ticket"]["N"]) for row in lease_rows(*engine)] == [lease.fencing_token]
    lease.release()


def test_a_transaction_on_a_leased_device_needs_its_token(lamp):
    from functions.device_state import Operation, TransactionFailed

    lamp.create("lamp-2", {"n": 0})
    lease = lamp.lease("lamp-1", ttl_seconds=30).acquire()
    operations = [Operation.update("lamp-1", MergePatch({"n": 1})), Operation.update("lamp-2", MergePatch({"n": 1}))]
    with pytest.raises(TransactionFailed) as failed:
        lamp.transact(operations)
    assert [(f.index, f.reason) for f in failed.value.failures] == [(0, "locked")]
    # refused before it is sent (a version another operation names has moved): the lease is named too,
    # not found only once the version is put right and the transaction sent again (a hostile review)
    stale = [operations[0], Operation.update("lamp-2", MergePatch({"n": 1}), expected_version=9)]
    with pytest.raises(TransactionFailed) as failed:
        lamp.transact(stale)
    assert [(f.index, f.reason) for f in failed.value.failures] == [(0, "locked"), (1, "version")]
    devices = lamp.fenced({"lamp-1": lease.lease_token}).transact(operations)
    assert [d.version for d in devices] == [2, 2]
    lease.release()


# ------------------------------------------------------- real threads, DynamoDB Local

concurrent = [pytest.mark.dynamodb_local, pytest.mark.concurrency]


@pytest.fixture
def local_manager(local_table):
    client, name = local_table
    manager = DeviceStateManager(client, name)
    manager.create("lamp-1", {"n": 0})
    return manager


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_waiters_acquire_in_the_order_they_queued(local_manager):
    holder = local_manager.lease("lamp-1", ttl_seconds=30).acquire()
    order, errors = [], []
    queue = local_manager.lease_queue()

    def waiter(index):
        try:
            with local_manager.lease("lamp-1", ttl_seconds=10, wait_seconds=20) as lease:
                order.append(index)
                lease.manager.update_with_retry("lamp-1", lambda state: {**state, "order": state.get("order", []) + [index]})
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = []
    for index in range(5):
        thread = threading.Thread(target=waiter, args=(index,))
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 10
        while queue.status("lamp-1").waiting < index + 1:  # queued before the next one starts
            assert time.monotonic() < deadline
            time.sleep(0.01)
    holder.release()
    for thread in threads:
        thread.join()
    assert errors == []
    assert order == [0, 1, 2, 3, 4]
    assert local_manager.get("lamp-1").state["order"] == [0, 1, 2, 3, 4]


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_a_waiter_whose_lease_is_short_keeps_its_place_however_long_it_waits(local_manager):
    """A waiting row lives no longer than the lease asked for (here 1 s) and is refreshed at each
    half of its life. Refreshed every 2.5 s whatever its life, it ran out under its waiter: the
    waiter behind went first and the first was told its lease was gone."""
    holder = local_manager.lease("lamp-1", ttl_seconds=30).acquire()
    queue, order, errors = local_manager.lease_queue(), [], []

    def waiter(name, ttl_seconds):
        try:
            with local_manager.lease("lamp-1", ttl_seconds=ttl_seconds, wait_seconds=20):
                order.append(name)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = []
    for name, ttl_seconds in (("short", 1), ("long", 30)):
        threads.append(threading.Thread(target=waiter, args=(name, ttl_seconds)))
        threads[-1].start()
        deadline = time.monotonic() + 10
        while queue.status("lamp-1").waiting < len(threads):  # queued before the next one starts
            assert time.monotonic() < deadline
            time.sleep(0.01)
    time.sleep(3)  # past the short row's life, and past the 2.5 s its refresh once waited
    assert queue.status("lamp-1").waiting == 2
    holder.release()
    for thread in threads:
        thread.join()
    assert errors == [] and order == ["short", "long"], (errors, order)


def _counter_run(manager, use_lease: bool, threads: int = 6, rounds: int = 4) -> int:
    """Each thread does read, sleep, blind write (no version check) of a counter."""
    barrier = threading.Barrier(threads)
    errors = []

    def bump(writer):
        current = writer.get("lamp-1").state["n"]
        time.sleep(0.01)  # the critical section takes a while
        writer.replace("lamp-1", {"n": current + 1})

    def worker():
        barrier.wait()
        try:
            for _ in range(rounds):
                if use_lease:
                    with manager.lease("lamp-1", ttl_seconds=10, wait_seconds=60) as lease:
                        bump(lease.manager)
                else:
                    bump(manager)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert errors == []
    return manager.get("lamp-1").state["n"]


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_a_lease_gives_mutual_exclusion_and_the_control_without_one_loses_increments(local_manager):
    assert _counter_run(local_manager, use_lease=True) == 24
    local_manager.replace("lamp-1", {"n": 0})
    assert _counter_run(local_manager, use_lease=False) < 24  # the control: read-sleep-write loses updates


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_a_crashed_holder_is_overtaken_right_after_expiry_and_fenced_off(local_manager):
    crashed = local_manager.lease("lamp-1", ttl_seconds=2).acquire()  # then stops: no heartbeat
    acquired = {}

    def next_in_line():
        lease = local_manager.lease("lamp-1", ttl_seconds=30, wait_seconds=15).acquire()
        acquired["at"], acquired["lease"] = time.time(), lease

    thread = threading.Thread(target=next_in_line)
    thread.start()
    thread.join()
    lease = acquired["lease"]
    # It proceeded right after the crashed holder's expiry, not a further lease period later.
    assert crashed.expires_at <= acquired["at"] < crashed.expires_at + 1.0
    # The stale holder wakes up and writes with its old token: refused, nothing written.
    with pytest.raises(DeviceLocked):
        local_manager.fenced({"lamp-1": crashed.lease_token}).replace("lamp-1", {"n": 666})
    with pytest.raises(LeaseLost):
        crashed.heartbeat()
    assert local_manager.get("lamp-1").state == {"n": 0}
    lease.manager.replace("lamp-1", {"n": 1})
    lease.release()


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_the_background_heartbeat_keeps_a_long_job_its_lease(local_manager):
    # A ttl of 2 s: heartbeats at ttl/2 leave ttl/2 for a heartbeat to be written. At 1 s that
    # was 0.5 s, which a DynamoDB Local write and a thread's wake-up outran once under the full
    # suite on 2 cores (the lease lapsed and was granted to the next caller).
    with local_manager.lease("lamp-1", ttl_seconds=2) as lease:
        time.sleep(4.4)  # more than two ttls: only heartbeats keep it
        with pytest.raises(LeaseBusy):
            local_manager.lease("lamp-1", wait_seconds=0).acquire()
        lease.manager.replace("lamp-1", {"n": 1})
    assert lease.lost  # released: nothing more may be written under it
    assert local_manager.get("lamp-1").state == {"n": 1}


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_a_slow_heartbeat_answer_does_not_push_the_next_heartbeat_later(local_manager, monkeypatch):
    """Each heartbeat's answer comes 0.8 s after its write (a slow network): the next heartbeat
    still goes ttl/2 after the last one was sent, not ttl/2 after its answer, which left
    ttl/2 - 0.8 s for the next one to land (with ttl 2: 1.8 s between heartbeats, the lease
    extended to 2 s after each)."""
    sent, heartbeat = [], LeaseQueue.heartbeat

    def slow_answer(self, *args, **kwargs):
        sent.append(time.monotonic())
        grant = heartbeat(self, *args, **kwargs)
        time.sleep(0.8)
        return grant

    monkeypatch.setattr(LeaseQueue, "heartbeat", slow_answer)
    with local_manager.lease("lamp-1", ttl_seconds=2):
        time.sleep(4.2)
    gaps = [later - earlier for earlier, later in zip(sent, sent[1:])]
    assert len(sent) >= 3 and all(0.9 <= gap < 1.6 for gap in gaps), gaps  # 1.8 s when counted from the answer


# ---- Issue 27 row 4: ending a lease or a waiting ticket that is not ours (by its fencing token).

def test_ending_a_holders_lease_frees_the_device_and_the_holder_learns_at_its_next_heartbeat(lamp):
    holder = lamp.lease("lamp-1", ttl_seconds=600, wait_seconds=0, owner="device").acquire()
    with pytest.raises(DeviceLocked):
        lamp.replace("lamp-1", {"n": 1})
    assert lamp.lease_queue().end("lamp-1", holder.fencing_token) is True
    assert lamp.lease_queue().status("lamp-1").holder_token is None
    lamp.replace("lamp-1", {"n": 1})  # the fence opened with the end, not at the lease's expiry
    with pytest.raises(LeaseLost):
        holder.heartbeat()
    assert holder.lost
    with pytest.raises(LeaseLost):
        holder.manager.replace("lamp-1", {"n": 666})
    with pytest.raises(LeaseNotHeld):  # its token alone, written by a client that did not hear
        lamp.fenced({"lamp-1": holder.lease_token}).replace("lamp-1", {"n": 666})
    assert lamp.get("lamp-1").state == {"n": 1}
    assert lamp.lease_queue().end("lamp-1", holder.fencing_token) is False  # ended already
    with pytest.raises(UnknownLease):
        lamp.lease_queue().end("lamp-1", holder.fencing_token + 1)  # never drawn
    assert holder.release() is False


def _queue_until(queue, waiting, seconds=10):
    deadline = time.monotonic() + seconds
    while len(queue.status("lamp-1").queue) < waiting:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return queue.status("lamp-1")


def _end_a_waiting_ticket(manager):
    """A holder, two waiters; the first waiter's ticket is ended, then the holder's lease.
    Returns (what each waiter got, by name)."""
    queue = manager.lease_queue()
    holder = manager.lease("lamp-1", ttl_seconds=30).acquire()
    got = {}

    def waiter(name):
        try:
            got[name] = manager.lease("lamp-1", ttl_seconds=5, wait_seconds=15, owner=name).acquire()
        except Exception as error:  # noqa: BLE001 - what it got is the result
            got[name] = error

    threads = []
    for name in ("first", "second"):
        threads.append(threading.Thread(target=waiter, args=(name,)))
        threads[-1].start()
        status = _queue_until(queue, len(threads))
    assert [owner for _, owner in status.queue] == ["first", "second"]
    assert status.holder_token == holder.fencing_token and status.waiting == 2
    assert queue.end("lamp-1", status.queue[0][0]) is True
    time.sleep(3)  # past the first waiter's next row refresh (every 2.5 s)
    queue.end("lamp-1", holder.fencing_token)
    for thread in threads:
        thread.join()
    return got


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_an_ended_waiting_ticket_stops_waiting_and_the_next_waiter_takes_the_lease(local_manager):
    got = _end_a_waiting_ticket(local_manager)
    assert isinstance(got["first"], LeaseLost), got
    assert local_manager.lease_queue().status("lamp-1").holder_token == got["second"].fencing_token


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_control_a_waiter_that_refreshes_its_row_blindly_comes_back_after_it_was_ended(local_manager, monkeypatch):
    monkeypatch.setattr(LeaseQueue, "_still_ours", staticmethod(lambda secret: {}))
    got = _end_a_waiting_ticket(local_manager)
    assert not isinstance(got["first"], Exception), got  # its ended ticket came back and took the lease
    # The second waiter got it only once the first one's lease ran out unheartbeated.
    assert got["second"].fencing_token > got["first"].fencing_token
    assert got["second"].expires_at >= got["first"].expires_at + 4


def _overtaken_waiter(manager, a_manager=None, before_a_queues=None) -> tuple:
    """Two acquires together: A draws ticket 1 and B ticket 2, but B's queue row is put first, so B
    finds nobody ahead and takes the lease; A's row lands after (``before_a_queues(b)`` runs just
    before). Unless that released B, B releases once A waits. Returns (A's lease or error, B's
    lease). ``a_manager``: A's own (through a fault forwarder, say)."""
    a_drew, b_holds = threading.Event(), threading.Event()
    put_row = LeaseQueue._put_row

    def held_put_row(queue, device_id, ticket, *rest, first=False):
        if first and threading.current_thread().name == "A" and not b_holds.is_set():
            a_drew.set()
            assert b_holds.wait(10)
        return put_row(queue, device_id, ticket, *rest, first=first)

    got = {}

    def a():
        try:
            got["A"] = (a_manager or manager).lease("lamp-1", ttl_seconds=30, wait_seconds=15).acquire()
        except Exception as error:  # noqa: BLE001 - returned to the test
            got["A"] = error

    LeaseQueue._put_row = held_put_row
    try:
        thread = threading.Thread(target=a, name="A")
        thread.start()
        assert a_drew.wait(10)
        b = manager.lease("lamp-1", ttl_seconds=30).acquire()
        if before_a_queues:
            before_a_queues(b)
        b_holds.set()
        if before_a_queues is None:  # B still holds: released once A's row is in, behind it
            deadline = time.monotonic() + 10
            while manager.lease_queue().status("lamp-1").waiting < 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            b.release()
        thread.join(20)
    finally:
        LeaseQueue._put_row = put_row
    return got["A"], b


def _granted_after(a, b_token: int, manager) -> None:
    assert not isinstance(a, Exception), a
    assert a.fencing_token > b_token  # granted after B's lease: a token above B's
    assert manager.lease_queue().status("lamp-1").holder_token == a.fencing_token
    a.manager.update_with_retry("lamp-1", lambda state: {**state, "n": 1})  # its token opens the device
    a.release()
    manager.update_with_retry("lamp-1", lambda state: {**state, "n": 2})  # and no lease is left on it
    assert manager.lease_queue().status("lamp-1").holder_token is None
    item = manager.client.get_item(TableName=manager.table_name, Key=table.state_key("lamp-1"))["Item"]
    # No holder left for an earlier release to read as one (it fences on leaseToken); only the last ticket.
    assert not {"leaseToken", "leaseKey", "leaseUntil"} & set(item) and item["leaseLast"] == {"N": str(a.fencing_token)}


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_a_waiter_a_later_ticket_overtook_is_granted_a_higher_fencing_token(local_manager):
    a, b = _overtaken_waiter(local_manager)
    assert b.fencing_token == 2
    _granted_after(a, 2, local_manager)


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_a_waiter_overtaken_across_a_delete_and_create_takes_nothing_and_the_next_lease_a_higher_token(
        local_manager):
    """A drew its ticket on the device that was deleted and created again before its row was
    in: its queue ended with that device (DeviceNotFound, nothing held); a lease on the device
    created again gets a token above the one granted before the delete."""
    def release_delete_and_create(b):
        b.release()
        local_manager.delete("lamp-1")
        local_manager.create("lamp-1", {"n": 0})

    a, _ = _overtaken_waiter(local_manager, before_a_queues=release_delete_and_create)
    assert isinstance(a, DeviceNotFound), a
    assert local_manager.lease_queue().status("lamp-1").holder_token is None
    _granted_after(local_manager.lease("lamp-1", ttl_seconds=30).acquire(), 2, local_manager)


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
@pytest.mark.parametrize("between", [False, True], ids=["alone", "another-writer-between"])
def test_an_overtaken_waiter_whose_requeue_answer_is_lost_still_gets_the_lease(dynamodb_local, local_table, between):
    """The requeue (the old row deleted, the new one put) lands and its answer is lost, alone or
    with another client's write to the device landing before the resend: the store's resend is
    dropped by DynamoDB (the same ClientRequestToken), not refused as an ended row."""
    client, name = local_table
    manager = DeviceStateManager(client, name)
    manager.create("lamp-1", {"n": 0})
    other = (lambda: manager.update_with_retry("lamp-1", lambda state: {**state, "other": True})) if between else None
    forwarder = Forwarder(dynamodb_local.port)
    try:
        # The first request that deletes A's old row, in whatever form it is sent, lands unanswered.
        forwarder.lose("TransactWriteItems", when=lambda body: b'"Delete"' in body and b'"Put"' in body, then=other)
        forwarder.lose("DeleteItem", when=lambda body: b"lease#" in body, then=other)
        a, _ = _overtaken_waiter(manager, DeviceStateManager(dynamodb_client(forwarder.endpoint, "us-east-1"), name))
        assert len(forwarder.lost) == 1  # the requeue's answer was lost
    finally:
        forwarder.close()
    assert manager.get("lamp-1").state.get("other") is (True if between else None)
    _granted_after(a, 2, manager)


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_an_overtaken_waiter_whose_requeue_stays_unanswered_leaves_no_row_to_block_the_queue(dynamodb_local,
                                                                                             local_table):
    """Every answer to the requeue lost, after it landed: the acquire fails as storage unavailable
    (nothing it holds), and the row it may have put under its new ticket is withdrawn, not left to
    hold up the next waiter for the row's life."""
    client, name = local_table
    manager = DeviceStateManager(client, name)
    manager.create("lamp-1", {"n": 0})
    forwarder = Forwarder(dynamodb_local.port)
    try:
        forwarder.lose("TransactWriteItems", when=lambda body: b'"Delete"' in body and b'"Put"' in body, times=50)
        a, _ = _overtaken_waiter(manager, DeviceStateManager(dynamodb_client(forwarder.endpoint, "us-east-1"), name))
        assert forwarder.lost and isinstance(a, StorageUnavailable), a
    finally:
        forwarder.close()
    status = manager.lease_queue().status("lamp-1")
    assert status.holder_token is None and status.waiting == 0
    assert manager.lease("lamp-1", ttl_seconds=30).acquire().fencing_token > 2  # at once, nobody ahead


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_control_a_holder_that_forgets_the_last_ticket_granted_grants_a_lower_one_after_it(local_manager, monkeypatch):
    """The control: a release that also forgets the last ticket granted, as the first lease
    queue did (it kept none): A is then granted ticket 1 after B held ticket 2."""
    from functions.device_state.write.bookkeeping import BookkeepingRequests

    clear_lease = BookkeepingRequests.clear_lease

    def forgetting(planner, device_id, ticket):
        planned = clear_lease(planner, device_id, ticket)
        update = planned.request["Update"]
        forgot = {**update, "UpdateExpression": update["UpdateExpression"] + ", #lastTicket",
                  "ExpressionAttributeNames": {**update["ExpressionAttributeNames"], "#lastTicket": "leaseLast"}}
        return dataclasses.replace(planned, request={**planned.request, "Update": forgot})

    monkeypatch.setattr(BookkeepingRequests, "clear_lease", forgetting)
    a, b = _overtaken_waiter(local_manager)
    assert b.fencing_token == 2 and a.fencing_token == 1  # granted after B, with a lower token


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
@pytest.mark.parametrize("created_again", [False, True], ids=["deleted", "deleted-and-created-again"])
def test_a_waiter_on_a_device_its_holder_deletes_hears_so_within_a_refresh(local_manager, created_again):
    """The waiter went on counting the deleted holder's row (its wait read the device once): it
    waited out its whole wait and heard lease-busy, the device gone or created again and free
    (a hostile review). It reads the device at each refresh of its row. Its queue ended with the
    device: it was granted a lease on the device created again, locking it for the new device's
    writers, until the take named the incarnation it queued on (a later review)."""
    holder = local_manager.lease("lamp-1", ttl_seconds=120).acquire()
    outcome = {}

    def wait():
        started = time.monotonic()
        try:
            with local_manager.lease("lamp-1", ttl_seconds=5, wait_seconds=15) as lease:
                outcome["granted"] = lease.lease_token
        except Exception as error:  # noqa: BLE001 - asserted below
            outcome["error"] = error
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 10
    while local_manager.lease_queue().status("lamp-1").waiting < 1:  # queued behind the holder
        assert time.monotonic() < deadline
        time.sleep(0.02)
    local_manager.fenced({"lamp-1": holder.lease_token}).delete("lamp-1")
    if created_again:
        local_manager.create("lamp-1", {"n": 0})
    thread.join(30)
    assert outcome["seconds"] < 8, outcome  # a refresh is every 2.5 s here; the wait was 15
    assert isinstance(outcome.get("error"), DeviceNotFound), outcome
    if created_again:
        assert local_manager.lease_queue().status("lamp-1").holder_token is None
        assert local_manager.update_with_retry("lamp-1", MergePatch({"n": 1})).state == {"n": 1}  # nobody's lease


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_a_waiter_that_reaches_the_head_before_its_refresh_sees_the_device_created_again_takes_nothing(local_manager):
    """The take itself names the device the ticket queued on (its createdAt), so a waiter whose
    holder's row runs out before the waiter reads the device again (a long ttl: refreshes 15 s
    apart) does not take the lease on the device created in between."""
    holder = local_manager.lease("lamp-1", ttl_seconds=1).acquire()
    outcome = {}

    def wait():
        try:
            with local_manager.lease("lamp-1", ttl_seconds=60, wait_seconds=10) as lease:
                outcome["granted"] = lease.lease_token
        except Exception as error:  # noqa: BLE001 - asserted below
            outcome["error"] = error

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 10
    while local_manager.lease_queue().status("lamp-1").waiting < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    local_manager.fenced({"lamp-1": holder.lease_token}).delete("lamp-1")
    local_manager.create("lamp-1", {"n": 0})
    thread.join(30)
    assert isinstance(outcome.get("error"), DeviceNotFound), outcome
    assert local_manager.lease_queue().status("lamp-1").holder_token is None
