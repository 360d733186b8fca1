"""Reading an API Gateway request: its headers, media type and JSON body, its query, entity tags
and preconditions (RFC 9110); and the checks and conversions the route declarations
(``routes``) name for what JSON Schema cannot say: a device id's reserved names, patches and
transaction operations as library objects, acknowledgements. Refusals are ``HttpProblem``s or
the library's own errors."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from functions.device_state import (CURSOR_PATTERN, DEVICE_SECTIONS, STATE, Ack, DesireOptions, Device,
                                    InvalidCursor, InvalidDeviceId, InvalidValue, JsonPatch, MergePatch, Operation,
                                    check_acks, loads)

from .problems import BadRequest, PayloadTooLarge, PreconditionFailed, UnsupportedMediaType
from .validation import Checked

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# No item can exceed 400 KB, so a body past 1 MiB is refused before it is parsed.
MAX_BODY_BYTES = 1024 * 1024

IF_MATCH, IF_NONE_MATCH, IDEMPOTENCY_KEY, LEASE_TOKEN = "If-Match", "If-None-Match", "Idempotency-Key", "Lease-Token"
SERVICE_HEADERS = (IF_MATCH, IF_NONE_MATCH, IDEMPOTENCY_KEY, LEASE_TOKEN)
SINGLE_HEADERS = (IDEMPOTENCY_KEY, LEASE_TOKEN, "Content-Type")
LEASE_TOKEN_PATTERN = "^[0-9a-f]{32}$"  # the secret leaseToken of a lease grant
EXPIRES_IN, CLEAR_ON_CONFIRM = "expiresIn", "clearOnConfirm"  # what a desired write's query says of its leaves

RESERVED_DEVICE_IDS = ("count",)  # /devices/count counts devices


def not_reserved(device_id: str) -> str:
    if device_id in RESERVED_DEVICE_IDS:
        raise InvalidDeviceId(f"{device_id!r} is reserved: /devices/{device_id} is a route of its own")
    return device_id


# ---------------------------------------------------------------- headers and body

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


def list_header(event, name: str) -> str | None:
    """A header that is a list (RFC 9110 5.3): its field lines joined, in order."""
    lowered = name.lower()
    lines = [value for key, values in (event.get("multiValueHeaders") or {}).items() if key.lower() == lowered
             for value in values or []]
    return ", ".join(lines) if lines else header(event, name)


def sent_headers(event) -> set[str]:
    """The names of the headers the request has, lower-cased."""
    return {name.lower() for name in (event.get("multiValueHeaders") or event.get("headers") or {})}


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


def has_body(event) -> bool:
    return event.get("body") not in (None, "")


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


# ---------------------------------------------------------------- entity tags and preconditions

# One entity tag (RFC 9110 8.8.3): weak or strong, its characters etagc (obs-text included).
_ENTITY_TAG = r'(W/)?"([!#-~\x80-\xff]*)"'
# If-Match and If-None-Match: * or a list of entity tags, as the document states it and the parser reads it;
# empty elements of the list (a comma more) are ignored, as RFC 9110 5.6.1.2 asks of a recipient.
TAGS_PATTERN = rf'^\s*(\*|(,\s*)*{_ENTITY_TAG}(\s*,(\s*{_ENTITY_TAG})?)*)\s*$'
ONE_STRONG_TAG_OR_ANY = '^(\\*|"[1-9][0-9]{0,17}")$'  # a transaction operation's ifMatch
_VERSION = re.compile(r"[1-9][0-9]{0,17}")


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


def entity_tags(raw: str, _where: str = "") -> EntityTags:
    """``*`` or a list of entity tags (RFC 9110), as in If-Match and If-None-Match (checked
    against ``TAGS_PATTERN`` first)."""
    if raw.strip() == "*":
        return EntityTags(True, frozenset(), frozenset())
    strong, weak = set(), set()
    for weakness, tag in re.findall(_ENTITY_TAG, raw):
        if _VERSION.fullmatch(tag):
            (weak if weakness else strong).add(int(tag))
    return EntityTags(False, frozenset(strong), frozenset(weak))


def tag_matcher(raw: str) -> Callable[[str], bool]:
    """Whether an opaque entity tag is one that ``raw`` (an If-None-Match, checked against
    ``TAGS_PATTERN``) names: weak and strong alike, as RFC 9110 compares for If-None-Match, and
    any for ``*``."""
    if raw.strip() == "*":
        return lambda _tag: True
    return frozenset(tag for _weakness, tag in re.findall(_ENTITY_TAG, raw)).__contains__


ENTITY_TAGS = Checked({"type": "string", "minLength": 1, "pattern": TAGS_PATTERN}, entity_tags)


@dataclass(frozen=True)
class Preconditions:
    if_match: EntityTags | None
    if_none_match: EntityTags | None

    @classmethod
    def of(cls, request) -> "Preconditions":
        return cls(request.headers.get(IF_MATCH), request.headers.get(IF_NONE_MATCH))

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


# ---------------------------------------------------------------- path and query

# What stands for bytes that are not UTF-8 in a decoded query: a lone surrogate (Python's
# surrogateescape, as the dev server decodes) or U+FFFD (a lossy decoder's replacement). A client
# that means U+FFFD writes it as a filter's JSON escape, \\ufffd. UTF8_TEXT says it in the
# OpenAPI document, for a path parameter no narrower pattern holds to it; UTF8_CHAR, inside a pattern.
_STAND_INS = r"\ud800-\udfff\ufffd"
_NOT_UTF8 = re.compile(f"[{_STAND_INS}]")
UTF8_CHAR = f"[^{_STAND_INS}]"
UTF8_TEXT = f"^{UTF8_CHAR}*$"


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


def query(event) -> dict[str, str]:
    """The query's parameters by name, each given once."""
    result = {}
    for name, values in _raw_query(event).items():
        if len(values) != 1:
            raise BadRequest(f"query parameter {name} is given more than once")
        result[name] = values[0] if values[0] is not None else ""
    return result


