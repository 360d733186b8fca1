"""The one builder every request's placeholders come from."""

from __future__ import annotations

from decimal import Decimal

from boto3.dynamodb.conditions import Attr

from functions.device_state import MergePatch, table
from functions.device_state.write.compiled import compile_patch
from functions.device_state.write.expressions import NAME_PREFIX, VALUE_PREFIX, Expression, live, not_live, number


def test_one_attribute_one_placeholder_however_often_it_is_named():
    expr = Expression()
    assert expr.name("version") == f"{NAME_PREFIX}0"
    assert expr.name("state") == f"{NAME_PREFIX}1" and expr.name("version") == f"{NAME_PREFIX}0"
    assert expr.path("state", "a", "version") == f"{NAME_PREFIX}1.{NAME_PREFIX}2.{NAME_PREFIX}0"
    assert expr.names == {f"{NAME_PREFIX}0": "version", f"{NAME_PREFIX}1": "state", f"{NAME_PREFIX}2": "a"}


def test_equal_values_share_a_placeholder_and_numbers_are_typed_once():
    expr = Expression()
    one = expr.number(1)
    assert expr.value({"N": "1"}) == one and expr.value({"S": "1"}) != one
    assert number(Decimal("1.50")) == {"N": "1.50"} and number(7) == {"N": "7"}
    assert expr.values == {one: {"N": "1"}, f"{VALUE_PREFIX}1": {"S": "1"}}


def test_a_callers_boto3_condition_keeps_its_own_placeholders_apart():
    expr = Expression()
    ours = f"{expr.name('state')} = {expr.value({'S': 'x'})}"
    first = expr.condition(Attr("state").eq("y"))
    second = expr.condition(Attr("version").gt(2))  # a second condition numbers on
    assert first == "#n0 = :v0" and second == "#n1 > :v1" and ours == f"{NAME_PREFIX}0 = {VALUE_PREFIX}0"
    assert expr.names == {f"{NAME_PREFIX}0": "state", "#n0": "state", "#n1": "version"}
    assert expr.values == {f"{VALUE_PREFIX}0": {"S": "x"}, ":v0": {"S": "y"}, ":v1": {"N": "2"}}


def test_a_request_gets_no_empty_attribute_maps():
    expr = Expression()
    assert expr.attributes() == {}
    expr.name("sk")
    assert expr.attributes() == {"ExpressionAttributeNames": {f"{NAME_PREFIX}0": "sk"}}


def test_liveness_names_its_attributes_and_the_instant_through_the_builder():
    expr = Expression()
    condition = live(expr, 100) + " " + not_live(expr, 100)
    assert "#" not in condition.replace(NAME_PREFIX, "") and set(expr.names.values()) == {
        table.VERSION, table.DELETED_AT, table.TTL_ATTRIBUTE}
    assert list(expr.values.values()) == [{"N": "100"}]


def test_a_compiled_patch_allocates_from_the_builder_its_request_goes_on_with():
    compiled = compile_patch(MergePatch({"a": {"b": 1}, "version": 2}), table.DESIRED)
    assert compiled.root == compiled.expression.name(table.DESIRED)
    assert set(compiled.expression.names.values()) == {table.DESIRED, "a", "b", "version"}
    assert compiled.members == ["a", "a", "b", "version"]  # as often as named: its growth counts each
    assert compile_patch(MergePatch({"n": float("nan")})) is None  # no state holds it: read-modify-write decides
