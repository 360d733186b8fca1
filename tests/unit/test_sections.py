"""The delta rules and per-leaf metadata as tables of cases (pure, no engine)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from functions.device_state import JsonPatch, MergePatch
from functions.device_state.model.sections import (ALL, VERSION_SPAN, delta, leaf_entries, leaves, metadata, next_entries,
                                             pack, unpack)

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


# ------------------------------------------------ metadata work is linear (issue 27, row 2)


def _related(leaf: str, entry: str) -> bool:
    """The rule by its definition: ``entry`` is the leaf's pointer, an ancestor's or a descendant's."""
    return leaf == entry or entry == ALL or leaf.startswith(entry + "/") or entry.startswith(leaf + "/")


def _random_document(rng, depth=0):
    names = ["a", "b", "a/b", "a~b", "~1", "é", "ab"]
    document = {}
    for name in rng.sample(names, rng.randint(0, 4)):
        kind = rng.random()
        document[name] = (_random_document(rng, depth + 1) if kind < 0.5 and depth < 4
                          else {} if kind < 0.6 else [1] if kind < 0.7 else rng.randint(0, 9))
    return document


def test_each_leaf_takes_the_newest_related_entry_as_the_definition_says():
    import random

    rng = random.Random(27)
    for _ in range(300):
        document = _random_document(rng)
        pointers = [ALL, *leaves(document), *leaves(_random_document(rng)),
                    *(leaf.rsplit("/", 1)[0] for leaf in leaves(document))]
        chosen = rng.sample(pointers, min(len(pointers), rng.randint(0, 8)))
        # one write per version, each at a time that may disagree with the version order (clock skew)
        entries = {pointer: pack(version, rng.randint(0, 9))
                   for pointer, version in zip(chosen, rng.sample(range(1, 51), len(chosen)))}
        expected = {leaf: max((value for entry, value in entries.items() if _related(leaf, entry)), default=0,
                              key=lambda packed: packed % VERSION_SPAN)
                    for leaf in leaves(document)}
        assert leaf_entries(document, entries) == expected, (document, entries)
        touched = tuple(rng.sample(pointers, min(len(pointers), rng.randint(0, 3))))
        renewed = next_entries(document, entries, touched, pack(99, 9))
        assert renewed == {leaf: pack(99, 9) if any(_related(leaf, path) for path in touched) else value
                           for leaf, value in expected.items()}, (document, entries, touched)


def test_metadata_of_many_leaves_takes_time_linear_in_them():
    import time

    leaf_count = 5000  # quadratic work took about 8 s per call here; linear work takes milliseconds
    reported = {f"s{index}": index for index in range(leaf_count)}
    desired = {f"s{index}": index for index in range(0, leaf_count, 2)}
    started = time.perf_counter()
    entries = {"reported": next_entries(reported, {}, (ALL,), pack(1, 1)),
               "desired": next_entries(desired, {}, (ALL,), pack(1, 1))}
    entries["reported"] = next_entries(reported, entries["reported"], ("/s0", "/s1", "/gone/x"), pack(2, 1))
    shown = metadata(desired, reported, entries)
    assert time.perf_counter() - started < 2.0
    assert shown["desired"]["s0"] == {"version": 1, "updatedAt": "1970-01-01T00:00:01.000Z", "confirmedVersion": 2}
    assert shown["reported"]["s2"]["version"] == 1 and len(shown["reported"]) == leaf_count


# ---------------------------------------- a merge patch that changes nothing (issue 27, row 6)


@pytest.mark.parametrize("patch, document, expected", [
    ({"a": {}}, {"a": {"x": 1}}, []),  # merges nothing into an object
    ({"a": {}}, {"a": {}}, []),
    ({"a": {}}, {"a": 5}, ["/a"]),  # replaces a number by an empty object
    ({"a": {}}, {}, ["/a"]),
    ({"gone": None}, {"a": 1}, []),  # removes nothing
    ({"a": None}, {"a": 1}, ["/a"]),
    ({"a": {"gone": None, "x": {}}}, {"a": {"x": {"y": 1}}}, []),
    ({"a": {"gone": None}}, {"a": 5}, ["/a/gone"]),  # a becomes {}: its leaf is renewed
    ({"a": {"b": 1}}, {"a": {"b": 1}}, ["/a/b"]),  # an equal value set again is a report
])
def test_a_merge_patch_touches_only_what_it_changes_in_the_document(patch, document, expected):
    assert MergePatch(patch).touched(document) == expected
    assert MergePatch(patch).touched() == MergePatch(patch).touched(None)


def test_a_merge_patch_of_an_empty_object_keeps_the_confirmation():
    from functions.device_state.item.fencing import Fence
    from functions.device_state.model.values import to_attribute
    from functions.device_state.write.planner import Planner

    stored = {"deviceId": {"S": "d"}, "sk": {"S": "state"}, "version": {"N": "3"}, "state": {"M": {}},
              "createdAt": {"S": "2026-01-01T00:00:00.000Z"}, "updatedAt": {"S": "2026-01-01T00:00:00.000Z"},
              "desired": to_attribute({"a": {"x": 1}}), "reported": to_attribute({"a": {"x": 1}}),
              "metaDesired": to_attribute({"/a/x": pack(2, 1)}), "metaReported": to_attribute({"/a/x": pack(3, 1)})}
    planned = Planner("devices", Fence(), 1_800_000_000.0).replace_state(
        stored, MergePatch({"a": {}}), None, "updated", section="reported")
    assert planned.device.entries["reported"] == {"/a/x": pack(3, 1)}
    assert metadata(planned.device.desired, planned.device.reported, planned.device.entries)[
        "desired"]["a"]["x"]["confirmedVersion"] == 3


