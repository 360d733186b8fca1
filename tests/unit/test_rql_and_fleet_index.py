"""The fleet filter's parser (positions of errors, limits) and the FLEET_INDEX declaration,
with what a compiled patch does to a declared field's index attribute."""

from __future__ import annotations

import json
import random
import re
import string
import time
from decimal import Decimal

import pytest

from functions.device_state import FleetIndex, FleetIndexError, InvalidFilter, JsonPatch, MergePatch
from functions.device_state.write.compiled import compile_patch
from functions.device_state.fleet import rql
from functions.device_state.fleet.index import MAX_FIELDS, MAX_STRING_BYTES, compiled_attributes

FLEET = FleetIndex.parse("reported/firmware:string, reported/battery:number,reported/on:boolean,"
                         "state/a~1b/c~0d:string")


@pytest.mark.parametrize("text, position, words", [
    ("", 0, "empty"),
    ("eq(reported/x", 13, "expected ','"),
    ("eq(reported/x,)", 14, "expected a value"),
    ("eq(reported/x,'a')", 14, "expected a value"),
    ('eq(reported/x,"a)', 14, "string"),
    ("eq(reported/x,1) trailing", 17, "after the filter"),
    ("equals(reported/x,1)", 0, "expected one of"),
    ("eq(x,1)", 3, "not a path"),
    ("eq(delta/x,1)", 3, "delta only in exists"),
    ("and(eq(reported/x,1),)", 21, "expected one of"),
    ('like(reported/x,"a*b*")', 16, "prefix ending in *"),
    ("like(reported/x,1)", 16, "prefix ending in *"),
    ("eq(reported/x,null)", 14, "expected a value"),
    ("eq(reported/x,01)", 15, "expected ')'"),
    ("eq(reported/x,1e99999999999999999999)", 14, "outside what a device can hold"),
    ("gt(reported/x,1e-200)", 14, "outside what a device can hold"),
    ("eq(reported/x,1234567890123456789012345678901234567890)", 14, "outside what a device can hold"),
    ('eq(reported/x,"\\ud800")', 14, "not storable text"),
])
def test_a_malformed_filter_is_refused_at_its_position(text, position, words):
    with pytest.raises(InvalidFilter) as refused:
        rql.parse(text)
    assert refused.value.position == position
    assert words in str(refused.value) and f"at position {position}" in str(refused.value)


def test_limits_of_a_filter():
    with pytest.raises(InvalidFilter, match="deeper"):
        rql.parse("not(" * 40 + "exists(state/a)" + ")" * 40)
    with pytest.raises(InvalidFilter, match="more than"):
        rql.parse("or(" + ",".join(["exists(state/a)"] * 250) + ")")
    with pytest.raises(InvalidFilter, match="at most"):
        rql.parse("in(state/a," + ",".join(map(str, range(101))) + ")")
    with pytest.raises(InvalidFilter, match="longer"):
        rql.parse('eq(state/a,"' + "x" * 5000 + '")')


def test_a_filter_parses_into_its_tree_with_json_values():
    node = rql.parse(' and( eq(reported/firmware,"2.1\\u00e9"), in(state/a~1b,1,-2.5e1,true) , not(exists(delta)) ) ')
    first, second, third = node.children
    assert first.value == "2.1é" and first.path.parts == ("firmware",)
    assert second.path.parts == ("a/b",) and second.values == (Decimal(1), Decimal("-25"), True)
    assert third.child.path.section == "delta" and third.child.path.parts == ()


def test_judging_keeps_json_types_apart_and_compares_strings_by_utf8():
    documents = {"state": {"n": 1, "b": True, "s": "\uffff", "t": "\U00010000"}, "desired": {}, "reported": {}}
    assert rql.matches(rql.parse("eq(state/n,1.0)"), documents)
    assert not rql.matches(rql.parse("eq(state/b,1)"), documents)
    assert not rql.matches(rql.parse('gt(state/n,"0")'), documents)
    assert rql.matches(rql.parse('ne(state/n,"1")'), documents)  # undeclared: any type
    assert rql.matches(rql.parse('gt(state/t,"\uffff")'), documents)  # UTF-8 order, not UTF-16
    assert not rql.matches(rql.parse("exists(state/missing)"), documents)
    assert rql.matches(rql.parse("not(exists(state/missing))"), documents)


@pytest.mark.parametrize("declaration, words", [
    ("reported/x", "path:type"),
    ("reported/x:float", "path:type"),
    ("other/x:string", "starts with"),
    ("reported:string", "starts with"),
    ("reported//x:string", "non-empty"),
    ("reported/a~2:string", "escaped"),
    ("reported/x:string,reported/x:number", "twice"),
    (",".join(f"state/f{n}:number" for n in range(MAX_FIELDS + 1)), "at most"),
])
def test_a_bad_declaration_says_why(declaration, words):
    with pytest.raises(FleetIndexError, match=words):
        FleetIndex.parse(declaration)


def test_declared_fields_and_their_indexes():
    assert [field.path for field in FLEET.fields] == ["reported/firmware", "reported/battery", "reported/on",
                                                      "state/a~1b/c~0d"]
    assert FLEET.fields[3].parts == ("a/b", "c~d")
    assert FleetIndex.parse(FLEET.declaration) == FLEET
    names = [index["IndexName"] for index in FLEET.global_secondary_indexes()]
    assert len(set(names)) == 4 and all(re.fullmatch(r"[A-Za-z0-9_.-]{3,255}", name) for name in names)
    assert not FleetIndex.parse("") and FleetIndex.parse(" ").global_secondary_indexes() == []


