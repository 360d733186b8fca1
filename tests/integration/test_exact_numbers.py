"""Issue 13, item 1: numbers are exact or refused on every path (read-modify-write at a
version, the compiled single UpdateItem, and storing equal spellings), and text is valid
Unicode. Each case was a silent rounding, a 500 or a stored value that broke later reads."""

from __future__ import annotations

from decimal import Decimal

import pytest

from functions.device_state import DeviceStateManager, InvalidValue, JsonPatch, MergePatch
from functions.device_state.model.values import dumps, loads


def increment(value, **bounds):
    return JsonPatch([{"op": "increment", "path": "/n", "value": Decimal(value),
                       **{name: Decimal(bound) for name, bound in bounds.items()}}])


def test_increment_of_a_35_digit_number_at_a_version_is_exact(manager):
    manager.create("d", {"n": Decimal("12345678901234567890123456789012345")})
    device = manager.update("d", increment(1), expected_version=1)
    assert device.state["n"] == Decimal("12345678901234567890123456789012346")
    assert manager.get("d").state["n"] == Decimal("12345678901234567890123456789012346")


def _refused_and_unchanged(manager, write):
    manager.create("d", {"n": Decimal("1E+30")})
    with pytest.raises(InvalidValue) as caught:
        write(manager)
    assert caught.value.limit == "precision"
    device = manager.get("d")
    assert device.version == 1 and device.state["n"] == Decimal("1E+30")


def test_an_increment_at_a_version_whose_exact_result_needs_41_digits_is_refused(manager):
    _refused_and_unchanged(manager, lambda m: m.update("d", increment("1E-10"), expected_version=1))


@pytest.mark.dynamodb_local
def test_the_compiled_increment_agrees_dynamodb_refuses_an_inexact_sum(local_table):
    """Probed: DynamoDB Local answers ``SET n = n + :d`` whose exact result needs more than
    38 digits with a ValidationException (it does not round), so the compiled attempt
    falls back to read-modify-write, which refuses with the precision limit. (moto is no
    witness here: it crashes on 1E+30 and rounds to 28 digits elsewhere.)"""
    _refused_and_unchanged(DeviceStateManager(*local_table), lambda m: m.update_with_retry("d", increment("1E-10")))


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "at-a-version"])
def test_clamping_to_a_31_digit_max_is_exact(manager, compiled):
    top = Decimal("1234567890123456789012345678901")
    manager.create("d", {"n": top})
    patch = increment(1, max=top)
    device = manager.update_with_retry("d", patch) if compiled else manager.update("d", patch, expected_version=1)
    assert device.state["n"] == top
    assert manager.get("d").state["n"] == top


def test_a_clamp_makes_an_inexact_sum_exact(manager):
    manager.create("d", {"n": Decimal("1E+30")})
    assert manager.update_with_retry("d", increment("1E-10", max=5)).state["n"] == 5


@pytest.mark.parametrize("spelling, equal", [
    ("1.0000000000000000000000000000000000000000", Decimal(1)),
    ("1" + "0" * 41, Decimal("1E+41")),
    ("0E+200", Decimal(0)),
    ("0E-200", Decimal(0)),
    ("-0E-200", Decimal(0)),
])
@pytest.mark.parametrize("how", ["create", "merge", "add"])
def test_equal_spellings_with_more_digits_are_stored_as_the_equal_number(manager, spelling, equal, how):
    value = loads(spelling)
    if how == "create":
        manager.create("d", {"n": value})
    else:
        manager.create("d", {})
        patch = MergePatch({"n": value}) if how == "merge" else JsonPatch([{"op": "add", "path": "/n", "value": value}])
        manager.update_with_retry("d", patch)
    stored = manager.get("d").state["n"]
    assert stored == equal


@pytest.mark.parametrize("state", [{"\ud800": 1}, {"s": "\ud800x"}, {"l": ["ok", "\udfff"]}])
def test_lone_surrogates_are_refused_before_anything_is_stored(manager, state):
    with pytest.raises(InvalidValue) as caught:
        manager.create("d", state)
    assert caught.value.limit == "unicode"
    manager.create("d", {})
    with pytest.raises(InvalidValue):
        manager.update_with_retry("d", MergePatch(state))
    assert manager.get("d").state == {} and manager.get("d").version == 1


@pytest.mark.parametrize("spelling", ["-0.0", "0.00", "-0", "0E+5"])
@pytest.mark.parametrize("how", ["create", "merge", "add"])
def test_a_zero_is_answered_as_the_reads_show_it(manager, spelling, how):
    """DynamoDB holds every zero as 0: a write's answer says 0 too, not the spelling sent."""
    value = loads(spelling)
    if how == "create":
        answered = manager.create("d", {"n": value})
    else:
        manager.create("d", {})
        patch = MergePatch({"n": value}) if how == "merge" else JsonPatch([{"op": "add", "path": "/n", "value": value}])
        answered = manager.update_with_retry("d", patch)
    assert dumps(answered.state) == dumps(manager.get("d").state) == '{"n":0}'
