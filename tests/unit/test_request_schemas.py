"""The checker that holds requests to the schemas the routes declare (functions/api/validation.py):
it refuses what JSON Schema forbids, in the words the service has always used, converts what
it takes, and leaves to the service's own checks what they hold."""

from __future__ import annotations

from decimal import Decimal

import pytest

from functions.api.problems import BadRequest
from functions.api.routes import BY_OPERATION, TRANSACTION
from functions.api.validation import BODY, Checked, Ref, from_text, validate, within
from functions.device_state import InvalidDeviceId, InvalidFilter, InvalidPatch, JsonPatch, MergePatch, loads

OBJECT = {"type": "object", "required": ["state"], "additionalProperties": False,
          "properties": {"state": {"type": "object"}, "n": {"type": "integer", "minimum": 1, "maximum": 9}}}


def refusal(schema, value, where=BODY) -> str:
    with pytest.raises(BadRequest) as refused:
        validate(schema, value, where)
    return refused.value.detail


def test_an_object_is_refused_in_the_words_of_its_rule():
    assert refusal(OBJECT, []) == "the body must be a JSON object"
    assert refusal(OBJECT, {}) == "the body needs state"
    assert refusal(OBJECT, {"state": {}, "x": 1, "a": 2}) == "the body has unknown members: a, x"
    assert refusal(OBJECT, {"state": {}, "n": 10}) == "n must be an integer from 1 to 9"
    assert refusal(OBJECT, {"state": 1}) == "state must be a JSON object"
    assert refusal({"type": "object", "properties": {"put": OBJECT}}, {"put": {}}) == "put needs state"


@pytest.mark.parametrize("text", ["1e999999999", "-1e1000000", "1e999999", "1e18", "1e-999999999"])
def test_a_number_past_any_exponent_is_refused_not_a_500(text):
    """abs() of 1e1000000 is past the decimal context's exponents: an Overflow, answered 500."""
    assert refusal(OBJECT, {"state": {}, "n": loads(f'{{"n": {text}}}')["n"]}) == "n must be an integer from 1 to 9"
    assert validate({"type": "integer"}, loads(f"{text[0] if text[0] == '-' else ''}0e1000000")) == 0  # a zero is one


def test_a_whole_number_is_an_integer_and_a_boolean_is_not():
    assert validate(OBJECT, {"state": {}, "n": Decimal("3.0")}) == {"state": {}, "n": 3}
    assert isinstance(validate(OBJECT, loads('{"state": {}, "n": 3}'))["n"], int)
    assert refusal(OBJECT, {"state": {}, "n": True}) == "n must be an integer from 1 to 9"
    assert refusal({"type": "number", "minimum": 0, "maximum": 1}, Decimal("1.5"), "ttl") == \
        "ttl must be a number from 0 to 1"
    assert refusal({"type": "boolean", "enum": [True]}, 1, "delete") == "delete can only be true"


def test_a_pattern_is_read_as_the_document_means_it():
    """ECMA-262's $ is the end of the text; Python's also matches before a final newline."""
    schema = {"type": "string", "pattern": "^[a-z]+$"}
    assert validate(schema, "abc") == "abc"
    assert refusal(schema, "abc\n", "x") == "x must match ^[a-z]+$"


def test_text_is_read_by_its_schemas_type():
    integer = {"type": "integer", "minimum": 1, "maximum": 100}
    assert from_text(integer, "007", "limit") == 7
    for raw in ("", "-1", "1e2", "٣", "0", "101", "1" * 19):
        with pytest.raises(BadRequest, match="limit must be an integer from 1 to 100"):
            from_text(integer, raw, "limit")
    assert from_text({"type": "boolean"}, "true", "b") is True
    with pytest.raises(BadRequest, match="b must be true or false"):
        from_text({"type": "boolean"}, "TRUE", "b")


def _shout(value: str) -> str:
    if value == "bad":
        raise InvalidDeviceId("no")
    return value.upper()


