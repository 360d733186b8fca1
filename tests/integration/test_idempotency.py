"""Exactly-once keyed writes: the change and its idempotency record land together or not
at all; a retry with the same key replays. Both engines; races on DynamoDB Local only."""

from __future__ import annotations

import threading
import time

import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from functions.device_state import (
    DeviceNotFound,
    DeviceStateManager,
    IdempotencyKey,
    DeviceAlreadyExists,
    IdempotencyKeyReused,
    InvalidIdempotencyKey,
    JsonPatch,
    MergePatch,
    PatchTestFailed,
    VersionConflict,
)
from functions.device_state import Operation
from functions.device_state.write.keyed import RECORD_TTL_SECONDS, RecordedAnswers
from tests.helpers import RecordingClient

PLUS_ONE = JsonPatch([{"op": "increment", "path": "/n", "value": 1}])


def key(name="k-1", scope="PATCH", fingerprint="f-1"):
    return IdempotencyKey(name, scope, fingerprint)


@pytest.fixture
def manager_and_spy(engine):
    client, name = engine
    spy = RecordingClient(client)
    return DeviceStateManager(spy, name), spy


def test_a_keyed_update_applies_once_and_replays(manager):
    manager.create("c", {"n": 0})
    first = manager.update_with_retry("c", PLUS_ONE, idempotency=key())
    again = manager.update_with_retry("c", PLUS_ONE, idempotency=key())
    assert (first.version, first.state, first.replayed) == (2, {"n": 1}, False)
    assert (again.version, again.state, again.replayed) == (2, {"n": 1}, True)
    assert manager.get("c").version == 2


def test_replay_answers_the_original_result_even_after_other_writes(manager):
    manager.create("c", {"n": 0})
    first = manager.update_with_retry("c", PLUS_ONE, idempotency=key())
    manager.replace("c", {"n": 100})
    again = manager.update_with_retry("c", PLUS_ONE, idempotency=key())
    assert again == first and again.replayed
    assert manager.get("c").state == {"n": 100}


def test_same_key_with_a_different_request_is_refused_and_writes_nothing(manager):
    manager.create("c", {"n": 0})
    manager.update_with_retry("c", PLUS_ONE, idempotency=key(fingerprint="request-a"))
    with pytest.raises(IdempotencyKeyReused):
        manager.update_with_retry("c", PLUS_ONE, idempotency=key(fingerprint="request-b"))
    assert manager.get("c").state == {"n": 1}


def test_keys_are_scoped_to_the_device_and_the_operation(manager):
    manager.create("a", {"n": 0})
    manager.create("b", {"n": 0})
    manager.update_with_retry("a", PLUS_ONE, idempotency=key())
    manager.update_with_retry("b", PLUS_ONE, idempotency=key())
    manager.replace("a", {"n": 10}, idempotency=key(scope="PUT"))
    assert manager.get("a").state == {"n": 10} and manager.get("b").state == {"n": 1}


def test_a_failed_request_records_nothing_so_a_retry_is_tried_again(manager):
    manager.create("c", {"n": 0, "mode": "off"})
    guarded = JsonPatch([{"op": "test", "path": "/mode", "value": "on"},
                         {"op": "increment", "path": "/n", "value": 1}])
    with pytest.raises(PatchTestFailed):
        manager.update_with_retry("c", guarded, idempotency=key())
    with pytest.raises(VersionConflict):
        manager.update("c", guarded, expected_version=7, idempotency=key())
    with pytest.raises(DeviceNotFound):
        manager.update_with_retry("ghost", guarded, idempotency=key())
    manager.replace("c", {"n": 0, "mode": "on"})
    applied = manager.update_with_retry("c", guarded, idempotency=key())
    assert applied.state == {"n": 1, "mode": "on"} and not applied.replayed


def test_an_expired_record_counts_as_new(engine):
    client, name = engine
    now = [time.time()]
    manager = DeviceStateManager(client, name, clock=lambda: now[0])
    manager.create("c", {"n": 0})
    manager.update_with_retry("c", PLUS_ONE, idempotency=key())
    now[0] += RECORD_TTL_SECONDS + 1  # a day later; TTL may not have deleted the record yet
    again = manager.update_with_retry("c", PLUS_ONE, idempotency=key())
    assert not again.replayed and again.state == {"n": 2}


def test_create_put_replace_delete_replay(manager):
    created = manager.create("d", {"a": 1}, idempotency=key(scope="POST"))
    assert manager.create("d", {"a": 1}, idempotency=key(scope="POST")) == created
    device, was_created = manager.put("p", {"b": 1}, idempotency=key(scope="PUT"))
    assert was_created
    replayed, replay_created = manager.put("p", {"b": 1}, idempotency=key(scope="PUT"))
    assert replayed.replayed and replay_created and replayed == device
    replaced, was_created = manager.put("p", {"b": 2}, idempotency=key("k-2", scope="PUT"))
    assert not was_created and replaced.version == 2
    manager.replace("d", {"a": 2}, expected_version=1, idempotency=key("k-3", scope="PUT"))
    again = manager.replace("d", {"a": 2}, expected_version=1, idempotency=key("k-3", scope="PUT"))
    assert again.replayed and again.version == 2  # not a conflict: the retry of a write that landed
    deleted = manager.delete("d", idempotency=key(scope="DELETE"))
    assert manager.delete("d", idempotency=key(scope="DELETE")).replayed
    assert deleted.state == {"a": 2}
    with pytest.raises(DeviceNotFound):
        manager.get("d")


