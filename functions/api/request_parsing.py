"""Turning an API Gateway request into checked values: bodies, media types, entity
tags and preconditions (RFC 9110), query parameters. Refusals are ``HttpProblem``s."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from decimal import Decimal
from urllib.parse import unquote, unquote_to_bytes

from functions.device_state import CURSOR_PATTERN, Device, InvalidCursor, InvalidDeviceId, InvalidValue
from functions.device_state import (MAX_ACKS, MAX_EXPIRY_SECONDS, MIN_EXPIRY_SECONDS, Ack, DesireOptions,
                                    check_acks)
from functions.device_state import MAX_VERSION, loads, validate_device_id  # noqa: F401 (parse.MAX_VERSION)

from .problems import BadRequest, PayloadTooLarge, PreconditionFailed, UnsupportedMediaType

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# No item can exceed 400 KB, so a body past 1 MiB is refused before it is parsed.
MAX_BODY_BYTES = 1024 * 1024

_ETAG = re.compile(r'\s*(W/)?"([\x21\x23-\x7e\x80-\xff]*)"\s*(?:,|$)')
_VERSION = re.compile(r"[1-9][0-9]{0,17}")
# The form of every cursor the service issues, the plain listing's and a fleet query's alike (the
# library's, so the document states it exactly); which listing issued it, the library checks.
LISTING_CURSOR_PATTERN = f"^{CURSOR_PATTERN.pattern}$"


RESERVED_DEVICE_IDS = ("count",)  # /devices/count counts devices


def device_id(raw: str) -> str:
    return not_reserved(validate_device_id(unquote(raw)))


def not_reserved(device_id: str) -> str:
    if device_id in RESERVED_DEVICE_IDS:
        raise InvalidDeviceId(f"{device_id!r} is reserved: /devices/{device_id} is a route of its own")
    return device_id


LEASE_TOKEN_PATTERN = re.compile(r"[0-9a-f]{32}")


def lease_token(raw, name: str) -> str | None:
    """The secret ``leaseToken`` of a lease grant (32 hex digits), from a header or a JSON body."""
    if raw is None:
        return None
    if isinstance(raw, str) and LEASE_TOKEN_PATTERN.fullmatch(raw.strip()):
        return raw.strip()
    raise BadRequest(f"{name} must be the leaseToken of a lease grant (32 hex digits)")


def header(event, name: str) -> str | None:
    return event.headers.get(name)


def single_header(event, name: str) -> str | None:
    """A header that must be sent once (its value may itself hold commas, so two
    copies cannot be told from one): 400 when the request repeats it."""
    lowered = name.lower()
    copies = sum(len(values or []) for key, values in (event.get("multiValueHeaders") or {}).items()
                 if key.lower() == lowered)
    if copies > 1:
        raise BadRequest(f"{name} is given {copies} times; send it once")
    return header(event, name)




def decimal_integer(raw: str, name: str, low: int, high: int) -> int:
    """A decimal integer of ASCII digits, leading zeros allowed."""
    text = raw
    digits = text.lstrip("0") or ("0" if text else "")
    if not text.isascii() or not text.isdigit() or len(digits) > 18 or not low <= int(digits) <= high:
        raise BadRequest(f"{name} must be an integer from {low} to {high}")
    return int(digits)


def media_type(event) -> str | None:
    """The request's media type, lower-cased, without parameters; only UTF-8 text."""
    raw = single_header(event, "Content-Type")
    if raw is None:
        return None
    kind, *parameters = (part.strip() for part in raw.split(";"))
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise UnsupportedMediaType(f"only UTF-8 bodies are accepted, not charset={value.strip()}")
    return kind.lower()