# ------------------------------------- a leaf's pointer keys its metadata (issue 27, rows 3 and 5)


def test_a_leaf_pointer_past_the_limit_is_refused_before_anything_is_sent():
    from functions.device_state.errors import InvalidValue
    from functions.device_state.model.sections import MAX_POINTER_BYTES

    def three_names_and(last: str) -> dict:
        return {"a" * 1024: {"b" * 1024: {"c" * 1024: {last: 1}}}}

    at_the_limit = three_names_and("d" * (MAX_POINTER_BYTES - 3 * 1025 - 1))
    assert len(next(iter(leaves(at_the_limit)))) == MAX_POINTER_BYTES
    assert next_entries(at_the_limit, {}, (ALL,), pack(1, 1))
    for past in (three_names_and("d" * (MAX_POINTER_BYTES - 3 * 1025)), three_names_and("/" * 511)):  # / is ~1
        with pytest.raises(InvalidValue) as refused:
            next_entries(past, {}, (ALL,), pack(1, 1))
        assert refused.value.limit == "leaf-pointer" and str(MAX_POINTER_BYTES) in str(refused.value)


def test_the_later_version_wins_whatever_the_writers_clocks_said():
    """A read-free write replacing /a at version 4 on a clock 5 s behind the write that set
    /a/b at version 2: /a/b is version 4's."""
    entries = {"desired": {"/a/b": pack(2, 105), "/a": pack(4, 100)}}
    assert unpack(leaf_entries({"a": {"b": 1}}, entries["desired"])["/a/b"])[0] == 4
    assert metadata({"a": {"b": 1}}, {}, entries)["desired"]["a"]["b"]["version"] == 4


def test_kept_confirmations_are_the_newest_within_the_count_and_the_bytes():
    """Confirmations of cleared desires (``k``) are history: the newest are kept, at most
    ``MAX_CLEARED_KEPT`` and ``MAX_CLEARED_KEPT_BYTES`` of them; statuses that count always are."""
    from functions.device_state.model.desires import CONFIRMATION_BYTES, MAX_CLEARED_KEPT, MAX_CLEARED_KEPT_BYTES, kept

    desired = {"wanted": 1}
    entries = {"desired": {"/wanted": pack(9, 1)}, "status": {
        "/wanted": {"v": 9, "c": True},  # counts: its leaf is desired at version 9
        "/stale": {"v": 3, "c": True},  # its leaf has left desired unconfirmed: it counts no more
        **{f"/short{index:03d}": {"v": 1, "k": 2 + index} for index in range(150)}}}
    statuses = kept(desired, entries)
    assert statuses["/wanted"] == {"v": 9, "c": True} and "/stale" not in statuses
    confirmations = sorted(leaf for leaf in statuses if leaf.startswith("/short"))
    assert confirmations == [f"/short{index:03d}" for index in range(150 - MAX_CLEARED_KEPT, 150)]
    long_leaf = "/" + "x" * 4095  # the longest pointer: 4,126 bytes with its confirmation
    entries["status"].update({long_leaf: {"v": 1, "k": 500}, long_leaf[:-1] + "y": {"v": 1, "k": 1}})
    statuses = kept(desired, entries)
    confirmations = [leaf for leaf in statuses if "k" in statuses[leaf]]
    assert long_leaf in confirmations and long_leaf[:-1] + "y" not in confirmations
    assert len(confirmations) == MAX_CLEARED_KEPT  # the long one and the 99 newest short ones
    entries["status"][long_leaf[:-1] + "z"] = {"v": 1, "k": 499}  # two long ones pass the bytes
    confirmations = [leaf for leaf, status in kept(desired, entries).items() if "k" in status]
    assert confirmations == [long_leaf]  # the newest first: the older ones do not fit after it
    assert len(long_leaf) + CONFIRMATION_BYTES <= MAX_CLEARED_KEPT_BYTES < 2 * (len(long_leaf) + CONFIRMATION_BYTES)
    assert set(kept(desired, entries, keep_cleared=False)) == {"/wanted"}


@pytest.mark.parametrize("desired, shown", [
    ({}, True),
    ({"fan": {"mode": "eco"}}, True),  # a sibling of the cleared leaf
    ({"fan": {"speed": 5}}, False),  # set again
    ({"fan": {"speed": {"level": 5}}}, False),  # an object set there since
    ({"fan": 3}, False),  # a leaf above it
])
def test_a_cleared_desires_confirmation_counts_until_desired_holds_something_at_above_or_below_it(desired, shown):
    from functions.device_state.model.desires import cleared, superseded_by

    entries = {"status": {"/fan/speed": {"v": 2, "k": 3}, "/power": {"v": 2, "a": 200, "t": 1}}}
    assert cleared(desired, entries) == ({"/fan/speed": {"v": 2, "k": 3}} if shown else {})
    assert superseded_by("/fan/speed") == ["/fan", "/fan/speed"] and superseded_by("/power") == ["/power"]


def test_an_ack_code_is_one_the_contract_gives_a_meaning():
    from functions.device_state import Ack

    for code in (200, 202, 400, 409, 499, 500, 599):
        assert Ack("/p", 1, code).code == code
    for code in (199, 201, 204, 299, 301, 399, 600, True):
        with pytest.raises(ValueError):
            Ack("/p", 1, code)



def test_a_confirmation_below_an_object_is_nested():
    from functions.device_state.model.desires import nested_confirmations

    assert nested_confirmations({"/near/leaf": {"v": 1, "k": 2}}) is True
    assert nested_confirmations({"/top": {"v": 1, "k": 2}, "/a/b": {"v": 4, "a": 200}}) is False