def _raw_query(event) -> dict[str, list]:
    multi = event.get("multiValueQueryStringParameters") or {}
    single = event.get("queryStringParameters") or {}
    return {name: multi.get(name) or [single.get(name)] for name in set(multi) | set(single)}


def cursor(raw: str, _where: str = "cursor") -> str:
    """A cursor of the form this service issues, checked here so that no other string reaches
    the library (which checks that the listing asked issued it)."""
    if not CURSOR_PATTERN.fullmatch(raw):
        raise InvalidCursor("cursor is not one this service issued: pass nextCursor as it was given")
    return raw


def section_set(raw: str, _where: str = "sections") -> set[str]:
    """``?sections=desired,reported`` (its form checked by its pattern) as a set."""
    return set(raw.split(","))


def desire_options(query: dict) -> DesireOptions | None:
    """``?expiresIn=<seconds>&clearOnConfirm=true`` of a desired write, or None when they say nothing."""
    return DesireOptions(query.get(EXPIRES_IN), query.get(CLEAR_ON_CONFIRM, False)) or None


# ---------------------------------------------------------------- bodies

def document(value, where: str) -> dict:
    """A client's JSON object whose members are its own (a section of a device); what it holds
    the library checks when it is written."""
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be a JSON object")
    return value


def merge_patch(value) -> MergePatch:
    return MergePatch(value)


def json_patch(value) -> JsonPatch:
    return JsonPatch(value)


class TransactionEntry:
    """One operation of a transaction as the library runs it, with the sections it sets (what
    it needs rights on) and the lease token it carries."""

    __slots__ = ("operation", "sections", "lease_token")

    def __init__(self, operation: Operation, sections: set, lease_token: str | None):
        self.operation, self.sections, self.lease_token = operation, sections, lease_token


def transaction_entry(entry: dict, _where: str) -> TransactionEntry:
    """An entry of ``operations``, its shape checked by its schema (``routes.TRANSACTION``)."""
    device_id, if_match = entry["deviceId"], entry.get("ifMatch")
    expected = None if if_match in (None, "*") else int(if_match.strip('"'))
    lease_token = entry.get("leaseToken")
    if "mergePatch" in entry or "jsonPatch" in entry:
        section = entry.get("section", STATE)
        patch = entry.get("mergePatch", entry.get("jsonPatch"))
        return TransactionEntry(Operation.update(device_id, patch, expected, section=section), {section}, lease_token)
    if "put" in entry:
        put = entry["put"]
        sections = {name: put[name] for name in DEVICE_SECTIONS if name in put}
        if "ifNoneMatch" in entry:
            operation = Operation.create(device_id, put["state"], sections)
        elif if_match is not None:
            operation = Operation.replace(device_id, put["state"], expected, sections)
        else:
            operation = Operation.put(device_id, put["state"], sections)
        return TransactionEntry(operation, set(sections), lease_token)
    if "delete" in entry:
        return TransactionEntry(Operation.delete(device_id, expected), set(), lease_token)
    return TransactionEntry(Operation.check(device_id, expected), set(), lease_token)


def acks(listed: list, where: str) -> list[Ack]:
    """``acks`` of ``POST /devices/{id}/desired/acks`` (their shape checked by its schema) as the
    library's acknowledgements, which check what JSON Schema cannot say (a pointer's bytes)."""
    parsed = []
    for index, entry in enumerate(listed):
        try:
            parsed.append(Ack(entry["path"], entry["version"], entry["code"], entry.get("reason")))
        except ValueError as error:  # InvalidValue (a limit) keeps its own problem
            if isinstance(error, InvalidValue):
                raise
            raise BadRequest(f"{where}[{index}]: {error}") from None
    return check_acks(parsed)
