"""Turns among racing read-modify-writes (``contention``): a write that won after racing
long marks the device (racedUntil), a second one marks it crowded (contendedUntil), a
newcomer holds back on a crowded device, a quick winner clears the marks. Single-threaded,
with the racing writer interleaved and time driven by the test, so both engines serve."""

from __future__ import annotations

import random

import pytest

from functions.device_state import DeviceAlreadyExists, DeviceStateManager, JsonPatch, UpdateObserver, table
from functions.device_state.item.contention import (CLEAR_BELOW_SECONDS, HOLD_HIGH, HOLD_LOW, HOLD_SHARE_OF_BUDGET,
                                               HORIZON_SECONDS, MARK_AFTER_SECONDS)

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


def marks_of(client, name, device_id):
    """The item's contention marks, by name (epoch ms)."""
    item = client.get_item(TableName=name, Key=table.state_key(device_id), ConsistentRead=True)["Item"]
    return {mark: int(item[mark]["N"]) for mark in (table.RACED_UNTIL, table.CONTENDED_UNTIL) if mark in item}


def raced_for(seconds, world, device_id):
    """An update function that, on its first call, lets ``seconds`` pass while another
    writer moves the device on (a bare version bump, which leaves the marks as they are), so
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


def set_raw(world, device_id, attributes):
    """Sets attributes on the state item as another writer would (no version bump)."""
    _, _, client, name = world
    names = {f"#a{index}": attribute for index, attribute in enumerate(attributes)}
    client.update_item(TableName=name, Key=table.state_key(device_id),
                       UpdateExpression="SET " + ", ".join(f"{key} = :v{key[2:]}" for key in names),
                       ExpressionAttributeNames=names,
                       ExpressionAttributeValues={f":v{key[2:]}": attributes[names[key]] for key in names})


def raw_marks(world, device_id):
    """The marks the item carries, whatever they hold."""
    _, _, client, name = world
    item = client.get_item(TableName=name, Key=table.state_key(device_id), ConsistentRead=True)["Item"]
    return {mark: item[mark] for mark in (table.RACED_UNTIL, table.CONTENDED_UNTIL) if mark in item}


def created(world, device_id):
    """A new device at n = 0, and the writer that created it."""
    writer = world[0]()
    writer.create(device_id, {"n": 0})
    return writer


def after_a_race(world, device_id, raced):
    """A new device, then one write that wins after racing ``raced`` seconds; its writer."""
    writer = created(world, device_id)
    writer.update_with_retry(device_id, raced_for(raced, world, device_id))
    return writer


def crowded(world, device_id, raced=2.0):
    """Two writers in a row win after racing long, the second (``raced`` seconds) while the
    first's mark is ahead: the device is crowded until ``raced`` seconds from then."""
    writer = after_a_race(world, device_id, raced + 1.0)
    writer.update_with_retry(device_id, raced_for(raced, world, device_id))
    return writer


def test_one_long_race_leaves_racedUntil_which_holds_no_one_back(world):
    manager, time, client, name = world
    raced = MARK_AFTER_SECONDS + 0.2
    writer = after_a_race(world, "lamp", raced)
    assert writer.get("lamp").state["n"] == 1
    assert marks_of(client, name, "lamp") == {table.RACED_UNTIL: int((time.epoch + raced) * 1000)}
    manager(seed=2).update_with_retry("lamp", lambda s: {**s, "n": s["n"] + 1})
    assert time.sleeps == []  # the luck of one backoff is no crowd


def test_a_second_long_race_while_the_first_mark_is_ahead_marks_the_device_crowded(world):
    manager, time, client, name = world
    raced = MARK_AFTER_SECONDS + 0.3
    crowded(world, "lamp", raced=raced)
    assert marks_of(client, name, "lamp") == {table.CONTENDED_UNTIL: int((time.epoch + raced) * 1000)}


def test_a_second_long_race_after_the_first_mark_passed_starts_over(world):
    manager, time, client, name = world
    raced = MARK_AFTER_SECONDS + 0.3
    writer = after_a_race(world, "lamp", raced)
    time.pass_(raced + 0.1)  # past the first mark
    writer.update_with_retry("lamp", raced_for(raced, world, "lamp"))
    assert set(marks_of(client, name, "lamp")) == {table.RACED_UNTIL}


def test_a_write_that_lost_once_but_briefly_leaves_no_mark(world):
    manager, time, client, name = world
    after_a_race(world, "lamp", MARK_AFTER_SECONDS - 0.1)
    assert marks_of(client, name, "lamp") == {}


def test_a_slow_first_try_is_no_race_and_leaves_no_mark(world):
    manager, time, client, name = world
    writer = created(world, "lamp")

    def slow(state):
        time.pass_(MARK_AFTER_SECONDS * 4)  # a slow read or a slow function, no other writer
        return {**state, "n": 1}
    writer.update_with_retry("lamp", slow)
    assert marks_of(client, name, "lamp") == {}


def test_a_newcomer_holds_back_on_a_crowded_device_and_its_quick_win_keeps_the_mark(world):
    manager, time, client, name = world
    crowded(world, "lamp")
    until = marks_of(client, name, "lamp")[table.CONTENDED_UNTIL] / 1000
    time.pass_(0.5)
    holds = Holds()
    newcomer = manager(holds, seed=2)
    newcomer.update_with_retry("lamp", lambda s: {**s, "n": s["n"] + 1})
    left = until - (time.epoch - time.sleeps[-1])
    assert len(time.sleeps) == 1 and HOLD_LOW * left <= time.sleeps[0] <= HOLD_HIGH * left
    assert holds.pauses == [("lamp", time.sleeps[0])]
    assert newcomer.get("lamp").state["n"] == 3
    # It won at once because it held back: that shows the hold working, not the race over.
    assert marks_of(client, name, "lamp") == {table.CONTENDED_UNTIL: int(until * 1000)}


