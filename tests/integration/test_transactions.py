"""Multi-device all-or-nothing transactions (both engines; concurrency on DynamoDB Local)."""

from __future__ import annotations

import random
import threading

import pytest
from boto3.dynamodb.conditions import Attr
from botocore.exceptions import ReadTimeoutError

from functions.device_state import (
    DeviceNotFound,
    DeviceStateManager,
    IdempotencyKey,
    InvalidTransaction,
    JsonPatch,
    MergePatch,
    Operation,
    RetriesExhausted,
    TransactionFailed,
    TransactionTooLarge,
)
from functions.device_state import transactions as tx
from tests.helpers import RecordingClient

PLUS_ONE = JsonPatch([{"op": "increment", "path": "/n", "value": 1}])


def test_every_kind_of_operation_in_one_transaction(manager):
    manager.create("upd", {"n": 1})
    manager.create("rep", {"old": True})
    manager.create("put-existing", {"v": 1})
    manager.create("del", {"bye": True})
    manager.create("chk", {"online": True})
    devices = manager.transact([
        Operation.create("new", {"fresh": True}),
        Operation.put("put-new", {"v": 0}),
        Operation.put("put-existing", {"v": 2}),
        Operation.replace("rep", {"old": False}, expected_version=1),
        Operation.update("upd", PLUS_ONE),
        Operation.delete("del", expected_version=1),
        Operation.check("chk", expected_version=1, condition=Attr("state.online").eq(True)),
    ])
    assert [(d.device_id, d.version) for d in devices] == [
        ("new", 1), ("put-new", 1), ("put-existing", 2), ("rep", 2), ("upd", 2), ("del", 1), ("chk", 1)]
    assert manager.get("upd").state == {"n": 2}
    assert manager.get("rep").state == {"old": False}
    assert manager.get("put-existing").state == {"v": 2}
    with pytest.raises(DeviceNotFound):
        manager.get("del")
    assert manager.get("chk").version == 1


def test_one_failing_condition_among_50_leaves_all_unchanged_and_is_named(manager):
    for index in range(50):
        manager.create(f"lamp-{index}", {"power": "on"})
    manager.replace("lamp-37", {"power": "on"})  # now at version 2
    operations = [Operation.update(f"lamp-{index}", MergePatch({"power": "off"}), expected_version=1)
                  for index in range(50)]
    with pytest.raises(TransactionFailed) as caught:
        manager.transact(operations)
    [failure] = caught.value.failures
    assert (failure.index, failure.device_id, failure.reason) == (37, "lamp-37", tx.VERSION)
    assert failure.current.version == 2
    assert all(manager.get(f"lamp-{index}").state == {"power": "on"} for index in range(50))


def test_failures_are_reported_per_operation_with_their_reasons(manager):
    manager.create("exists", {})
    manager.create("guarded", {"mode": "off"})
    manager.create("counter", {"n": 0})
    with pytest.raises(TransactionFailed) as caught:
        manager.transact([
            Operation.update("missing", PLUS_ONE),
            Operation.create("exists", {}),
            Operation.update("guarded", JsonPatch([{"op": "test", "path": "/mode", "value": "on"}])),
            Operation.update("counter", JsonPatch([{"op": "remove", "path": "/nope"}])),
        ])
    assert [(f.index, f.reason) for f in caught.value.failures] == [
        (0, tx.NOT_FOUND), (1, tx.EXISTS), (2, tx.TEST_FAILED), (3, tx.NOT_APPLICABLE)]
    assert manager.get("counter").version == 1


def test_a_business_condition_failing_at_write_time(manager):
    manager.create("a", {"n": 1})
    manager.create("b", {"stock": 0})
    with pytest.raises(TransactionFailed) as caught:
        manager.transact([Operation.update("a", PLUS_ONE),
                          Operation.check("b", condition=Attr("state.stock").gt(0))])
    assert [(f.index, f.reason) for f in caught.value.failures] == [(1, tx.CONDITION)]
    assert manager.get("a").state == {"n": 1}


def test_limits_are_refused_before_any_request(engine):
    client, name = engine
    spy = RecordingClient(client)
    manager = DeviceStateManager(spy, name)
    with pytest.raises(InvalidTransaction):
        manager.transact([Operation.put(f"d-{index}", {}) for index in range(101)])
    with pytest.raises(InvalidTransaction):
        manager.transact([Operation.put(f"d-{index}", {}) for index in range(100)],
                         idempotency=IdempotencyKey("k"))  # the record is the 101st action
    with pytest.raises(InvalidTransaction):
        manager.transact([Operation.put("same", {}), Operation.delete("same")])
    with pytest.raises(InvalidTransaction):
        manager.transact([])
    assert spy.calls == []


def test_an_oversized_transaction_is_refused_before_any_write(engine):
    client, name = engine
    spy = RecordingClient(client)
    manager = DeviceStateManager(spy, name)
    with pytest.raises(TransactionTooLarge):
        manager.transact([Operation.put(f"big-{index}", {"blob": "x" * 300_000}) for index in range(15)])
    assert spy.writes == []


