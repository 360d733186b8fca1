"""JSON values as DynamoDB stores them: exact ``Decimal`` numbers, DynamoDB's limits
checked before any write, and the low-level attribute-value conversion."""

from __future__ import annotations

import json
import re
from decimal import Context, Decimal, InvalidOperation

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from ..errors import InvalidDeviceId, InvalidValue, ItemTooLarge

MAX_DEVICE_ID_CHARS = 128
MAX_VERSION = 10 ** 18 - 1  # versions a client may name (paths, queries, since): at most 18 digits
DEVICE_ID_PATTERN = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_DEVICE_ID_CHARS}}}")

# DynamoDB's own limits (measured on DynamoDB Local, which refuses exactly these).
MAX_SIGNIFICANT_DIGITS = 38
MAX_EXPONENT = 125  # largest magnitude 9.99...E+125
MIN_EXPONENT = -130  # smallest magnitude 1E-130
RANGE = "1E-130 to under 1E+126 in magnitude"
MAX_STATE_DEPTH = 31  # the state map itself is one level; 32 levels in all per attribute
MAX_ITEM_BYTES = 400 * 1024
# A page's items as stored (devices of a listing, changes of a feed), in bytes: no more than one
# item of the largest size, so a page's answer is never larger than the largest item's own,
# which stays within Lambda's 6 MB answer: a control character stored as 1 byte is 7 in Lambda's
# response object (escaped in the body, then again), so a page of changes is at most 2.9 MB, and
# one of devices, which show desired twice (in desired and in delta), 5.7 MB. A page stops
# before the item that would pass it (its first item is always taken), with a cursor to the rest.
MAX_PAGE_BYTES = MAX_ITEM_BYTES
# This service's own limits, far inside what DynamoDB Local handles (it fails on a member
# name past 50,000 bytes: `python -m bench.probe_limits`), so no state a client can store
# makes a later read, write or stream record fail.
MAX_MEMBER_NAME_BYTES = 1024
MAX_PATCH_OPERATIONS = 1000  # JSON Patch operations, or members of a merge patch (at any depth)
# Any JSON a client sends: deep enough for a state at DynamoDB's limit inside a request
# body (a transaction's put is 4 levels down), shallow enough for every recursive consumer.
MAX_JSON_DEPTH = 64

class _ExactDeserializer(TypeDeserializer):
    """boto3 reads numbers through a 38-digit context that traps rounding, so a valid
    number DynamoDB sends in long form (1E+38 arrives as a 1 and 38 zeros) would fail to
    read. Every number DynamoDB holds is an exact Decimal as written."""

    def _deserialize_n(self, value):
        return Decimal(value)


class _CanonicalSerializer(TypeSerializer):
    """boto3 passes numbers through a 38-digit context that traps rounding, so an equal
    spelling with more digits (``1.000…0``, ``1E41`` written out, ``0E+200``) would fail to
    serialise. Numbers are written in their canonical form instead (they are checked
    already by ``check_number``)."""

    def _serialize_n(self, value):
        return str(canonical(check_number(value)))


_serializer = _CanonicalSerializer()
_deserializer = _ExactDeserializer()


def validate_device_id(device_id) -> str:
    if not isinstance(device_id, str) or not DEVICE_ID_PATTERN.fullmatch(device_id):
        raise InvalidDeviceId(
            "deviceId must be 1-128 characters of A-Z a-z 0-9 . _ : -"
        )
    return device_id


DOT_SEGMENTS = (".", "..")  # ids no URL reaches: a client resolves /devices/.. to /


def check_new_id(kind: str, identifier: str, error: type[Exception]) -> str:
    """A new device's or enrollment's id (``kind`` names which): ``error`` for a dot segment, which
    the pattern allows (a stored one stays readable by the library)."""
    if identifier in DOT_SEGMENTS:
        raise error(f"{kind} may not be . or ..: no URL reaches it, since clients resolve dot segments")
    return identifier


def check_version(version, name: str = "expected_version") -> int:
    """A version a caller names: an int from 0 to ``MAX_VERSION`` (never a bool, nor text)."""
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
        raise ValueError(f"{name} must be an int from 0 to {MAX_VERSION}, not {version!r}")
    return version


def _decimal(text: str) -> Decimal:
    """A JSON number as a Decimal, one whose exponent is past what Decimal holds (1e99999999999999999999)
    refused as out of DynamoDB's range (a zero of it is 0, as any zero is)."""
    try:
        return Decimal(text)
    except InvalidOperation:
        if not re.search("[1-9]", re.split("[eE]", text)[0]):
            return Decimal(0)
        raise InvalidValue(f"number {text[:40]} is outside DynamoDB's range ({RANGE})", limit="number-range") from None


def _reject_constant(name: str):
    raise InvalidValue(f"{name} is not a number JSON or DynamoDB can hold", limit="number-finite")


