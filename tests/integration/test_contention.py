"""Turns among racing read-modify-writes (``contention``): a write that won after racing
long marks the device, a newcomer holds back on a marked device, a quick winner clears
the mark. Single-threaded, with the racing writer interleaved and time driven by the test,
so both engines serve."""

from __future__ import annotations

import random

import pytest

from functions.device_state import DeviceStateManager, JsonPatch, UpdateObserver, table
from functions.device_state.contention import (CLEAR_BELOW_SECONDS, HOLD_HIGH, HOLD_LOW, HOLD_SHARE_OF_BUDGET,
                                               MARK_AFTER_SECONDS)

BUDGET = 5.0


class Time:
    """Epoch and monotonic clocks that move together, when a test or a sleep moves them."""

    def __init__(self):
        self.epoch, self.mono = 1_800_000_000.0, 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.epoch

    def monotonic(self) -> float:
        return self.mono

    def pass_(self, seconds: float) -> None:
        self.epoch += seconds
        self.mono += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.pass_(seconds)


class Holds(UpdateObserver):
    def __init__(self):
        self.pauses = []

    def held(self, device_id, seconds):
        self.pauses.append((device_id, seconds))


@pytest.fixture
def world(engine):
    client, name = engine
    time = Time()

    def manager(observer=None, seed=1):
        return DeviceStateManager(client, name, clock=time.clock, monotonic=time.monotonic, sleep=time.sleep,
                                  rng=random.Random(seed), budget_seconds=BUDGET,
                                  **({"observer": observer} if observer else {}))
    return manager, time, client, name


def mark_of(client, name, device_id):
    item = client.get_item(TableName=name, Key=table.state_key(device_id), ConsistentRead=True)["Item"]
    value = item.get(table.CONTENDED_UNTIL)
    return int(value["N"]) if value else None


def raced_for(seconds, world, device_id):
    """An update function that, on its first call, lets ``seconds`` pass while another
    writer moves the device on (a bare version bump, which leaves the mark as it is), so
    the first try meets a newer version; then it bumps n."""
    _, time, client, name = world
    calls = []

    def bump(state):
        calls.append(1)
        if len(calls) == 1:
            time.pass_(seconds)
            client.update_item(TableName=name, Key=table.state_key(device_id), UpdateExpression="SET #v = #v + :one",
                               ExpressionAttributeNames={"#v": table.VERSION},
                               ExpressionAttributeValues={":one": {"N": "1"}})
        return {**state, "n": state["n"] + 1}
    return bump


def test_a_write_that_won_after_racing_long_marks_the_device_until_now_plus_its_race(world):
    manager, time, client, name = world
    writer = manager()
    writer.create("lamp", {"n": 0})
    raced = MARK_AFTER_SECONDS + 0.2
    writer.update_with_retry("lamp", raced_for(raced, world, "lamp"))
    assert writer.get("lamp").state["n"] == 1
    assert mark_of(client, name, "lamp") == int((time.epoch + raced) * 1000)


def test_a_write_that_lost_once_but_briefly_leaves_no_mark(world):
    manager, time, client, name = world
    writer = manager()
    writer.create("lamp", {"n": 0})
    writer.update_with_retry("lamp", raced_for(MARK_AFTER_SECONDS - 0.1, world, "lamp"))
    assert mark_of(client, name, "lamp") is None


def test_a_slow_first_try_is_no_race_and_leaves_no_mark(world):
    manager, time, client, name = world
    writer = manager()
    writer.create("lamp", {"n": 0})

    def slow(state):
        time.pass_(MARK_AFTER_SECONDS * 4)  # a slow read or a slow function, no other writer
        return {**state, "n": 1}
    writer.update_with_retry("lamp", slow)
    assert mark_of(client, name, "lamp") is None


