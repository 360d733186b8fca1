"""The delta rules and per-leaf metadata as tables of cases (pure, no engine)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from functions.device_state import JsonPatch, MergePatch
from functions.device_state.sections import ALL, delta, leaf_entries, leaves, metadata, next_entries, pack, unpack

D = Decimal

DELTA_CASES = [
    # desired, reported, delta
    ({}, {}, {}),
    ({"power": "on"}, {}, {"power": "on"}),
    ({"power": "on"}, {"power": "on"}, {}),
    ({"power": "on"}, {"power": "off"}, {"power": "on"}),
    ({}, {"firmware": "1.4.2"}, {}),  # reported-only members are not in the delta
    ({"n": D("1.0")}, {"n": D("1")}, {}),  # numbers by exact value
    ({"n": D("1.0")}, {"n": D("1.01")}, {"n": D("1.0")}),
    ({"b": True}, {"b": D(1)}, {"b": True}),  # a boolean is no number
    ({"z": None}, {}, {"z": None}),
    ({"z": None}, {"z": None}, {}),
    ({"list": [1, 2]}, {"list": [1, 2]}, {}),
    ({"list": [1, 2]}, {"list": [1, 2, 3]}, {"list": [1, 2]}),  # arrays compared whole
    ({"list": [{"a": 1}]}, {"list": [{"a": D("1.00")}]}, {}),
    ({"e": {}}, {"e": {}}, {}),  # an empty object is a leaf
    ({"e": {}}, {"e": {"x": 1}}, {"e": {}}),
    ({"e": {}}, {}, {"e": {}}),
    ({"s": {"on": "07:00", "off": "23:00"}}, {"s": {"on": "07:00"}}, {"s": {"off": "23:00"}}),
    ({"s": {"on": "07:00"}}, {"s": "nightly"}, {"s": {"on": "07:00"}}),
    ({"s": {"on": "07:00"}}, {"s": {"on": "07:00", "x": 1}}, {}),
    ({"a": {"b": {"c": {"d": 1}}}}, {"a": {"b": {"c": {"d": 2}}}}, {"a": {"b": {"c": {"d": 1}}}}),
    ({"a": {"b": {"c": {"d": 1}}}}, {"a": {"b": {"c": {"d": 1}}}}, {}),
    ({"power": "on", "brightness": 80, "schedule": {"on": "07:00", "off": "23:00"}},
     {"power": "on", "brightness": 50, "schedule": {"on": "07:00"}, "firmware": "1.4.2"},
     {"brightness": 80, "schedule": {"off": "23:00"}}),
]


@pytest.mark.parametrize("desired, reported, expected", DELTA_CASES)
def test_the_delta_rules(desired, reported, expected):
    assert delta(desired, reported) == expected


def test_a_merge_patch_null_removes_the_member_from_the_delta():
    desired = MergePatch({"brightness": None})({"brightness": 80, "power": "on"})
    assert delta(desired, {"power": "on"}) == {}


def test_leaves_are_scalars_arrays_and_empty_objects_by_pointer():
    assert leaves({"a": {"b": 1, "e": {}, "l": [1]}, "x~/y": 2}) == {
        "/a/b": 1, "/a/e": {}, "/a/l": [1], "/x~0~1y": 2}


def test_packed_entries_hold_the_version_and_the_time():
    version, updated_at = unpack(pack(7, 1_700_000_000.123))
    assert version == 7 and updated_at == "2023-11-14T22:13:20.123Z"


def test_a_leaf_takes_the_newest_entry_at_itself_an_ancestor_or_a_descendant():
    entries = {"/a": pack(10, 1), "/a/x": pack(8, 1), "/a/y": pack(12, 1), "/b/old": pack(3, 1), "/b": pack(2, 1)}
    found = {leaf: unpack(value)[0] for leaf, value in leaf_entries({"a": {"x": 1, "z": 2}, "b": {}}, entries).items()}
    assert found == {"/a/x": 10, "/a/z": 10, "/b": 3}


def test_a_read_modify_write_renews_only_what_it_touched_and_keeps_one_entry_per_leaf():
    old = {"/a/x": pack(3, 1), "/a/y": pack(4, 1), "/gone": pack(2, 1)}
    document = {"a": {"x": 1, "y": 2}, "n": 5}
    entries = next_entries(document, old, tuple(MergePatch({"n": 5}).touched()), pack(9, 1))
    assert {leaf: unpack(value)[0] for leaf, value in entries.items()} == {"/a/x": 3, "/a/y": 4, "/n": 9}
    assert {unpack(v)[0] for v in next_entries(document, old, (ALL,), pack(9, 1)).values()} == {9}


def test_patches_say_which_pointers_they_set():
    assert MergePatch({"a": {"b": 1, "c": None}, "d": 2, "e": {}}).touched() == ["/a/b", "/a/c", "/d", "/e"]
    assert JsonPatch([{"op": "test", "path": "/t", "value": 1}, {"op": "move", "from": "/x", "path": "/y"},
                      {"op": "increment", "path": "/n", "value": 1}]).touched() == ["/y", "/x", "/n"]


def test_confirmation_needs_an_equal_value_reported_at_or_after_the_desire():
    desired = {"brightness": 80, "power": "on", "mode": "eco"}
    reported = {"brightness": D("80.0"), "power": "on", "mode": "comfort"}
    entries = {"desired": {"/brightness": pack(5, 1), "/power": pack(5, 1), "/mode": pack(5, 1)},
               "reported": {"/brightness": pack(6, 1), "/power": pack(2, 1), "/mode": pack(7, 1)}}
    shown = metadata(desired, reported, entries)
    assert shown["desired"]["brightness"]["confirmedVersion"] == 6  # reported again after the desire
    assert "confirmedVersion" not in shown["desired"]["power"]  # equal by coincidence, not reported since
    assert "confirmedVersion" not in shown["desired"]["mode"]  # reported since, but another value
    assert shown["reported"]["mode"] == {"version": 7, "updatedAt": "1970-01-01T00:00:01.000Z"}