@pytest.mark.parametrize("bad", ["", "x" * 256, "tab\there", "é"])
def test_bad_keys(bad):
    with pytest.raises(InvalidIdempotencyKey):
        IdempotencyKey(bad)


# ------------------------------------------------------------ fault injection


class LosesResponses(RecordingClient):
    """Lets chosen calls reach DynamoDB and then fails as if the response were lost, or
    fails them before they are sent."""

    def __init__(self, client, operation, *, commit_then_lose=0, never_reach=0, script=()):
        super().__init__(client)
        self._operation = operation
        self.script = list(script) or ["never_reach"] * never_reach + ["commit_then_lose"] * commit_then_lose

    def __getattr__(self, name):
        call = super().__getattr__(name)
        if name != self._operation:
            return call

        def faulty(**kwargs):
            fault = self.script.pop(0) if self.script else None
            if fault == "never_reach":
                raise EndpointConnectionError(endpoint_url="http://dynamodb")
            result = call(**kwargs)
            if fault == "commit_then_lose":
                raise ReadTimeoutError(endpoint_url="http://dynamodb")
            return result

        return faulty


@pytest.mark.parametrize("fault", ["commit_then_lose", "never_reach"])
def test_a_lost_answer_of_a_keyed_write_is_resent_with_its_token_and_applies_once(engine, fault):
    client, name = engine
    faulty = LosesResponses(client, "transact_write_items", **{fault: 1})
    manager = DeviceStateManager(faulty, name)
    DeviceStateManager(client, name).create("c", {"n": 0})
    first = manager.update_with_retry("c", PLUS_ONE, idempotency=key())
    assert first.state == {"n": 1} and first.version == 2
    assert faulty.count("transact_write_items") == (2 if fault == "commit_then_lose" else 1)  # + the resend
    retried = manager.update_with_retry("c", PLUS_ONE, idempotency=key())  # the caller retries, same key
    assert retried.state == {"n": 1} and retried.version == 2 and retried.replayed
    assert manager.get("c").state == {"n": 1}


def test_a_keyed_write_whose_answers_never_come_is_settled_through_its_journal_and_a_retry_replays_it(engine):
    client, name = engine
    faulty = LosesResponses(client, "transact_write_items", script=["commit_then_lose", "never_reach", "never_reach"])
    manager = DeviceStateManager(faulty, name)
    DeviceStateManager(client, name).create("c", {"n": 0})
    first = manager.update_with_retry("c", PLUS_ONE, idempotency=key())  # its journal entry says it applied
    assert first.state == {"n": 1} and first.version == 2
    retried = manager.update_with_retry("c", PLUS_ONE, idempotency=key())  # the caller retries, same key
    assert retried.state == {"n": 1} and retried.version == 2 and retried.replayed
    assert manager.get("c").state == {"n": 1}


def test_an_sdk_resend_of_a_landed_unkeyed_write_is_recognised_not_reapplied(engine):
    """botocore resends a write whose response was lost; the resend fails its version check,
    and the returned item carries this attempt's write id: the write landed once."""
    client, name = engine

    class ResendsOnce(RecordingClient):
        def __getattr__(self, attribute):
            call = super().__getattr__(attribute)
            if attribute != "update_item":
                return call

            def twice(**kwargs):
                call(**kwargs)  # lands; its response is "lost"
                return call(**kwargs)  # the SDK's resend

            return twice

    manager = DeviceStateManager(ResendsOnce(client), name)
    manager.create("c", {"n": 0})
    device = manager.update_with_retry("c", PLUS_ONE)
    assert device.state == {"n": 1} and device.version == 2
    assert DeviceStateManager(client, name).get("c").state == {"n": 1}


