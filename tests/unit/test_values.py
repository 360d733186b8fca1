"""JSON with exact decimals, and DynamoDB's limits, without any engine."""

from decimal import Decimal

import pytest

from functions.device_state import InvalidDeviceId, InvalidValue
from functions.device_state.model.values import (
    check_number,
    check_state,
    dumps,
    item_size,
    loads,
    to_attribute,
    validate_device_id,
)


def test_numbers_parse_as_exact_decimals():
    parsed = loads('{"a": 0.1, "b": 0.2, "i": 12345678901234567890123456789012345678, "e": 1.5e3}')
    assert parsed["a"] + parsed["b"] == Decimal("0.3")
    assert parsed["i"] == Decimal("12345678901234567890123456789012345678")
    assert all(isinstance(v, Decimal) for v in parsed.values())


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}'])
def test_nan_and_infinity_are_refused(text):
    with pytest.raises(InvalidValue) as caught:
        loads(text)
    assert caught.value.limit == "number-finite"


@pytest.mark.parametrize("text", ["1e9999999999999999999", "-1E+9999999999999999999", "1e-9999999999999999999",
                                  "1." + "0" * 5000 + "1e9999999999999999999"])
def test_a_number_whose_exponent_decimal_cannot_hold_is_out_of_range_not_a_crash(text):
    """Decimal raised InvalidOperation past an exponent of 999999999999999999: a 500 on every body."""
    with pytest.raises(InvalidValue) as caught:
        loads(f'{{"a": {text}}}')
    assert caught.value.limit == "number-range"
    assert loads('{"a": 0e9999999999999999999, "b": -0.000E-9999999999999999999}') == {"a": 0, "b": 0}


def test_absurd_nesting_is_a_value_error_not_a_crash():
    with pytest.raises(InvalidValue):
        loads("[" * 100000 + "]" * 100000)


@pytest.mark.parametrize(
    "text",
    ['{"x":0.1}', '{"x":1E+2}', '{"x":-0}', '{"x":[1,2.50,"s",true,false,null]}', '{"ü":"日本"}', '{}'],
)
def test_dumps_writes_numbers_exactly_and_round_trips(text):
    value = loads(text)
    again = loads(dumps(value))
    assert again == value
    assert dumps(loads('{"x": 0.30000000000000004}')) == '{"x":0.30000000000000004}'


def test_dumps_refuses_floats():
    with pytest.raises(TypeError):
        dumps({"x": 0.1})


@pytest.mark.parametrize(
    "number, limit",
    [
        (Decimal("1" * 39), "number-precision"),
        (Decimal("1E+126"), "number-range"),
        (Decimal("-1E+126"), "number-range"),
        (Decimal("1E-131"), "number-range"),
        (Decimal("NaN"), "number-finite"),
        (Decimal("sNaN"), "number-finite"),
        (0.1, "number-exact"),
        (True, "number-exact"),
    ],
)
def test_numbers_dynamodb_cannot_hold(number, limit):
    with pytest.raises(InvalidValue) as caught:
        check_number(number)
    assert caught.value.limit == limit


@pytest.mark.parametrize(
    "number",
    [Decimal("1" * 38), Decimal("1" * 38 + "000"), Decimal("0.000" + "1" * 38), Decimal("9.9E+125"),
     Decimal("1E-130"), Decimal(0), Decimal("-0"), 7],
)
def test_numbers_dynamodb_holds(number):
    assert check_number(number) == number


def test_state_checks_walk_the_whole_document():
    check_state({"a": [{"b": [Decimal(1), "x", None, True]}]})
    with pytest.raises(InvalidValue):
        check_state({"a": [{"b": [Decimal("NaN")]}]})
    with pytest.raises(InvalidValue):
        check_state({"a": [{"": 1}]})
    with pytest.raises(InvalidValue):
        check_state({"a": "\ud800"})


@pytest.mark.parametrize("good", ["a", "lamp-1", "A.b_c:d-9", "x" * 128])
def test_good_device_ids(good):
    assert validate_device_id(good) == good


@pytest.mark.parametrize("bad", ["", "x" * 129, "a b", "a/b", "a%2F", "é", "a\n", None, 1])
def test_bad_device_ids(bad):
    with pytest.raises(InvalidDeviceId):
        validate_device_id(bad)


def test_item_size_takes_every_attribute_type_dynamodb_stores():
    """A state item holds string sets (a connected device's connections): a listing page sizes it."""
    for attribute in ({"S": "ab"}, {"N": "12"}, {"B": b"ab"}, {"SS": ["ab", "c"]}, {"NS": ["1", "2"]},
                      {"BS": [b"ab"]}, {"M": {"a": {"S": "b"}}}, {"L": [{"S": "b"}]}, {"NULL": True}, {"BOOL": False}):
        assert item_size({"a": attribute}) >= 2, attribute
    assert item_size({"a": {"SS": ["ab", "c"]}}) >= 1 + 3


def test_item_size_counts_names_values_and_nesting():
    assert item_size({"ab": to_attribute("xyz")}) == 5
    nested = item_size({"s": to_attribute({"k": ["v"]})})
    assert nested == 1 + (3 + 1 + 1 + (3 + 1 + 1))
    assert item_size({"n": to_attribute(Decimal("12345"))}) >= 1 + 3


# ------------------------------------------------ issue 13: hostile client JSON


@pytest.mark.parametrize("text", ['{"\\ud800": 1}', '"\\ud800x"', '["ok", {"a": "\\udfff"}]'])
def test_lone_surrogates_in_client_json_are_refused(text):
    with pytest.raises(InvalidValue) as caught:
        loads(text)
    assert caught.value.limit == "unicode"


def test_paired_surrogate_escapes_are_one_valid_character():
    assert loads('"\\ud83d\\ude00"') == "\U0001F600"


@pytest.mark.parametrize("depth", [65, 900])
def test_client_json_deeper_than_64_is_refused_without_recursion(depth):
    with pytest.raises(InvalidValue) as caught:
        loads('{"a":' * depth + "1" + "}" * depth)
    assert caught.value.limit == "nesting-depth"
    assert loads("[" * 64 + "]" * 64) is not None


@pytest.mark.parametrize("number, attribute", [
    ("1.0000000000000000000000000000000000000000", "1"),
    ("1" + "0" * 41, "1E+41"),
    ("0E+200", "0"),
    ("-0E-200", "0"),
    ("1.50", "1.50"),
])
def test_to_attribute_writes_an_equal_spelling_dynamodb_accepts(number, attribute):
    assert to_attribute(Decimal(number)) == {"N": attribute}
    assert check_number(Decimal(number)) == Decimal(number)


def test_the_nesting_limit_counts_the_state_object_itself_as_the_docs_limits_table_says():
    """resource.md said 31 levels below the state object, which refused the 31st (a docs review):
    31 levels counting the state itself, 30 objects below it."""
    from pathlib import Path

    from functions.device_state.model.values import MAX_STATE_DEPTH, check_state

    def nested(below: int) -> dict:
        state: dict = {}
        for _ in range(below):
            state = {"a": state}
        return state

    check_state(nested(MAX_STATE_DEPTH - 1))
    with pytest.raises(InvalidValue):
        check_state(nested(MAX_STATE_DEPTH))
    limits = (Path(__file__).parents[2] / "docs" / "api" / "resource.md").read_text()
    assert (f"| state nesting | {MAX_STATE_DEPTH} levels counting the state object itself "
            f"({MAX_STATE_DEPTH - 1} objects or arrays below it;") in limits