def test_a_checked_schema_leaves_its_refusal_to_its_check_or_its_problem():
    device = Checked({"type": "string"}, within(_shout), validate=False)
    assert validate(device, "a") == "A"
    with pytest.raises(InvalidDeviceId, match="^operations\\[0\\].deviceId: no$"):
        validate(device, "bad", "operations[0].deviceId")
    with pytest.raises(InvalidDeviceId, match="^no$"):
        validate(device, "bad")  # at the top of the body, as the library says it
    filtered = Checked({"type": "string", "maxLength": 2}, problem=InvalidFilter)
    with pytest.raises(InvalidFilter, match="filter must be 0 to 2 characters"):
        validate(filtered, "abc", "filter")


def test_any_of_names_what_the_closest_form_lacks():
    schema = TRANSACTION.schema["properties"]["operations"]["items"]
    with pytest.raises(BadRequest) as refused:
        validate(schema, {"deviceId": "a"}, "operations[0]")
    assert refused.value.detail == "operations[0] needs one of mergePatch, jsonPatch, put, delete, check"
    with pytest.raises(BadRequest) as refused:
        validate(schema, {"deviceId": "a", "delete": True, "section": "state"}, "operations[0]")
    assert refused.value.detail == "operations[0] has unknown members: section"
    with pytest.raises(BadRequest) as refused:
        validate(schema, {"deviceId": "a", "put": {"state": {}}, "ifNoneMatch": "x"}, "operations[0]")
    assert refused.value.detail == "operations[0].ifNoneMatch can only be *"
    for clashing, detail in (({"mergePatch": {"x": 1}, "delete": True}, "may hold delete or mergePatch, not both"),
                             ({"put": {"state": {}}, "ifMatch": "*", "ifNoneMatch": "*"},
                              "may hold ifMatch or ifNoneMatch, not both"),
                             ({"mergePatch": {}, "delete": True, "check": True},
                              "may hold only one of check, delete, mergePatch")):
        with pytest.raises(BadRequest) as refused:
            validate(schema, {"deviceId": "a", **clashing}, "operations[0]")
        assert refused.value.detail == f"operations[0] {detail}"  # not "has unknown members: delete"
    with pytest.raises(BadRequest) as refused:
        validate(schema, {"deviceId": "a", "mergePatch": {}, "delete": True, "bogus": 1}, "operations[0]")
    assert "unknown members" in refused.value.detail and "bogus" in refused.value.detail


def test_a_transaction_operation_becomes_the_library_operation_its_form_names():
    entry = validate(TRANSACTION, {"operations": [{"deviceId": "a", "jsonPatch": [{"op": "remove", "path": "/x"}],
                                                   "ifMatch": '"3"', "section": "desired"}]})["operations"][0]
    operation = entry.operation
    assert (operation.action, operation.device_id, operation.expected_version, operation.section) == \
        ("update", "a", 3, "desired")
    assert isinstance(operation.update_fn, JsonPatch) and entry.sections == {"desired"}
    put = validate(TRANSACTION, {"operations": [{"deviceId": "a", "put": {"state": {}, "reported": {"p": 1}},
                                                 "ifNoneMatch": "*", "leaseToken": "0" * 32}]})["operations"][0]
    assert (put.operation.action, put.sections, put.lease_token) == ("create", {"reported"}, "0" * 32)
    with pytest.raises(InvalidPatch, match=r"^operations\[0\]\.jsonPatch: "):
        validate(TRANSACTION, {"operations": [{"deviceId": "a", "jsonPatch": [{"op": 1, "path": "/x"}]}]})


def test_a_patch_body_is_the_library_patch_its_media_type_names():
    content = BY_OPERATION["patchDevice"].body.content
    assert isinstance(validate(content["application/merge-patch+json"], {"a": 1}), MergePatch)
    assert isinstance(validate(content["application/json-patch+json"], [{"op": "remove", "path": "/a"}]), JsonPatch)


def test_a_reference_is_followed():
    assert validate(Ref("Thing", {"type": "string"}), "x") == "x"
    assert refusal(Ref("Thing", {"type": "string"}), 1, "thing") == "thing must be a string"