@pytest.mark.dynamodb_local
def test_two_identical_requests_racing_with_one_key_apply_once(local_table):
    client, name = local_table
    manager = DeviceStateManager(client, name)
    manager.create("c", {"n": 0})
    for round_no in range(5):
        barrier = threading.Barrier(2)
        results = []

        def send():
            barrier.wait()
            results.append(manager.update_with_retry("c", PLUS_ONE, idempotency=key(f"race-{round_no}")))

        threads = [threading.Thread(target=send) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(results) == 2
        assert results[0] == results[1]  # the same answer
        assert sorted(r.replayed for r in results) == [False, True]
    assert manager.get("c").state == {"n": 5} and manager.get("c").version == 6


# The same request sent twice with one key (a client's retry while its first try is still on the
# way): the second looks for the key's record, finds none, and the first lands right after that
# look. The second's plan then meets what the first did (the device exists, its version moved
# on, it is gone): each case is a refusal unless the record is looked for again.
SAME_REQUEST = {
    "create": (None, lambda manager, k: manager.create("c", {"n": 1}, idempotency=k)),
    "update naming its version": (
        {"n": 0}, lambda manager, k: manager.update("c", MergePatch({"n": 2}), 1, idempotency=k)),
    "delete": ({"n": 0}, lambda manager, k: manager.delete("c", idempotency=k)),
    "delete naming its version": ({"n": 0}, lambda manager, k: manager.delete("c", 1, idempotency=k)),
    "transaction creating": (None, lambda manager, k: manager.transact(
        [Operation.create("c", {"n": 1}), Operation.put("d", {"n": 1})], idempotency=k)),
    "transaction naming a version": ({"n": 0}, lambda manager, k: manager.transact(
        [Operation.update("c", MergePatch({"n": 2}), 1), Operation.put("d", {"n": 1})], idempotency=k)),
}


def lands_after_the_first_look(monkeypatch, request) -> list:
    """Runs ``request`` (the same request, by another client) right after the first look for a
    key's record; the list it returns gets that request's answer."""
    original, answers = RecordedAnswers.results, []

    def results(self, partition, k):
        found = original(self, partition, k)
        if not answers:
            answers.append(None)
            answers[0] = request()
        return found

    monkeypatch.setattr(RecordedAnswers, "results", results)
    return answers


@pytest.mark.parametrize("case", SAME_REQUEST)
def test_a_request_whose_key_lands_after_it_first_looked_replays_that_answer(engine, monkeypatch, case):
    client, name = engine
    initial, send = SAME_REQUEST[case]
    if initial is not None:
        DeviceStateManager(client, name).create("c", initial)
    k = key(f"same-{case}", "same")
    first = lands_after_the_first_look(monkeypatch, lambda: send(DeviceStateManager(client, name), k))
    second = send(DeviceStateManager(client, name), k)
    assert second == first[0], (second, first)
    replayed = [device.replayed for device in second] if isinstance(second, list) else [second.replayed]
    assert all(replayed)
    written = DeviceStateManager(client, name)  # applied once
    if case.startswith("delete"):
        assert written.live_state("c") is None
    else:
        assert written.get("c").version == 1 + (initial is not None)


def test_control_a_request_that_looks_for_its_key_once_is_refused_though_its_key_applied(engine, monkeypatch):
    """The same interleaving, with the record looked for only before the write (the look again
    answers none): the create is refused as if nothing was written, though the key's create
    applied."""
    client, name = engine
    k = key("same-control", "same")
    first = lands_after_the_first_look(
        monkeypatch, lambda: DeviceStateManager(client, name).create("c", {"n": 1}, idempotency=k))
    looked = RecordedAnswers.results
    monkeypatch.setattr(RecordedAnswers, "results", lambda self, partition, k: looked(self, partition, k) and None)
    with pytest.raises(DeviceAlreadyExists):
        DeviceStateManager(client, name).create("c", {"n": 1}, idempotency=k)
    assert first[0].version == 1 and DeviceStateManager(client, name).get("c").version == 1


def _incompressible(size: int) -> str:
    import base64
    import os

    return base64.b64encode(os.urandom(size * 3 // 4)).decode()[:size]


@pytest.mark.dynamodb_local  # AWS's own item sizing; moto refuses items DynamoDB accepts
def test_a_key_never_makes_a_write_too_large_that_fits_without_one(local_table):
    """The record holds the whole answer; it is compressed and split over several items,
    so a device 2 KB under the item limit is written and replayed with a key as without."""
    manager = DeviceStateManager(*local_table)
    manager.create("big", {"blob": "", "n": 0})
    state = {"blob": _incompressible(400 * 1024 - 2048), "n": 1}
    unkeyed = manager.replace("big", state)
    assert unkeyed.state == state
    keyed = manager.replace("big", {**state, "n": 2}, idempotency=key("big-1"))
    assert keyed.version == 3 and not keyed.replayed
    replayed = manager.replace("big", {**state, "n": 2}, idempotency=key("big-1"))
    assert replayed.replayed and replayed == keyed and replayed.state == keyed.state
    assert manager.get("big").version == 3


def test_a_keyed_transaction_of_large_devices_fits_as_without_a_key(local_table):
    """On DynamoDB Local only: moto (5.1) sizes a binary attribute by its base64 text, a third
    more than DynamoDB bills and limits, so the compressed states and their recorded answer
    exceed its limit where DynamoDB's holds them."""
    manager = DeviceStateManager(*local_table)
    states = {name: {"blob": _incompressible(150 * 1024)} for name in ("a", "b", "c")}
    for name in states:
        manager.create(name, {})
    operations = [Operation.replace(name, state) for name, state in states.items()]
    devices = manager.transact(operations, idempotency=IdempotencyKey("scene-big", "transaction", "f"))
    again = manager.transact(operations, idempotency=IdempotencyKey("scene-big", "transaction", "f"))
    assert [d.state for d in again] == [d.state for d in devices] == list(states.values())
    assert all(d.replayed for d in again) and [manager.get(n).version for n in states] == [2, 2, 2]