def test_only_values_of_the_declared_type_are_indexed():
    firmware, battery, on, _ = FLEET.fields
    assert firmware.encode("") == {"S": "="} and firmware.decode({"S": "=2.1"}) == "2.1"
    assert firmware.encode("x" * (MAX_STRING_BYTES + 1)) is None and firmware.encode(2) is None
    assert battery.encode(True) is None and battery.encode(Decimal("1.5")) == {"N": "1.5"}
    assert on.encode(1) is None and on.encode(False) == {"N": "0"} and on.decode({"N": "1"}) is True
    sets, removes = FLEET.attributes("d", {"reported": {"firmware": 2, "battery": 3}, "state": {}})
    assert set(sets) == {battery.attribute, "ixShard"} and set(removes) == {firmware.attribute, on.attribute,
                                                                            FLEET.fields[3].attribute}


def test_what_a_compiled_patch_does_to_each_declared_field():
    fields = FLEET.in_sections(("reported",))
    firmware, battery, on = fields

    def effects(patch):
        return compile_patch(patch, "reported").effects

    values, operands, removes = compiled_attributes(fields, effects(MergePatch({"firmware": "3", "on": None})))
    assert values == {firmware.attribute: {"S": "=3"}} and operands == {} and removes == [on.attribute]
    values, operands, removes = compiled_attributes(fields, effects(JsonPatch(
        [{"op": "increment", "path": "/battery", "value": 2}])))
    assert values == {} and list(operands) == [battery.attribute] and "+" in operands[battery.attribute]
    values, operands, removes = compiled_attributes(fields, effects(JsonPatch(
        [{"op": "increment", "path": "/firmware", "value": 2}])))
    assert (values, operands, removes) == ({}, {}, [firmware.attribute])
    values, _, removes = compiled_attributes(fields, effects(JsonPatch(
        [{"op": "add", "path": "/firmware", "value": {"x": 1}}])))
    assert values == {} and removes == [firmware.attribute]
    assert compiled_attributes(fields, effects(MergePatch({"other": 1}))) == ({}, {}, [])


def test_two_members_set_below_a_field_remove_its_index_attribute_once():
    fields = FleetIndex.parse("reported/a:string").fields
    effects = compile_patch(MergePatch({"a": {"b": 1, "c": 2}}), "reported").effects
    assert compiled_attributes(fields, effects) == ({}, {}, [fields[0].attribute])


def test_the_longest_cursors_fit_the_form_the_service_takes():
    """A fleet query's longest (16 shards, each at a device id of the longest and a string of the
    longest indexed, in 4-byte characters) and the plain listing's longest (a key of DynamoDB's
    largest, 2,048 and 1,024 bytes) stay inside the cursor form the service takes, so no page's
    cursor is refused."""
    from functions.api.routes import LISTING_CURSOR_PATTERN
    from functions.device_state.fleet.cursors import CursorSeal
    from functions.device_state.fleet.query import SHARDS, _cursor_body
    from functions.device_state.model.values import MAX_DEVICE_ID_CHARS

    seal = CursorSeal()
    spellings = random.Random(7)  # distinct ids and values, as little alike as they may be
    for letters in ("\U0001F600", "".join(map(chr, range(1, 32))) + '"\\', "".join(map(chr, range(32, 127)))):
        positions = []
        for _ in range(SHARDS):
            device_id = "".join(spellings.choice(string.ascii_letters + string.digits + "._:-")
                                for _ in range(MAX_DEVICE_ID_CHARS))
            value = "".join(spellings.choice(letters) for _ in range(MAX_STRING_BYTES // len(letters[0].encode())))
            assert FleetIndex.parse("state/s:string").fields[0].holds(value)
            positions.append((device_id, value))
        position = _cursor_body(99, positions)
        cursor = seal.seal(["query", "f", None, ""], position)
        assert re.fullmatch(LISTING_CURSOR_PATTERN, cursor), len(cursor)
        assert seal.open(["query", "f", None, ""], cursor) == json.loads(json.dumps(position))
    cursor = seal.seal(["devices"], ["~" * 2048, "\U0001F600" * 256])
    assert re.fullmatch(LISTING_CURSOR_PATTERN, cursor), len(cursor)

def test_a_string_longer_than_the_index_holds_is_refused_as_such_not_as_another_type():
    """A value past MAX_STRING_BYTES is stored but not indexed: no query finds a device by it
    (the refusal said the string "is not a string")."""
    from functions.device_state.fleet.cursors import CursorSeal
    from functions.device_state.fleet.query import FleetQuery

    query = FleetQuery(None, FLEET, time.time, CursorSeal())
    with pytest.raises(InvalidFilter, match=f"up to {MAX_STRING_BYTES} bytes.*longer"):
        query.parse('eq(reported/firmware,"' + "x" * (MAX_STRING_BYTES + 1) + '")')
    with pytest.raises(InvalidFilter, match="is not a string"):
        query.parse("eq(reported/firmware,7)")
    query.parse('eq(reported/firmware,"' + "x" * MAX_STRING_BYTES + '")')