def test_a_newcomer_holds_back_on_a_marked_device_then_its_quick_win_clears_the_mark(world):
    manager, time, client, name = world
    first = manager()
    first.create("lamp", {"n": 0})
    raced = 2.0
    first.update_with_retry("lamp", raced_for(raced, world, "lamp"))
    until = mark_of(client, name, "lamp") / 1000
    time.pass_(0.5)
    holds = Holds()
    newcomer = manager(holds, seed=2)
    newcomer.update_with_retry("lamp", lambda s: {**s, "n": s["n"] + 1})
    left = until - (time.epoch - time.sleeps[-1])
    assert time.sleeps == [pytest.approx(time.sleeps[0])] and HOLD_LOW * left <= time.sleeps[0] <= HOLD_HIGH * left
    assert holds.pauses == [("lamp", time.sleeps[0])]
    assert newcomer.get("lamp").state["n"] == 2
    assert mark_of(client, name, "lamp") is None  # it won at once: the race is over


def test_the_control_a_newcomer_on_an_unmarked_device_writes_at_once(world):
    manager, time, client, name = world
    writer = manager()
    writer.create("lamp", {"n": 0})
    writer.update_with_retry("lamp", lambda s: {**s, "n": 1})
    assert time.sleeps == [] and mark_of(client, name, "lamp") is None


def test_a_hold_is_at_most_half_the_budget_and_an_expired_mark_holds_nothing(world):
    manager, time, client, name = world
    first = manager()
    first.create("lamp", {"n": 0})
    first.update_with_retry("lamp", raced_for(60.0, world, "lamp"))  # a mark a minute ahead
    newcomer = manager(seed=3)
    newcomer.update_with_retry("lamp", lambda s: {**s, "n": s["n"] + 1}, budget_seconds=BUDGET)
    assert len(time.sleeps) == 1 and time.sleeps[0] <= BUDGET * HOLD_SHARE_OF_BUDGET

    first.update_with_retry("lamp", raced_for(1.0, world, "lamp"))
    time.pass_(1.5)  # past the mark
    before = len(time.sleeps)
    manager(seed=4).update_with_retry("lamp", lambda s: {**s, "n": s["n"] + 1})
    assert len(time.sleeps) == before
    assert mark_of(client, name, "lamp") is None  # cleared by the quick winner


def test_a_write_naming_its_version_does_not_hold_back(world):
    manager, time, client, name = world
    first = manager()
    first.create("lamp", {"n": 0})
    first.update_with_retry("lamp", raced_for(2.0, world, "lamp"))
    current = first.get("lamp")
    manager(seed=5).update("lamp", lambda s: {**s, "n": s["n"] + 1}, expected_version=current.version)
    assert time.sleeps == []
    assert mark_of(client, name, "lamp") is None  # it won at once, as a newcomer's quick win does


def test_a_winner_that_raced_between_the_clear_and_the_mark_thresholds_keeps_the_mark(world):
    manager, time, client, name = world
    first = manager()
    first.create("lamp", {"n": 0})
    first.update_with_retry("lamp", raced_for(30.0, world, "lamp"))
    kept = mark_of(client, name, "lamp")
    middle = (CLEAR_BELOW_SECONDS + MARK_AFTER_SECONDS) / 2
    manager(seed=6).update_with_retry("lamp", raced_for(middle, world, "lamp"))
    assert mark_of(client, name, "lamp") == kept


def test_a_passed_mark_is_removed_by_the_next_read_modify_write_however_long_it_raced(world):
    manager, time, client, name = world
    first = manager()
    first.create("lamp", {"n": 0})
    first.update_with_retry("lamp", raced_for(1.0, world, "lamp"))
    time.pass_(5.0)  # the mark has passed
    middle = (CLEAR_BELOW_SECONDS + MARK_AFTER_SECONDS) / 2
    manager(seed=7).update_with_retry("lamp", raced_for(middle, world, "lamp"))
    assert mark_of(client, name, "lamp") is None


def test_a_compiled_patch_races_no_one_and_removes_the_mark(world):
    manager, time, client, name = world
    writer = manager()
    writer.create("lamp", {"n": 0})
    writer.update_with_retry("lamp", raced_for(2.0, world, "lamp"))
    assert mark_of(client, name, "lamp") is not None
    writer.update_with_retry("lamp", JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))
    assert mark_of(client, name, "lamp") is None and time.sleeps == []  # read-free: it read no mark to hold on
