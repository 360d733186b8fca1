"""The line across processes (line.py) on DynamoDB Local: writers with a manager each (as
separate Lambdas) line up instead of racing, lose nothing, and a line whose holder is gone
moves on; its control races."""

from __future__ import annotations

import threading
import time

import pytest

from functions.device_state import Device, DeviceStateManager, JsonPatch, UpdateObserver
from functions.device_state import table
from functions.device_state.line import FIRST_TURN_SECONDS, STALL_SECONDS, STALL_TURNS
from functions.device_state.values import from_attribute

from tests.integration.test_concurrency import THREADS, append_token, run_workers

pytestmark = pytest.mark.dynamodb_local


class LineEvents(UpdateObserver):
    def __init__(self):
        self.conflicts = self.joined = self.stalled = 0
        self._lock = threading.Lock()

    def conflict(self, device_id, expected_version, found_version):
        with self._lock:
            self.conflicts += 1

    def joined_line(self, device_id):
        with self._lock:
            self.joined += 1

    def line_stalled(self, device_id):
        with self._lock:
            self.stalled += 1


def writers_apart(client, name, events):
    """Each worker thread its own manager, as each Lambda has."""
    own = threading.local()

    def write(token):
        if not hasattr(own, "manager"):
            own.manager = DeviceStateManager(client, name, observer=events)
        own.manager.update_with_retry("hot", append_token(token))

    return write


def turns_of(client, name, device_id="hot"):
    item = client.get_item(TableName=name, Key=table.state_key(device_id), ConsistentRead=True)["Item"]
    return {attribute: int(item[attribute]["N"]) for attribute in (table.TURNS_TAKEN, table.TURNS_SERVED)
            if attribute in item}, from_attribute(item["state"])


def test_writers_in_separate_processes_line_up_and_rarely_collide(local_table):
    """Its control is test_concurrency's race: the same workers with line_up=False collide
    about once per update, or more."""
    client, name = local_table
    DeviceStateManager(client, name).create("hot", {"tokens": [], "counter": 0})
    events = LineEvents()
    run = run_workers(writers_apart(client, name, events), updates_per_thread=10)
    turns, state = turns_of(client, name)
    updates = THREADS * 10
    assert sorted(state["tokens"]) == sorted(run.acknowledged) and len(run.acknowledged) == updates
    assert events.joined > 0 and turns[table.TURNS_SERVED] <= turns[table.TURNS_TAKEN]
    assert events.conflicts <= 0.3 * updates, events.conflicts


def holder_that_vanished(client, name):
    """A line whose only ticket's holder is gone (crashed, or never learnt its ticket)."""
    DeviceStateManager(client, name).line.take("hot", table.TURN_TAKER_PREFIX + "gone")


def test_a_line_whose_holder_is_gone_moves_on_after_the_stall(local_table):
    client, name = local_table
    DeviceStateManager(client, name).create("hot", {"tokens": [], "counter": 0})
    holder_that_vanished(client, name)
    events = LineEvents()
    started = time.monotonic()
    DeviceStateManager(client, name, observer=events).update_with_retry("hot", append_token("late"))
    waited = time.monotonic() - started
    turns, state = turns_of(client, name)
    assert state["tokens"] == ["late"] and events.joined == 1 and events.stalled == 1
    stall = min(STALL_SECONDS[1], max(STALL_SECONDS[0], STALL_TURNS * FIRST_TURN_SECONDS))  # no turn seen yet
    assert stall <= waited < stall + 2
    assert turns == {table.TURNS_TAKEN: 2, table.TURNS_SERVED: 2}  # the lost turn and its own


def test_a_writer_that_leaves_in_its_turn_without_writing_ends_it(local_table):
    client, name = local_table
    DeviceStateManager(client, name).create("hot", {"tokens": [], "counter": 0})
    holder_that_vanished(client, name)

    def refuse(state):
        raise ValueError("not today")

    with pytest.raises(ValueError):
        DeviceStateManager(client, name).update_with_retry("hot", refuse)
    turns, state = turns_of(client, name)
    assert turns == {table.TURNS_TAKEN: 2, table.TURNS_SERVED: 2} and state["tokens"] == []
    events = LineEvents()  # so the next writer finds no line to wait in
    DeviceStateManager(client, name, observer=events).update_with_retry("hot", append_token("next"))
    assert events.joined == 0 and turns_of(client, name)[0][table.TURNS_TAKEN] == 2


def test_a_writer_whose_budget_ends_in_line_gives_up_having_written_nothing(local_table):
    from functions.device_state import RetriesExhausted

    client, name = local_table
    DeviceStateManager(client, name).create("hot", {"tokens": [], "counter": 0})
    holder_that_vanished(client, name)
    with pytest.raises(RetriesExhausted) as caught:
        DeviceStateManager(client, name).update_with_retry("hot", append_token("x"), budget_seconds=STALL_SECONDS[0] / 5)
    assert "turn" in caught.value.reason
    assert turns_of(client, name)[1]["tokens"] == []