def test_a_quick_win_without_a_hold_clears_the_marks(world):
    manager, time, client, name = world
    writer = crowded(world, "lamp")
    writer.update("lamp", lambda s: {**s, "n": s["n"] + 1}, expected_version=writer.get("lamp").version)
    assert marks_of(client, name, "lamp") == {}


def test_the_control_a_newcomer_on_an_unmarked_device_writes_at_once(world):
    manager, time, client, name = world
    writer = created(world, "lamp")
    writer.update_with_retry("lamp", lambda s: {**s, "n": 1})
    assert time.sleeps == [] and marks_of(client, name, "lamp") == {}


def test_a_hold_is_at_most_half_the_budget(world):
    manager, time, client, name = world
    crowded(world, "lamp", raced=8.0)  # crowded for 8 s more
    manager(seed=3).update_with_retry("lamp", lambda s: {**s, "n": s["n"] + 1})
    assert time.sleeps == [pytest.approx(time.sleeps[0])] and 0 < time.sleeps[0] <= BUDGET * HOLD_SHARE_OF_BUDGET


def test_a_mark_past_the_horizon_holds_no_one_and_goes_with_the_next_winner(world):
    manager, time, client, name = world
    created(world, "lamp")
    ahead = int((time.epoch + HORIZON_SECONDS + 3600) * 1000)  # a skewed clock, or another writer
    set_raw(world, "lamp", {table.CONTENDED_UNTIL: {"N": str(ahead)}})
    manager(seed=8).update_with_retry("lamp", lambda s: {**s, "n": s["n"] + 1})
    assert time.sleeps == [] and marks_of(client, name, "lamp") == {}


@pytest.mark.parametrize("bad", [{"N": "1700000000000.5"}, {"N": "1E+30"}, {"N": "-1"}, {"S": "soon"},
                                 {"BOOL": True}])
def test_a_malformed_mark_fails_no_write_and_goes_with_the_next_winner(world, bad):
    manager, time, client, name = world
    writer = created(world, "lamp")
    set_raw(world, "lamp", {table.CONTENDED_UNTIL: bad, table.RACED_UNTIL: bad})
    current = writer.update("lamp", lambda s: {**s, "n": 1}, expected_version=1)
    assert current.version == 2 and time.sleeps == []
    assert raw_marks(world, "lamp") == {}
    set_raw(world, "lamp", {table.CONTENDED_UNTIL: bad})
    writer.update_with_retry("lamp", lambda s: {**s, "n": s["n"] + 1})
    assert writer.get("lamp").state["n"] == 2 and time.sleeps == [] and raw_marks(world, "lamp") == {}


def test_a_delete_leaves_no_mark_on_its_tombstone_and_a_create_never_holds(world):
    manager, time, client, name = world
    writer = crowded(world, "lamp")
    with pytest.raises(DeviceAlreadyExists):
        manager(seed=9).create("lamp", {"n": 0})  # refused at once, not after a hold
    assert time.sleeps == []
    writer.delete("lamp")  # without If-Match it may hold back like any write that retries
    assert raw_marks(world, "lamp") == {}
    held = list(time.sleeps)
    writer.create("lamp", {"n": 0})
    assert time.sleeps == held


def test_a_passed_mark_holds_nothing_and_the_next_winner_removes_it_however_long_it_raced(world):
    manager, time, client, name = world
    crowded(world, "lamp", raced=1.0)
    time.pass_(1.5)  # past the mark
    middle = (CLEAR_BELOW_SECONDS + MARK_AFTER_SECONDS) / 2
    manager(seed=4).update_with_retry("lamp", raced_for(middle, world, "lamp"))
    assert time.sleeps == [] and marks_of(client, name, "lamp") == {}


def test_a_write_naming_its_version_does_not_hold_back(world):
    manager, time, client, name = world
    writer = crowded(world, "lamp")
    manager(seed=5).update("lamp", lambda s: {**s, "n": s["n"] + 1}, expected_version=writer.get("lamp").version)
    assert time.sleeps == []


def test_a_winner_that_raced_between_the_clear_and_the_mark_thresholds_keeps_the_mark(world):
    manager, time, client, name = world
    after_a_race(world, "lamp", 3.0)  # racedUntil: nobody holds on it
    kept = marks_of(client, name, "lamp")
    middle = (CLEAR_BELOW_SECONDS + MARK_AFTER_SECONDS) / 2
    manager(seed=6).update_with_retry("lamp", raced_for(middle, world, "lamp"))
    assert time.sleeps == [] and marks_of(client, name, "lamp") == kept


def test_a_quick_winner_that_did_not_hold_back_clears_the_mark(world):
    manager, time, client, name = world
    after_a_race(world, "lamp", 3.0)
    assert set(marks_of(client, name, "lamp")) == {table.RACED_UNTIL}
    manager(seed=7).update_with_retry("lamp", lambda s: {**s, "n": s["n"] + 1})  # wins at its first try
    assert time.sleeps == [] and marks_of(client, name, "lamp") == {}


def test_a_compiled_patch_races_no_one_and_removes_the_marks(world):
    manager, time, client, name = world
    writer = crowded(world, "lamp")
    assert marks_of(client, name, "lamp")
    writer.update_with_retry("lamp", JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))
    assert marks_of(client, name, "lamp") == {} and time.sleeps == []  # read-free: it read no mark
