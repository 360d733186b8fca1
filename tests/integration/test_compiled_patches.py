"""Patches that compile to one UpdateItem: no read, no conflict, and the same meaning as
read-modify-write, which takes over whenever DynamoDB refuses the compiled form."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest

from functions.device_state import (
    DeviceStateManager,
    JsonPatch,
    MergePatch,
    PatchNotApplicable,
)
from tests.helpers import RecordingClient


@pytest.fixture
def spied(engine):
    client, name = engine
    spy = RecordingClient(client)
    return DeviceStateManager(spy, name), spy


def test_an_increment_is_one_write_and_no_read(spied):
    manager, spy = spied
    manager.create("c", {"n": 5, "other": "kept"})
    spy.calls.clear()
    device = manager.update_with_retry("c", JsonPatch([{"op": "increment", "path": "/n", "value": 2},
                                                       {"op": "add", "path": "/new", "value": [1, 2]},
                                                       {"op": "remove", "path": "/other"}]))
    assert spy.calls == ["update_item"]
    assert device.state == {"n": 7, "new": [1, 2]} and device.version == 2
    assert manager.get("c") == device


def test_a_flat_merge_patch_is_one_write_and_a_nested_one_reads(spied):
    manager, spy = spied
    manager.create("c", {"a": 1, "b": 2, "o": {"x": 1}})
    spy.calls.clear()
    assert manager.update_with_retry("c", MergePatch({"a": 10, "b": None})).state == {"a": 10, "o": {"x": 1}}
    assert spy.calls == ["update_item"]
    spy.calls.clear()
    assert manager.update_with_retry("c", MergePatch({"o": {"y": 2}})).state == {"a": 10, "o": {"x": 1, "y": 2}}
    assert spy.calls == ["get_item", "update_item"]


def test_a_report_that_removes_leaves_is_one_write_that_takes_their_metadata(spied):
    """A removed leaf's metadata entry goes in the same request; where that would leave an
    entry behind (an object removed or replaced whole, whose leaves hold entries) or an
    object empty (a new leaf, to be dated), the report reads and writes at the version."""
    manager, spy = spied
    manager.create("c", {}, sections={"reported": {"a": 1, "b": 2, "o": {"x": 1, "y": 2}, "p": {"q": 1}}})
    spy.calls.clear()
    device = manager.update_with_retry("c", MergePatch({"a": None, "o": {"x": None}}), section="reported")
    assert spy.calls == ["update_item"] and device.reported == {"b": 2, "o": {"y": 2}, "p": {"q": 1}}
    assert set(manager.get("c").entries["reported"]) == {"/b", "/o/y", "/p/q"}
    for patch, left in (({"o": {"y": None}}, {"/b", "/o", "/p/q"}), ({"p": 5}, {"/b", "/o", "/p"}),
                        ({"o": None}, {"/b", "/p"})):
        spy.calls.clear()
        manager.update_with_retry("c", MergePatch(patch), section="reported")
        assert spy.calls == ["update_item", "update_item"], patch
        assert set(manager.get("c").entries["reported"]) == left, patch


@pytest.mark.parametrize("start, operation, expected", [
    (95, {"op": "increment", "path": "/n", "value": 10, "max": 100}, 100),
    (3, {"op": "increment", "path": "/n", "value": -10, "min": 0}, 0),
    (50, {"op": "increment", "path": "/n", "value": 10, "max": 100}, 60),
    (None, {"op": "increment", "path": "/n", "value": 500, "max": 100}, 100),
    (None, {"op": "increment", "path": "/n", "value": -5, "min": 0}, 0),
])
def test_clamped_increments_mean_the_same_compiled_or_not(manager, start, operation, expected):
    manager.create("c", {} if start is None else {"n": start})
    assert manager.update_with_retry("c", JsonPatch([operation])).state == {"n": expected}


@pytest.mark.parametrize("state, operation", [
    ({"n": "text"}, {"op": "increment", "path": "/n", "value": 1}),
    ({"n": "text"}, {"op": "increment", "path": "/n", "value": 1, "max": 10}),
    ({}, {"op": "add", "path": "/missing/child", "value": 1}),
    ({}, {"op": "replace", "path": "/missing", "value": 1}),
    ({}, {"op": "remove", "path": "/missing"}),
])
def test_refused_compiled_forms_fall_back_and_raise_the_patch_error(manager, state, operation):
    manager.create("c", state)
    with pytest.raises(PatchNotApplicable):
        manager.update_with_retry("c", JsonPatch([operation]))
    assert manager.get("c").version == 1


def test_numbers_dynamodb_returns_in_long_form_read_back_exactly(manager):
    """38 nines + 1 is 1E+38: one significant digit, which DynamoDB returns as 39 digits."""
    manager.create("c", {"n": Decimal("9" * 38)})
    device = manager.update_with_retry("c", JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))
    assert device.state["n"] == Decimal("1E+38")
    assert manager.get("c").state["n"] == Decimal("1E+38")


@pytest.mark.dynamodb_local
@pytest.mark.concurrency
def test_concurrent_compiled_increments_never_conflict(local_table):
    client, name = local_table
    spy = RecordingClient(client)
    manager = DeviceStateManager(spy, name)
    manager.create("hot", {"n": 0})
    spy.calls.clear()
    barrier = threading.Barrier(16)

    def worker():
        barrier.wait()
        for _ in range(10):
            manager.update_with_retry("hot", JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # one UpdateItem per increment: its journal trims ride along (no reads, no requests of their own)
    assert spy.count("update_item") == 160 and spy.count("get_item") == 0
    device = manager.get("hot")
    assert device.state == {"n": 160} and device.version == 161