def test_a_compiled_patch_never_waits_in_line(local_table):
    client, name = local_table
    DeviceStateManager(client, name).create("hot", {"n": 0})
    holder_that_vanished(client, name)
    events = LineEvents()
    DeviceStateManager(client, name, observer=events).update_with_retry(
        "hot", JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))
    turns, state = turns_of(client, name)
    assert state == {"n": 1} and events.joined == 0 and turns == {table.TURNS_TAKEN: 1}


def test_a_writer_that_left_the_line_is_passed_at_once_without_a_stall(local_table):
    client, name = local_table
    DeviceStateManager(client, name).create("hot", {"tokens": [], "counter": 0})
    gone = DeviceStateManager(client, name).line
    taker = table.TURN_TAKER_PREFIX + "left"
    gone.leave("hot", taker, gone.take("hot", taker))  # took ticket 1, then left (its budget ran out)
    events = LineEvents()
    DeviceStateManager(client, name, observer=events).update_with_retry("hot", append_token("next"))
    turns, state = turns_of(client, name)
    assert state["tokens"] == ["next"] and events.joined == 1 and events.stalled == 0
    assert turns == {table.TURNS_TAKEN: 2, table.TURNS_SERVED: 2}
    item = client.get_item(TableName=name, Key=table.state_key("hot"), ConsistentRead=True)["Item"]
    assert not [attribute for attribute in item if attribute.startswith(table.TURN_TAKER_PREFIX)]  # both gone


def test_no_ticket_is_taken_on_a_deleted_device(local_table):
    client, name = local_table
    manager = DeviceStateManager(client, name)
    manager.create("hot", {"n": 0})
    manager.delete("hot")
    assert manager.line.take("hot", table.TURN_TAKER_PREFIX + "late") is None
    tombstone = client.get_item(TableName=name, Key=table.state_key("hot"), ConsistentRead=True)["Item"]
    assert table.TURNS_TAKEN not in tombstone


def line_attributes(client, name, device_id="hot"):
    item = client.get_item(TableName=name, Key=table.state_key(device_id), ConsistentRead=True)["Item"]
    return {attribute: int(value["N"]) for attribute, value in item.items()
            if attribute.startswith(table.TURN_TAKER_PREFIX) or attribute in (table.TURNS_TAKEN, table.TURNS_SERVED)}


def test_a_writer_the_line_moved_past_writes_out_of_turn_without_spinning_and_leaves_no_ticket(local_table):
    """A holder slow enough to be taken for gone: the next waiter moves the line on past it,
    then the holder's write (planned in its turn) lands and ends a turn too, so the line
    has moved past the next writer's ticket as well."""
    import dataclasses

    from functions.device_state.idempotency import UPDATED

    client, name = local_table
    DeviceStateManager(client, name).create("hot", {"tokens": [], "counter": 0})
    slow, next_writer = DeviceStateManager(client, name), DeviceStateManager(client, name)
    give_up = RuntimeError
    holder = slow.line.place("hot", time.monotonic() + 5, give_up)
    in_turn = holder.ready(slow.store.get_state("hot"), 2)  # loses once, joins: ticket 1, its turn
    waiter = next_writer.line.place("hot", time.monotonic() + 5, give_up)
    waiter.ticket = next_writer.line.take("hot", waiter.taker)  # ticket 2
    next_writer.line.move_on("hot", 0, [holder.taker])  # the holder looked gone
    planner = dataclasses.replace(slow.planner(), serves_turn=holder.taker)
    planned = planner.replace_state(in_turn, append_token("slow"), None, UPDATED)
    slow.pipeline.send(planner, "hot", planned)  # lands, and ends a turn: served 2
    holder.served = True
    holder.done()
    item = waiter.ready(next_writer.store.get_state("hot"), 2)
    assert waiter.passed and not waiter.in_turn and not waiter.at_once  # writes out of turn, backs off if beaten
    assert Device.from_item(item).state["tokens"] == ["slow"]
    waiter.done()
    assert line_attributes(client, name) == {table.TURNS_TAKEN: 2, table.TURNS_SERVED: 2}  # no ticket left behind


def test_a_waiter_on_a_device_deleted_meanwhile_is_answered_not_found_at_once(local_table):
    from functions.device_state import DeviceNotFound

    client, name = local_table
    DeviceStateManager(client, name).create("hot", {"tokens": [], "counter": 0})
    holder_that_vanished(client, name)
    deleter = DeviceStateManager(client, name)
    waiter = DeviceStateManager(client, name, budget_seconds=5)
    original_sleep = waiter.line.sleep

    def delete_while_waiting(seconds):
        if deleter.live_state("hot") is not None:
            deleter.delete("hot")
        original_sleep(seconds)

    waiter.line.sleep = delete_while_waiting
    started = time.monotonic()
    with pytest.raises(DeviceNotFound):
        waiter.update_with_retry("hot", append_token("late"))
    assert time.monotonic() - started < 2  # not its whole budget