def json_body(event, accepted: tuple[str, ...] = (JSON,)):
    """The request body parsed as JSON with exact decimals, after its media type and size."""
    kind = media_type(event)
    if kind not in accepted:
        raise UnsupportedMediaType(
            f"Content-Type must be {' or '.join(accepted)}" + (f", not {kind}" if kind else ""),
            headers={"Accept-Patch": ", ".join(accepted)} if MERGE_PATCH in accepted else None,
        )
    raw = event.get("body")
    if raw is None or raw == "":
        raise BadRequest("the request needs a JSON body")
    if event.get("isBase64Encoded"):
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest("the body is not valid base64") from None
    else:
        data = raw.encode("utf-8", "surrogatepass")
    if len(data) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"the body is {len(data)} bytes; the limit is {MAX_BODY_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the body is not valid UTF-8") from None
    try:
        return loads(text)
    except InvalidValue:
        raise
    except ValueError as error:
        raise BadRequest(f"malformed JSON: {error}") from None


def json_object(value, what: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object")
    missing = [name for name in required if name not in value]
    unknown = sorted(set(value) - set(required) - set(optional))
    if missing:
        raise BadRequest(f"{what} needs {', '.join(missing)}")
    if unknown:
        raise BadRequest(f"{what} has unknown members: {', '.join(unknown)}")
    return value


def document(value, what: str) -> dict:
    """A client's JSON object whose members are its own (a section of a device)."""
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return value


@dataclass(frozen=True)
class EntityTags:
    """A parsed If-Match / If-None-Match value: ``*`` or a list of entity tags. Only
    tags of the form ``"<version>"`` can ever match a device."""

    any: bool
    strong: frozenset
    weak: frozenset

    def matches_strong(self, version: int) -> bool:
        return self.any or version in self.strong

    def matches_weak(self, version: int) -> bool:
        return self.any or version in self.strong or version in self.weak


def entity_tags(event, name: str) -> EntityTags | None:
    raw = list_header(event, name)
    return None if raw is None else parse_entity_tags(raw, name)


def parse_entity_tags(raw: str, name: str) -> EntityTags:
    """``*`` or a list of entity tags (RFC 9110), as in If-Match and If-None-Match."""
    if not isinstance(raw, str):
        raise BadRequest(f"{name} must be a string")
    if raw.strip() == "*":
        return EntityTags(True, frozenset(), frozenset())
    strong, weak, position = set(), set(), 0
    while position < len(raw):
        match = _ETAG.match(raw, position)
        if not match or match.end() == position:
            raise BadRequest(f'{name} must be * or a list of entity tags such as "3"')
        if _VERSION.fullmatch(match.group(2)):
            (weak if match.group(1) else strong).add(int(match.group(2)))
        position = match.end()
    if position == 0:
        raise BadRequest(f"{name} is empty")
    return EntityTags(False, frozenset(strong), frozenset(weak))


@dataclass(frozen=True)
class Preconditions:
    if_match: EntityTags | None
    if_none_match: EntityTags | None

    @classmethod
    def of(cls, event) -> "Preconditions":
        return cls(entity_tags(event, IF_MATCH), entity_tags(event, IF_NONE_MATCH))

    @property
    def none(self) -> bool:
        return self.if_match is None and self.if_none_match is None

    def only_if_match_version(self) -> int | None:
        """The version of a lone ``If-Match: "<v>"``: the common case, which needs no read."""
        tags = self.if_match
        if self.if_none_match is None and tags and not tags.any and len(tags.strong) == 1 and not tags.weak:
            return next(iter(tags.strong))
        return None

    @property
    def create_only(self) -> bool:
        return self.if_match is None and self.if_none_match is not None and self.if_none_match.any

    def check(self, current: Device | None) -> None:
        """RFC 9110 13.2.2: If-Match (strong comparison), then If-None-Match (weak)."""
        if self.if_match is not None and (current is None or not self.if_match.matches_strong(current.version)):
            raise PreconditionFailed(
                "If-Match does not match the device" if current else "If-Match: the device does not exist",
                current=current,
            )
        if self.if_none_match is not None and current is not None and self.if_none_match.matches_weak(current.version):
            raise PreconditionFailed("If-None-Match matches the device", current=current)


def cursor(raw: str | None) -> str | None:
    """A cursor of the form this service issues, checked here so that no other string reaches
    the library (which checks that the listing asked issued it)."""
    if raw is None:
        return None
    if not CURSOR_PATTERN.fullmatch(raw):
        raise InvalidCursor("cursor is not one this service issued: pass nextCursor as it was given")
    return raw


def integer(query: dict, name: str, default: int | None, low: int, high: int) -> int | None:
    """An integer query parameter from ``low`` to ``high``, or ``default`` when absent."""
    raw = query.get(name)
    return default if raw is None else decimal_integer(raw, name, low, high)


INCLUDE = "include"
METADATA = "metadata"


def include_metadata(event) -> bool:
    """True when the query asks ``include=metadata`` (its value checked with the rest of the
    query, before the route's code runs)."""
    return INCLUDE in (event.get("multiValueQueryStringParameters") or event.get("queryStringParameters") or {})


IF_MATCH, IF_NONE_MATCH, IDEMPOTENCY_KEY, LEASE_TOKEN = "If-Match", "If-None-Match", "Idempotency-Key", "Lease-Token"
SERVICE_HEADERS = (IF_MATCH, IF_NONE_MATCH, IDEMPOTENCY_KEY, LEASE_TOKEN)
SINGLE_HEADERS = (IDEMPOTENCY_KEY, LEASE_TOKEN, "Content-Type")


def check_headers(event, taken: frozenset[str], takes_body: bool) -> None:
    """Every route's headers and body, before its code runs: a header of this service's
    (``SERVICE_HEADERS``) that the route does not take is a 400, so no caller believes a
    precondition, key or lease token applied that did not (a cache's conditional headers on
    a read are let through); ``SINGLE_HEADERS`` once; no body where the route takes none."""
    for name in SINGLE_HEADERS:
        single_header(event, name)
    sent = {name.lower() for name in (event.get("multiValueHeaders") or event.get("headers") or {})}
    reads = event.get("httpMethod") in ("GET", "HEAD")
    for name in SERVICE_HEADERS:
        if name.lower() in sent and name not in taken and not (reads and name in (IF_MATCH, IF_NONE_MATCH)):
            raise BadRequest(f"{name} does not apply to {event.get('httpMethod')} on this resource; nothing was done")
    if not takes_body and event.get("body") not in (None, ""):
        raise BadRequest("this request takes no body; nothing was done")


def list_header(event, name: str) -> str | None:
    """A header that is a list (RFC 9110 5.3): its field lines joined, in order."""
    lowered = name.lower()
    lines = [value for key, values in (event.get("multiValueHeaders") or {}).items() if key.lower() == lowered
             for value in values or []]
    return ", ".join(lines) if lines else header(event, name)


# What stands for bytes that are not UTF-8 in a decoded query: a lone surrogate (Python's
# surrogateescape, as the dev server decodes) or U+FFFD (a lossy decoder's replacement). A client
# that means U+FFFD writes it as a filter's JSON escape, \\ufffd.
_NOT_UTF8 = re.compile("[\ud800-\udfff\ufffd]")


def check_utf8(event) -> None:
    """Every request's path and query are UTF-8 text, checked first on every route: a byte
    that is no UTF-8, percent-encoded or not, is a 400 rather than a character guessed for it."""
    names = set(event.get("multiValueQueryStringParameters") or {}) | set(event.get("queryStringParameters") or {})
    texts = [*names, *(value for values in _raw_query(event).values() for value in values if value is not None)]
    try:
        path = unquote_to_bytes(event.get("path") or "").decode("utf-8")
    except UnicodeError:  # a lone surrogate (not encodable) or bytes that do not decode
        path = "\ufffd"
    if _NOT_UTF8.search(path) or any(_NOT_UTF8.search(text) for text in texts):
        raise BadRequest("the path and the query must be UTF-8 text: a byte that is no UTF-8 (or U+FFFD, which "
                         "stands in for one) is refused; in a filter, write U+FFFD as \\ufffd")


def query_parameters(event, allowed: frozenset[str]) -> dict[str, str]:
    """The query's parameters by name, each one of ``allowed`` and given once, ``include``
    only as ``metadata``: every route's query is checked so before its code runs."""
    unknown = sorted(set(_raw_query(event)) - allowed)
    if unknown:
        raise BadRequest(f"unknown query parameters: {', '.join(unknown)}")
    return query(event)


def query(event) -> dict[str, str]:
    result = {}
    for name, values in _raw_query(event).items():
        if len(values) != 1:
            raise BadRequest(f"query parameter {name} is given more than once")
        result[name] = values[0] if values[0] is not None else ""
    if result.get(INCLUDE, METADATA) != METADATA:
        raise BadRequest(f"{INCLUDE} can only be {METADATA}")
    return result


def _raw_query(event) -> dict[str, list]:
    multi = event.get("multiValueQueryStringParameters") or {}
    single = event.get("queryStringParameters") or {}
    return {name: multi.get(name) or [single.get(name)] for name in set(multi) | set(single)}


EXPIRES_IN, CLEAR_ON_CONFIRM = "expiresIn", "clearOnConfirm"
DESIRE_QUERY = (EXPIRES_IN, CLEAR_ON_CONFIRM)  # what a desired write's query says of its leaves


def desire_options(event) -> DesireOptions | None:
    """``?expiresIn=<seconds>&clearOnConfirm=true`` of a desired write, or None without them."""
    values = query(event)
    if not any(name in values for name in DESIRE_QUERY):
        return None
    clear = values.get(CLEAR_ON_CONFIRM, "false")
    if clear not in ("true", "false"):
        raise BadRequest(f"{CLEAR_ON_CONFIRM} must be true or false")
    return DesireOptions(integer(values, EXPIRES_IN, None, MIN_EXPIRY_SECONDS, MAX_EXPIRY_SECONDS), clear == "true")


def desire_fingerprint(event) -> list[str]:
    """What a desired write's options add to its Idempotency-Key's fingerprint: the options
    as they apply (``clearOnConfirm=false`` is the same request as without it)."""
    options = desire_options(event) if event.path.rstrip("/").endswith("/desired") else None
    if not options:
        return []
    return [f"expiresIn={options.expires_in}", f"clearOnConfirm={options.clear_on_confirm}"]


def _whole(value):
    """A JSON number that is a whole number, as an int (the service reads numbers exactly, as Decimal)."""
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value() \
            and abs(value) < 10 ** 18:
        return int(value)
    return value


def acks(body) -> list[Ack]:
    """The body of ``POST /devices/{id}/desired/acks``: ``{"acks": [{"path", "version", "code", "reason"}]}``."""
    listed = json_object(body, "the body", ("acks",))["acks"]
    if not isinstance(listed, list) or not 1 <= len(listed) <= MAX_ACKS:
        raise BadRequest(f"acks must be an array of 1 to {MAX_ACKS} acknowledgements")
    parsed = []
    for index, entry in enumerate(listed):
        entry = json_object(entry, f"acks[{index}]", ("path", "version", "code"), ("reason",))
        try:
            parsed.append(Ack(entry["path"], _whole(entry["version"]), _whole(entry["code"]), entry.get("reason")))
        except ValueError as error:  # InvalidValue (the reason's length) keeps its own problem
            if isinstance(error, InvalidValue):
                raise
            raise BadRequest(f"acks[{index}]: {error}") from None
    try:
        return check_acks(parsed)
    except InvalidValue:
        raise
    except ValueError as error:
        raise BadRequest(str(error)) from None
