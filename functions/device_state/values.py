"""JSON values as DynamoDB stores them: exact ``Decimal`` numbers, DynamoDB's limits
checked before any write, and the low-level attribute-value conversion."""

from __future__ import annotations

import json
import re
from decimal import Decimal

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from .errors import InvalidDeviceId, InvalidValue, ItemTooLarge

DEVICE_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")

# DynamoDB's own limits (measured on DynamoDB Local, which refuses exactly these).
MAX_SIGNIFICANT_DIGITS = 38
MAX_EXPONENT = 125  # largest magnitude 9.99...E+125
MIN_EXPONENT = -130  # smallest magnitude 1E-130
MAX_STATE_DEPTH = 31  # the state map itself is one level; 32 levels in all per attribute
MAX_MEMBER_NAME_BYTES = 65535
MAX_ITEM_BYTES = 400 * 1024

class _ExactDeserializer(TypeDeserializer):
    """boto3 reads numbers through a 38-digit context that traps rounding, so a valid
    number DynamoDB sends in long form (1E+38 arrives as a 1 and 38 zeros) would fail to
    read. Every number DynamoDB holds is an exact Decimal as written."""

    def _deserialize_n(self, value):
        return Decimal(value)


_serializer = TypeSerializer()
_deserializer = _ExactDeserializer()


def validate_device_id(device_id) -> str:
    if not isinstance(device_id, str) or not DEVICE_ID_PATTERN.fullmatch(device_id):
        raise InvalidDeviceId(
            "deviceId must be 1-128 characters of A-Z a-z 0-9 . _ : -"
        )
    return device_id


def _reject_constant(name: str):
    raise InvalidValue(f"{name} is not a number JSON or DynamoDB can hold", limit="number-finite")


def loads(text: str | bytes):
    """Parse JSON with every number as an exact ``Decimal``; NaN/Infinity refused."""
    try:
        return json.loads(
            text, parse_float=Decimal, parse_int=Decimal, parse_constant=_reject_constant
        )
    except RecursionError:
        raise InvalidValue("JSON nesting is too deep", limit="nesting-depth") from None


def dumps(value) -> str:
    """Serialize to JSON, numbers exactly as their ``Decimal`` value (never a float)."""
    parts: list[str] = []
    _encode(value, parts.append)
    return "".join(parts)


def _encode(value, out) -> None:
    if value is None:
        out("null")
    elif value is True:
        out("true")
    elif value is False:
        out("false")
    elif isinstance(value, str):
        out(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, (Decimal, int)):
        out(str(value))
    elif isinstance(value, dict):
        out("{")
        for index, (key, member) in enumerate(value.items()):
            if index:
                out(",")
            out(json.dumps(key, ensure_ascii=False))
            out(":")
            _encode(member, out)
        out("}")
    elif isinstance(value, (list, tuple)):
        out("[")
        for index, member in enumerate(value):
            if index:
                out(",")
            _encode(member, out)
        out("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def check_number(number) -> Decimal:
    """Return ``number`` as a Decimal DynamoDB can hold exactly, or raise."""
    if isinstance(number, bool) or not isinstance(number, (Decimal, int)):
        raise InvalidValue(
            f"{type(number).__name__} is not an exact number; use Decimal or int",
            limit="number-exact",
        )
    number = Decimal(number)
    if not number.is_finite():
        raise InvalidValue("NaN and Infinity cannot be stored", limit="number-finite")
    if number.is_zero():
        return number
    if significant_digits(number) > MAX_SIGNIFICANT_DIGITS:
        raise InvalidValue(
            f"number {number} has more than {MAX_SIGNIFICANT_DIGITS} significant digits",
            limit="number-precision",
        )
    if not MIN_EXPONENT <= number.adjusted() <= MAX_EXPONENT:
        raise InvalidValue(
            f"number {number} is outside DynamoDB's range (1E-130 to 9.9E+125 in magnitude)",
            limit="number-range",
        )
    return number


def significant_digits(number: Decimal) -> int:
    """Digits without leading and trailing zeros, as DynamoDB counts them (context-free:
    ``normalize()`` would round to the context's precision)."""
    return len("".join(map(str, number.as_tuple().digits)).strip("0"))


def check_state(state) -> None:
    """Refuse a state that DynamoDB could not store exactly (item size aside)."""
    if not isinstance(state, dict):
        raise InvalidValue("state must be a JSON object", limit="state-object")
    _check_value(state, 1)


def _check_value(value, depth: int) -> None:
    if isinstance(value, dict):
        if depth > MAX_STATE_DEPTH:
            raise _too_deep()
        for key, member in value.items():
            if not isinstance(key, str):
                raise InvalidValue("object member names must be strings", limit="member-name")
            if not key:
                raise InvalidValue("empty object member names cannot be stored", limit="member-name")
            if len(key.encode("utf-8", "surrogatepass")) > MAX_MEMBER_NAME_BYTES:
                raise InvalidValue(
                    f"object member names are limited to {MAX_MEMBER_NAME_BYTES} bytes",
                    limit="member-name",
                )
            _check_value(member, depth + 1)
    elif isinstance(value, list):
        if depth > MAX_STATE_DEPTH:
            raise _too_deep()
        for member in value:
            _check_value(member, depth + 1)
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidValue("strings must be valid Unicode (no lone surrogates)", limit="string") from None
    elif value is None or isinstance(value, bool):
        pass
    else:
        check_number(value)


def _too_deep() -> InvalidValue:
    return InvalidValue(
        f"state nests objects and arrays more than {MAX_STATE_DEPTH} levels deep",
        limit="nesting-depth",
    )


def to_attribute(value) -> dict:
    return _serializer.serialize(value)


def from_attribute(attribute: dict):
    return _deserializer.deserialize(attribute)


def item_size(item: dict) -> int:
    """An upper estimate of a low-level item's size by DynamoDB's sizing rules."""
    return sum(len(name.encode()) + _attribute_size(value) for name, value in item.items())


def _attribute_size(attribute: dict) -> int:
    (kind, value), = attribute.items()
    if kind == "S":
        return len(value.encode("utf-8"))
    if kind == "N":
        return (significant_digits(Decimal(value)) + 1) // 2 + 3  # integer and fraction halves, sign
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "M":
        return 3 + sum(
            1 + len(name.encode()) + _attribute_size(member) for name, member in value.items()
        )
    if kind == "L":
        return 3 + sum(1 + _attribute_size(member) for member in value)
    if kind == "B":
        return len(value)
    raise ValueError(f"unexpected attribute type {kind}")


def check_item_size(item: dict) -> None:
    size = item_size(item)
    if size > MAX_ITEM_BYTES:
        raise ItemTooLarge(
            f"the device item would be about {size} bytes; DynamoDB's limit is {MAX_ITEM_BYTES}"
        )