def loads(text: str | bytes):
    """Parse client JSON with every number as an exact ``Decimal``; NaN/Infinity, lone
    surrogates (escaped as ``\\ud800``) and nesting past ``MAX_JSON_DEPTH`` refused, so
    nothing downstream (copies, patches, checks) recurses without bound or stores text
    that cannot be encoded again."""
    try:
        value = json.loads(
            text, parse_float=_decimal, parse_int=Decimal, parse_constant=_reject_constant
        )
    except RecursionError:
        raise _too_deep(MAX_JSON_DEPTH) from None
    _check_parsed(value)
    return value


def _check_parsed(value) -> None:
    """Depth and valid Unicode of a parsed document, without recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise _too_deep(MAX_JSON_DEPTH)
            if isinstance(node, dict):
                for key, member in node.items():
                    check_text(key)
                    stack.append((member, depth + 1))
            else:
                stack.extend((member, depth + 1) for member in node)
        elif isinstance(node, str):
            check_text(node)


def check_text(text: str) -> str:
    """Refuse a string that is not valid Unicode (a lone surrogate cannot be encoded as
    UTF-8, so it could be stored but never sent back)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidValue("strings and member names must be valid Unicode (no lone surrogates)",
                           limit="unicode") from None
    return text


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
        out(str(value) if value else "0")  # any zero (-0.0, 0E+5) as DynamoDB holds it
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
        return Decimal(0)  # 0E+200 and -0E-200 are 0, which DynamoDB holds
    if significant_digits(number) > MAX_SIGNIFICANT_DIGITS:
        raise InvalidValue(
            f"number {number} has more than {MAX_SIGNIFICANT_DIGITS} significant digits",
            limit="number-precision",
        )
    if not MIN_EXPONENT <= number.adjusted() <= MAX_EXPONENT:
        raise InvalidValue(
            f"number {number} is outside DynamoDB's range ({RANGE})",
            limit="number-range",
        )
    return number


def canonical(number: Decimal) -> Decimal:
    """An equal spelling DynamoDB accepts: 0 for any zero, trailing zeros dropped where
    the digits would pass 38 (``1.000…0`` → 1, ``100…0`` → 1E+41); others unchanged."""
    if number.is_zero():
        return Decimal(0)
    digits = len(number.as_tuple().digits)
    if digits <= MAX_SIGNIFICANT_DIGITS:
        return number
    return number.normalize(Context(prec=digits))  # exact: only zeros are dropped


def significant_digits(number: Decimal) -> int:
    """Digits without leading and trailing zeros, as DynamoDB counts them (context-free:
    ``normalize()`` would round to the context's precision)."""
    return len("".join(map(str, number.as_tuple().digits)).strip("0"))


def check_state(state, name: str = "state") -> None:
    """Refuse a state (or the section ``name``) that DynamoDB could not store exactly (item size aside)."""
    if not isinstance(state, dict):
        raise InvalidValue(f"{name} must be a JSON object", limit="state-object")
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
            check_text(key)
            check_member_name(key)
            _check_value(member, depth + 1)
    elif isinstance(value, list):
        if depth > MAX_STATE_DEPTH:
            raise _too_deep()
        for member in value:
            _check_value(member, depth + 1)
    elif isinstance(value, str):
        check_text(value)
    elif value is None or isinstance(value, bool):
        pass
    else:
        check_number(value)


def check_member_name(name: str) -> str:
    """Refuse a member name longer than ``MAX_MEMBER_NAME_BYTES`` (as UTF-8)."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_MEMBER_NAME_BYTES:
        raise InvalidValue(f"object member names are limited to {MAX_MEMBER_NAME_BYTES} bytes; "
                           f"one has {size}", limit="member-name")
    return name


def _too_deep(levels: int = MAX_STATE_DEPTH) -> InvalidValue:
    what = "state" if levels == MAX_STATE_DEPTH else "JSON"
    return InvalidValue(f"{what} nests objects and arrays more than {levels} levels deep", limit="nesting-depth")


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
    if kind == "NS":  # the journal's trimmed stamps; as a list of numbers, an upper estimate
        return 3 + sum(1 + _attribute_size({"N": member}) for member in value)
    if kind == "SS":  # a connected device's connections; as a list of strings, an upper estimate
        return 3 + sum(1 + len(member.encode("utf-8")) for member in value)
    if kind == "BS":
        return 3 + sum(1 + len(member) for member in value)
    raise ValueError(f"unexpected attribute type {kind}")


def check_item_size(item: dict) -> None:
    size = item_size(item)
    if size > MAX_ITEM_BYTES:
        raise ItemTooLarge(
            f"the device item would be about {size} bytes; DynamoDB's limit is {MAX_ITEM_BYTES}"
        )