def test_a_moved_version_without_expectation_is_retried_on_the_newer_state(engine):
    client, name = engine
    manager = DeviceStateManager(client, name)
    rival = DeviceStateManager(client, name)
    manager.create("a", {"n": 0})
    manager.create("b", {"n": 0})
    fired = []

    def rival_first(params, **kwargs):
        if not fired:
            fired.append(1)
            rival.replace("a", {"n": 100})

    client.meta.events.register("provide-client-params.dynamodb.TransactWriteItems", rival_first)
    try:
        devices = manager.transact([Operation.update("a", PLUS_ONE), Operation.update("b", PLUS_ONE)])
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb.TransactWriteItems", rival_first)
    assert [d.state for d in devices] == [{"n": 101}, {"n": 1}]
    assert manager.get("a").state == {"n": 101}


def test_contention_that_never_ends_is_exhaustion_with_nothing_written(engine):
    client, name = engine
    manager = DeviceStateManager(client, name, max_attempts=3)
    rival = DeviceStateManager(client, name)
    manager.create("a", {"n": 0})
    manager.create("b", {"n": 0})

    def rival_first(params, **kwargs):
        rival.replace("a", {"n": -1})

    client.meta.events.register("provide-client-params.dynamodb.TransactWriteItems", rival_first)
    try:
        with pytest.raises(RetriesExhausted):
            manager.transact([Operation.update("a", PLUS_ONE), Operation.update("b", PLUS_ONE)])
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb.TransactWriteItems", rival_first)
    assert manager.get("b").state == {"n": 0}


def test_a_transaction_whose_answer_is_lost_is_resent_with_its_token_and_applies_once(engine):
    client, name = engine

    class LosesFirstResponse(RecordingClient):
        lost = False

        def __getattr__(self, attribute):
            call = super().__getattr__(attribute)
            if attribute != "transact_write_items":
                return call

            def once(**kwargs):
                result = call(**kwargs)
                if not LosesFirstResponse.lost:
                    LosesFirstResponse.lost = True
                    raise ReadTimeoutError(endpoint_url="http://dynamodb")
                return result

            return once

    manager = DeviceStateManager(LosesFirstResponse(client), name)
    manager.create("a", {"n": 0})
    manager.create("b", {"n": 0})
    key = IdempotencyKey("scene-1", "transaction", "f")
    operations = [Operation.update("a", PLUS_ONE), Operation.update("b", PLUS_ONE)]
    first = manager.transact(operations, idempotency=key)  # lost, resent with the same token: applied once
    assert [d.state for d in first] == [{"n": 1}, {"n": 1}]
    replayed = manager.transact(operations, idempotency=key)
    assert all(device.replayed for device in replayed)
    assert [d.state for d in replayed] == [{"n": 1}, {"n": 1}]
    assert manager.get("a").state == {"n": 1} and manager.get("b").state == {"n": 1}


# ------------------------------------------------------------- concurrency

DEVICES = [f"acct-{index}" for index in range(6)]
START = 100


def transfer(source_to_target):
    source, target = source_to_target
    return [Operation.update(source, JsonPatch([{"op": "increment", "path": "/n", "value": -1}])),
            Operation.update(target, JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))]


def run_mix(transfer_once, increment_once):
    """Four threads of 12 transfers and two of 12 increments, started together. Returns
    each device's value as the writes that returned say it must be."""
    barrier = threading.Barrier(6)
    deltas, lock = [], threading.Lock()

    def transfers(seed):
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(12):
            source, target = rng.sample(DEVICES, 2)
            transfer_once((source, target))
            with lock:
                deltas.extend([(source, -1), (target, 1)])

    def patches(seed):
        rng = random.Random(seed)
        barrier.wait()
        for _ in range(12):
            device = rng.choice(DEVICES)
            increment_once(device)
            with lock:
                deltas.append((device, 1))

    threads = [threading.Thread(target=transfers, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=patches, args=(100 + n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {device: START + sum(delta for name, delta in deltas if name == device) for device in DEVICES}


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_transfers_conserve_the_sum_while_patches_run(local_table):
    client, name = local_table
    manager = DeviceStateManager(client, name, max_attempts=50, budget_seconds=30)
    for device in DEVICES:
        manager.create(device, {"n": START})
    expected = run_mix(lambda pair: manager.transact(transfer(pair)),
                       lambda device: manager.update_with_retry(device, PLUS_ONE))
    assert {device: manager.get(device).state["n"] for device in DEVICES} == expected
    versions = sum(manager.get(device).version - 1 for device in DEVICES)
    increments = sum(expected.values()) - START * len(DEVICES)
    assert versions == 4 * 12 * 2 + increments  # every write counted exactly once


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_naive_transfers_in_the_same_harness_lose_writes(local_table):
    client, name = local_table
    manager = DeviceStateManager(client, name)
    for device in DEVICES:
        manager.create(device, {"n": START})

    # Every naive write waits until all six threads have read: the other writers land in
    # between on every round, however the machine schedules the threads.
    read_all = threading.Barrier(6)

    def naive_transfer(pair):
        source, target = (manager.get(device) for device in pair)
        read_all.wait()
        manager.replace(source.device_id, {"n": source.state["n"] - 1})  # unconditional, one by one
        manager.replace(target.device_id, {"n": target.state["n"] + 1})

    def naive_increment(device):
        current = manager.get(device)
        read_all.wait()
        manager.replace(device, {"n": current.state["n"] + 1})

    expected = run_mix(naive_transfer, naive_increment)
    assert {device: manager.get(device).state["n"] for device in DEVICES} != expected
