"""update_with_retry's loop, with a competing writer interleaved deterministically
(single-threaded, so both engines serve)."""

from __future__ import annotations

import random

import pytest

from functions.device_state import (
    Backoff,
    DeviceStateManager,
    JsonPatch,
    RetriesExhausted,
    UpdateObserver,
)
from tests.helpers import FakeTime, RecordingClient


class Events(UpdateObserver):
    def __init__(self):
        self.log = []

    def attempt(self, device_id, attempt):
        self.log.append(("attempt", attempt))

    def conflict(self, device_id, expected_version, found_version):
        self.log.append(("conflict", expected_version, found_version))

    def succeeded(self, device_id, attempts, elapsed):
        self.log.append(("succeeded", attempts))

    def exhausted(self, device_id, attempts, elapsed):
        self.log.append(("exhausted", attempts))


@pytest.fixture
def setup(engine):
    client, name = engine
    spy = RecordingClient(client)
    fake = FakeTime()
    events = Events()
    manager = DeviceStateManager(
        spy, name, observer=events, monotonic=fake.monotonic, sleep=fake.sleep, rng=random.Random(7)
    )
    rival = DeviceStateManager(client, name)
    return manager, rival, spy, fake, events


def test_retry_reapplies_update_fn_to_the_newer_state(setup):
    manager, rival, spy, fake, events = setup
    manager.create("lamp-1", {"brightness": 50, "log": []})
    seen = []

    def add_ten(state):
        seen.append(dict(state, log=list(state["log"])))
        if len(seen) == 1:  # another writer lands between our read and our write
            rival.replace("lamp-1", {"brightness": 20, "log": ["rival"]})
        state["brightness"] += 10
        state["log"].append("us")
        return state

    spy.calls.clear()
    device = manager.update_with_retry("lamp-1", add_ten)
    assert seen == [{"brightness": 50, "log": []}, {"brightness": 20, "log": ["rival"]}]
    assert device.state == {"brightness": 30, "log": ["rival", "us"]}
    assert device.version == 3
    assert manager.get("lamp-1") == device
    # the retry worked from the item the failed write returned: one read in all
    assert spy.calls.count("get_item") == 1 + 1  # + the get above
    assert events.log == [("attempt", 1), ("conflict", 1, 2), ("attempt", 2), ("succeeded", 2)]
    assert fake.sleeps == []  # a first conflict retries at once


def test_no_value_computed_from_a_stale_read_is_ever_written(setup):
    manager, rival, spy, fake, events = setup
    manager.create("c-1", {"n": 0})
    spy.calls.clear()
    rounds = []

    def double(state):
        rounds.append(state["n"])
        if len(rounds) <= 3:
            rival.update_with_retry("c-1", JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))
        state["n"] = state["n"] * 2
        return state

    device = manager.update_with_retry("c-1", double)
    assert rounds == [0, 1, 2, 3]
    assert device.state == {"n": 6}  # 2 x the value it last read, never 2 x a stale one
    assert device.version == 5
    # at once from the item the failed write returned (as fresh as a read) after its first
    # conflict; after each later one, a jittered backoff and a fresh read
    assert spy.calls.count("get_item") == 1 + 2 and len(fake.sleeps) == 2


def test_running_out_of_attempts_writes_nothing(setup):
    manager, rival, spy, fake, events = setup
    manager.create("c-1", {"n": 0, "by": "creator"})

    def always_beaten(state):
        rival.replace("c-1", {"n": state["n"] + 1, "by": "rival"})
        return {"n": -1, "by": "us"}

    with pytest.raises(RetriesExhausted) as caught:
        manager.update_with_retry("c-1", always_beaten, max_attempts=4)
    assert caught.value.attempts == 4
    final = manager.get("c-1")
    assert final.state["by"] == "rival"
    assert final.version == 1 + 4  # only the rival's four writes
    assert events.log[-1] == ("exhausted", 4)
    # none after the first conflict, one after each later one but the last (no sleep before giving up)
    assert len(fake.sleeps) == 2


def test_running_out_of_time_budget_writes_nothing_and_never_sleeps_past_it(setup):
    _, rival, spy, fake, events = setup
    manager = DeviceStateManager(spy, rival.table_name, monotonic=fake.monotonic, sleep=fake.sleep,
                                 rng=random.Random(7), backoff=Backoff(base_seconds=0.4, cap_seconds=10))
    manager.create("c-1", {"n": 0})

    def always_beaten(state):
        rival.replace("c-1", {"n": state["n"] + 1})
        return {"n": -1}

    started = fake.now
    with pytest.raises(RetriesExhausted) as caught:
        manager.update_with_retry("c-1", always_beaten, max_attempts=1000, budget_seconds=2.0)
    assert "budget" in caught.value.reason
    assert fake.now - started <= 2.0
    assert fake.sleeps[0] > 0.1  # the backoff asked for took effect (past the default ceiling of that attempt)
    assert manager.get("c-1").state["n"] > 0


def test_backoff_is_exponential_with_full_jitter():
    backoff = Backoff(base_seconds=0.01, cap_seconds=0.08)
    rng = random.Random(1)
    for attempt, ceiling in [(1, 0.01), (2, 0.02), (3, 0.04), (4, 0.08), (5, 0.08), (9, 0.08)]:
        delays = [backoff.delay(attempt, rng) for _ in range(300)]
        assert 0 <= min(delays) and max(delays) <= ceiling
        assert max(delays) > ceiling * 0.8  # the whole range is used, not a fixed delay
        assert min(delays) < ceiling * 0.2
