"""Every route of the HTTP API, declared once: its method and path, who may call it, the query
parameters, headers and body it takes (as JSON Schema), what its body writes, whether it waits,
and what it answers. ``common.route`` holds each request to its declaration before the route's
code runs (the caller's rights included: those its body needs too); ``openapi`` builds
``/openapi.json`` from the same declarations (on demand, not at a cold start); the stack
(infra/api.py) and the dev server read ``WAITING_ROUTES``.

Adding a route is one declaration here and its function in a router (``@route(router,
"<operationId>")``); a test holds the two tables to each other."""

from __future__ import annotations

import functools
import re
from urllib.parse import unquote

from functions.auth.assertions import MAX_LIFETIME_SECONDS, MAX_PEM_CHARS
from functions.auth.rights import (COLLECTION, CREDENTIALS, DESIRED, DEVICE_MAX_LEASE_SECONDS, ENROLLMENTS, ISSUE,
                                   JOBS, LEASES, LIST, MANAGE, READ, REPORTED, STATE, TOKEN, WRITE, WriteKind,
                                   device_resource, needed_for_write, needed_to_follow)
from functions.device_state import (CREDENTIAL_ID_PATTERN, CREDENTIAL_KINDS, ENROLLMENT_ID_PATTERN,
                                    MAX_CREDENTIALS, MAX_ENROLLMENT_DEVICES, MAX_ENROLLMENTS_LIMIT,
                                    MAX_ID_PATTERN_CHARS,
                                    CURSOR_PATTERN, DEVICE_ID_PATTERN, DEVICE_SECTIONS, KEY_PATTERN, MAX_ACKS,
                                    MAX_COUNT_INDEX_ENTRIES, MAX_COUNT_ITEMS, MAX_EXPIRY_SECONDS, MAX_FEED_LIMIT,
                                    MAX_FILTER_CHARS, MAX_LIST_LIMIT, MAX_OPERATIONS, MAX_POINTER_BYTES,
                                    MAX_REASON_CHARS, MAX_VERSION, MIN_EXPIRY_SECONDS, SECTIONS, InvalidFilter,
                                    InvalidDeviceId, InvalidIdempotencyKey, InvalidValue, validate_device_id)
from functions.device_state import leases  # MAX_TTL_SECONDS: not yet among the library's exports
from functions.device_state import jobs

from . import request_parsing as parse
from .problems import BadRequest
from .validation import Checked, Ref, validate, within

JSON, MERGE_PATCH, JSON_PATCH = parse.JSON, parse.MERGE_PATCH, parse.JSON_PATCH
PUBLIC = "public"  # no credentials
PER_OPERATION = "per-operation"  # each operation of the body is authorized (Writes.touched), none for the route
BY_ASSERTION = "by-assertion"  # no principal: the route verifies the request's assertion itself

DEFAULT_LIST_LIMIT = 50
DEFAULT_FEED_LIMIT = 100
MAX_WAIT_SECONDS = 20  # a long-poll of the feed or the delta
MAX_LEASE_WAIT_SECONDS = 25  # inside API Gateway's 29 s integration timeout
# Lease numbers: (minimum, maximum) of each member of a lease request's body.
LEASE_LIMITS = {"ttlSeconds": (1, leases.MAX_TTL_SECONDS), "waitSeconds": (0, MAX_LEASE_WAIT_SECONDS)}


# Plain classes, not dataclasses: these are made at every cold start, where a dataclass costs
# about a millisecond to define.
class Param:
    """A path, query or header parameter: its name as the document gives it, its schema; an
    example of a required one, which a request without it is shown too."""

    __slots__ = ("name", "schema", "description", "required", "example")

    def __init__(self, name: str, schema: dict, description: str | None = None, required: bool = False,
                 example: str | None = None):
        self.name, self.schema, self.description, self.required, self.example = name, schema, description, \
            required, example


class Request:
    """A request as its declaration took it, handed to the route's function: ``path`` by the
    rule's names (``device_id``), ``query`` and ``headers`` by the document's (defaults filled
    in), ``body`` parsed and checked (None when there is none)."""

    __slots__ = ("event", "context", "principal", "path", "query", "headers", "body", "media_type")

    def __init__(self, event, context, principal, path: dict, query: dict, headers: dict, body=None,
                 media_type: str | None = None):
        self.event, self.context, self.principal = event, context, principal
        self.path, self.query, self.headers, self.body, self.media_type = path, query, headers, body, media_type


class Writes:
    """What a write route's body touches, authorized by ``common.route`` before the route's code
    runs: the kind of write (its own right, ``rights.needed_for_write``) and the sections it sets,
    the one its path names or, for a create or a put, every section its body names."""

    __slots__ = ("kind", "section")

    def __init__(self, kind: WriteKind, section: str | None = None):
        self.kind, self.section = kind, section

    @property
    def right(self) -> tuple[str, str]:
        """What can be checked before the body is read: the first right the write needs."""
        return needed_for_write(self.kind, "{device_id}", {self.section} if self.section else ())[0]

    def touched(self, request: Request) -> list[tuple[WriteKind, str, set]]:
        body = request.body if isinstance(request.body, dict) else {}
        sections = {self.section} if self.section else {name for name in DEVICE_SECTIONS if name in body}
        device_id = request.path["device_id"] if "device_id" in request.path else body["deviceId"]
        return [(self.kind, device_id, sections)]


class EachOperation:
    """A transaction: every operation of its body is a write of its own to authorize."""

    right = PER_OPERATION

    @staticmethod
    def touched(request: Request) -> list[tuple[str, str, set]]:
        return [(entry.operation.action, entry.operation.device_id, entry.sections)
                for entry in request.body["operations"]]


class Answer:
    """A response the document lists: its description, the component schema of its body, its
    headers (``openapi.RESPONSE_HEADERS``). A problem response is its description alone (a str);
    None stands for the status's standard meaning (``openapi.STANDARD``)."""

    __slots__ = ("description", "schema", "headers")

    def __init__(self, description: str, schema: str | None = None, headers: tuple[str, ...] = ()):
        self.description, self.schema, self.headers = description, schema, headers


class Body:
    """The media types a body may have, each with its schema; whether the route needs one."""

    __slots__ = ("content", "required")

    def __init__(self, content: dict, required: bool = True):
        self.content, self.required = content, required


class Route:
    """One route: ``methods`` on ``rule`` (Powertools' form: /devices/<device_id>) is the operation
    ``operation`` (a GET's HEAD is operation + "Head"); ``rights``: (action, resource template),
    PUBLIC or what it writes; ``waits``: where a waiting request says how long, "query" or "body"
    (its waitSeconds); ``assertion``: a device's assertion may stand in for the caller's
    credentials (the route verifies it; BY_ASSERTION rights: only an assertion). Its path
    parameters are those its rule names (``PATH_PARAMETERS``)."""

    __slots__ = ("methods", "rule", "operation", "rights", "responses", "query", "headers", "body", "waits",
                 "description", "path", "assertion")

    def __init__(self, methods: tuple[str, ...], rule: str, operation: str, rights, responses: dict,
                 query: tuple[Param, ...] = (), headers: tuple[Param, ...] = (), body: Body | None = None,
                 waits: str | None = None, description: str | None = None, assertion: bool = False):
        self.methods, self.rule, self.operation, self.rights = methods, rule, operation, rights
        self.responses = responses
        self.query, self.headers, self.body, self.waits, self.description = query, headers, body, waits, description
        self.assertion = assertion or rights == BY_ASSERTION
        self.path = tuple(PATH_PARAMETERS[name] for name in re.findall(r"<(\w+)>", rule))

    @property
    def right(self):
        """What the caller needs before anything is read: (action, resource template), PUBLIC or PER_OPERATION."""
        return self.rights.right if isinstance(self.rights, (Writes, EachOperation)) else self.rights

    @property
    def writes(self) -> Writes | EachOperation | None:
        return self.rights if isinstance(self.rights, (Writes, EachOperation)) else None

    @property
    def openapi_path(self) -> str:
        return openapi_path(self.rule)


def openapi_path(rule: str) -> str:
    """``/devices/<device_id>/leases/<lease_id>`` as the document (and API Gateway) write it:
    ``/devices/{deviceId}/leases/{leaseId}``."""
    return re.sub(r"<(\w+)>", lambda name: "{" + PATH_PARAMETERS[name.group(1)].name + "}", rule)


def _resource(part: str | None = None) -> str:
    return device_resource("{device_id}", part)


# ---------------------------------------------------------------- parameters

DEVICE_ID_SCHEMA = Checked({"type": "string", "pattern": f"^{DEVICE_ID_PATTERN.pattern}$",
                            "not": {"enum": list(parse.RESERVED_DEVICE_IDS)}},
                           within(lambda value: parse.not_reserved(validate_device_id(value))), validate=False)
PATH_PARAMETERS = {
    "device_id": Param("deviceId", DEVICE_ID_SCHEMA, required=True),
    "lease_id": Param("leaseId", {"type": "string", "pattern": parse.UTF8_TEXT}, required=True, description=(
        "The leaseId its grant returned; on DELETE also the lease's fencingToken alone (digits), which ends that "
        "lease or waiting ticket whoever holds it: a back-end with devices.write may, a device may not (403).")),
    "version": Param("version", {"type": "integer", "minimum": 1, "maximum": MAX_VERSION}, required=True),
    "job_id": Param("jobId", {"type": "string", "pattern": f"^{jobs.JOB_ID_PATTERN.pattern}$"}, required=True),
    "credential_id": Param("credentialId", {"type": "string", "pattern": f"^{CREDENTIAL_ID_PATTERN.pattern}$"},
                           required=True, description="The credentialId its registration answered"),
    "enrollment_id": Param("enrollmentId", {"type": "string", "pattern": f"^{ENROLLMENT_ID_PATTERN.pattern}$"},
                           required=True),
}

IF_MATCH = Param(parse.IF_MATCH, parse.ENTITY_TAGS, description=(
    'Only if the device is at this version ("<v>", strong comparison) or exists (*), else 412.'))
IF_NONE_MATCH = Param(parse.IF_NONE_MATCH, parse.ENTITY_TAGS)
IDEMPOTENCY_KEY = Param(parse.IDEMPOTENCY_KEY, Checked({"type": "string", "pattern": f"^{KEY_PATTERN.pattern}$"},
                                                       problem=InvalidIdempotencyKey), description=(
    "Apply this write at most once in 24 h; a retry with the same key and request gets the first answer again "
    "with Idempotent-Replayed: true."))
LEASE_TOKEN = Param(parse.LEASE_TOKEN, {"type": "string", "pattern": parse.LEASE_TOKEN_PATTERN}, description=(
    "The secret leaseToken of the active lease's grant; needed while one is active (else 423), refused when it "
    "names no active lease (409)."))
CONDITIONAL = (IF_MATCH, IF_NONE_MATCH)
DEVICE_WRITE_HEADERS = (IF_MATCH, IF_NONE_MATCH, IDEMPOTENCY_KEY, LEASE_TOKEN)

INCLUDE = Param("include", {"type": "string", "enum": ["metadata"]}, description=(
    "metadata: add per-leaf version, updatedAt and confirmedVersion of desired and reported"))
FILTER = Param("filter", Checked({"type": "string", "minLength": 1, "maxLength": MAX_FILTER_CHARS,
                                  "pattern": parse.UTF8_TEXT},
                                 problem=InvalidFilter), description=(
    "RQL over declared fields (FLEET_INDEX): eq, ne, gt, ge, lt, le, in, like (a prefix ending in *), exists, and, "
    'or, not; e.g. and(eq(reported/online,true),like(state/site,"berlin-*")). exists(delta) and '
    "exists(delta/<path>) filter beside a declared field. See docs/api/fleet-query.md."))
_FIELD = f"({'|'.join(SECTIONS)})/{parse.UTF8_CHAR}+"  # a query's text is UTF-8 (parse.check_utf8)
# The form of every cursor the service issues, the plain listing's and a fleet query's alike (the
# library's, so the document states it exactly); which listing issued it, the library checks.
LISTING_CURSOR_PATTERN = f"^{CURSOR_PATTERN.pattern}$"
LISTING_CURSOR = Checked({"type": "string", "pattern": LISTING_CURSOR_PATTERN}, parse.cursor, validate=False)
SINCE_DESCRIPTION = "The last version the caller has seen (at most the device's version)"
DESIRE_QUERY = (
    Param(parse.EXPIRES_IN, {"type": "integer", "minimum": MIN_EXPIRY_SECONDS, "maximum": MAX_EXPIRY_SECONDS},
          description="Seconds after which each leaf this write sets leaves the delta unless the device confirmed "
                      "it (its metadata then says expired); nothing is written at the deadline"),
    Param(parse.CLEAR_ON_CONFIRM, {"type": "boolean", "default": False},
          description="true: the report that confirms a leaf this write sets removes it from desired in the same "
                      "write (its metadata keeps the confirmation, cleared: true)"),
)


# ---------------------------------------------------------------- bodies

# A device's sections as a client sends them: any JSON object DynamoDB can hold exactly, its values
# checked by the library when written. The document's Value (openapi.py) states what a state holds.
STATE_SCHEMA = Checked({"$ref": "#/components/schemas/State"}, parse.document, validate=False)
_SECTIONS = {name: STATE_SCHEMA for name in (STATE, *DEVICE_SECTIONS)}
CREATE_BODY = {"type": "object", "required": ["deviceId", "state"], "additionalProperties": False,
               "properties": {"deviceId": DEVICE_ID_SCHEMA, **_SECTIONS},
               "description": "Absent sections are {}"}
PUT_BODY = {"type": "object", "required": ["state"], "additionalProperties": False,
            "properties": {"deviceId": DEVICE_ID_SCHEMA, **_SECTIONS},
            "description": "deviceId may be repeated in the body when it equals the path's; absent sections stay "
                           "as they are"}
MERGE_PATCH_SCHEMA = Checked({"$ref": "#/components/schemas/MergePatch"}, within(parse.merge_patch),
                             validate=False)
JSON_PATCH_SCHEMA = Checked({"$ref": "#/components/schemas/JsonPatch"}, within(parse.json_patch),
                            validate=False)
PATCH_BODY = Body({MERGE_PATCH: MERGE_PATCH_SCHEMA, JSON: MERGE_PATCH_SCHEMA, JSON_PATCH: JSON_PATCH_SCHEMA})

_IF_MATCH_ONE = {"type": "string", "pattern": parse.ONE_STRONG_TAG_OR_ANY,
                 "description": 'One strong entity tag ("3") or *'}


def _operation(action: str, value: dict, **optional) -> dict:
    return {"type": "object", "required": ["deviceId", action], "additionalProperties": False,
            "properties": {"deviceId": DEVICE_ID_SCHEMA, action: value,
                           "leaseToken": {"type": "string", "pattern": parse.LEASE_TOKEN_PATTERN}, **optional}}


_SECTION = {"type": "string", "enum": list(SECTIONS), "default": STATE,
            "description": "The section the patch applies to (its paths are inside it)"}
_PUT = {"type": "object", "required": ["state"], "additionalProperties": False, "properties": _SECTIONS}
_TRUE = {"type": "boolean", "enum": [True]}
TRANSACTION_OPERATION = Checked({"anyOf": [
    _operation("mergePatch", MERGE_PATCH_SCHEMA, ifMatch=_IF_MATCH_ONE, section=_SECTION),
    _operation("jsonPatch", JSON_PATCH_SCHEMA, ifMatch=_IF_MATCH_ONE, section=_SECTION),
    _operation("put", _PUT, ifMatch=_IF_MATCH_ONE),
    {**_operation("put", _PUT, ifNoneMatch={"type": "string", "enum": ["*"]}),
     "required": ["deviceId", "put", "ifNoneMatch"]},
    _operation("delete", _TRUE, ifMatch=_IF_MATCH_ONE),
    _operation("check", _TRUE, ifMatch=_IF_MATCH_ONE),
]}, parse.transaction_entry)
TRANSACTION = Ref("Transaction", {
    "type": "object", "required": ["operations"], "additionalProperties": False,
    "description": f"Each device at most once per transaction; at most {MAX_OPERATIONS - 1} operations with an "
                   "Idempotency-Key.",
    "properties": {"operations": {"type": "array", "minItems": 1, "maxItems": MAX_OPERATIONS,
                                  "items": TRANSACTION_OPERATION}}})

ACKS_BODY = {"type": "object", "required": ["acks"], "additionalProperties": False, "properties": {
    "acks": Checked({"type": "array", "minItems": 1, "maxItems": MAX_ACKS, "items": {
        "type": "object", "required": ["path", "version", "code"], "additionalProperties": False,
        "properties": {
            "path": {"type": "string", "pattern": "^(/([^/~]|~[01])*)+$", "maxLength": MAX_POINTER_BYTES,
                     "description": f"JSON Pointer of a desired leaf (at most {MAX_POINTER_BYTES:,} bytes)"},
            "version": {"type": "integer", "minimum": 1, "maximum": MAX_VERSION,
                        "description": "The leaf's desired version"},
            "code": {"type": "integer", "minimum": 200, "maximum": 599,
                     "not": {"anyOf": [{"enum": [201]}, {"type": "integer", "minimum": 203, "maximum": 399}]},
                     "description": "200 applied, 202 in progress, 400-499 refused, 500-599 failed"},
            "reason": Checked({"type": "string", "nullable": True, "maxLength": MAX_REASON_CHARS,
                               "description": "Why (null or left out: none), as the feed shows it"},
                              problem=functools.partial(InvalidValue, limit="ack-reason"))}}},
        parse.acks)}}

_TTL = {"type": "number", "minimum": LEASE_LIMITS["ttlSeconds"][0], "maximum": LEASE_LIMITS["ttlSeconds"][1]}
DEVICE_TTL = (f"A device's lease is capped: from a device token or certificate, ttlSeconds above "
              f"{DEVICE_MAX_LEASE_SECONDS} is 400.")
LEASE_BODY = Body({JSON: {"type": "object", "additionalProperties": False, "properties": {
    "ttlSeconds": {**_TTL, "description": DEVICE_TTL},
    "waitSeconds": {"type": "number", "minimum": LEASE_LIMITS["waitSeconds"][0],
                    "maximum": LEASE_LIMITS["waitSeconds"][1]},
    "owner": {"type": "string", "minLength": 1, "maxLength": leases.MAX_OWNER_CHARS}}}}, required=False)


_JOB_ID = {"type": "string", "pattern": f"^{jobs.JOB_ID_PATTERN.pattern}$"}
_JOB_MEMBERS = {
    "jobId": {**_JOB_ID, "description": "Default: a new id that sorts by creation time"},
    "desired": STATE_SCHEMA,  # a merge patch of desired: leaves set, none null (docs/api/jobs.md)
    "expiresIn": {"type": "integer", "minimum": MIN_EXPIRY_SECONDS, "maximum": MAX_EXPIRY_SECONDS},
    "clearOnConfirm": {"type": "boolean"},
    "rollout": {"type": "object", "required": ["maxPerMinute"], "additionalProperties": False, "properties": {
        "maxPerMinute": {"type": "integer", "minimum": 1, "maximum": jobs.MAX_PER_MINUTE}}},
    "abort": {"type": "array", "minItems": 1, "maxItems": jobs.MAX_ABORT_CRITERIA, "items": {
        "type": "object", "required": ["on", "thresholdPercent", "minExecuted"], "additionalProperties": False,
        "properties": {"on": {"type": "string", "enum": list(jobs.ABORT_KINDS)},
                       "thresholdPercent": {"type": "number", "minimum": jobs.MIN_THRESHOLD_PERCENT, "maximum": 100},
                       "minExecuted": {"type": "integer", "minimum": 1, "maximum": jobs.MAX_MIN_EXECUTED}}}},
    "timeoutSeconds": {"type": "integer", "minimum": 1, "maximum": jobs.MAX_TIMEOUT_SECONDS},
    "endsAt": {"type": "string", "pattern": f"^{jobs.RFC3339_PATTERN.pattern}$",
               "description": "RFC 3339, after now and at most 30 days ahead (the default)"},
}
JOB_BODY = Ref("JobRequest", {"description": "Targets by filter or by deviceIds; see docs/api/jobs.md", "anyOf": [
    {"type": "object", "required": ["filter", "desired"], "additionalProperties": False, "properties": {
        **_JOB_MEMBERS,
        "filter": {"type": "string", "minLength": 1, "maxLength": MAX_FILTER_CHARS,
                   "description": "RQL over declared fields, as GET /devices?filter= takes it"},
        "targets": {"type": "string", "enum": ["snapshot", "continuous"], "default": "snapshot"}}},
    {"type": "object", "required": ["deviceIds", "desired"], "additionalProperties": False, "properties": {
        **_JOB_MEMBERS,
        "deviceIds": {"type": "array", "minItems": 1, "maxItems": jobs.MAX_DEVICE_IDS, "items": DEVICE_ID_SCHEMA},
        "targets": {"type": "string", "enum": ["snapshot"], "default": "snapshot"}}},
]})
JOB_IF_NONE_MATCH = Param(parse.IF_NONE_MATCH, {"type": "string", "pattern": parse.TAGS_PATTERN}, description=(
    "The job's ETag as last seen: 304 while it is still the job's (after waitSeconds, if given)"))
JOB_LIMIT = Param("limit", {"type": "integer", "minimum": 1, "maximum": jobs.MAX_LIMIT, "default": DEFAULT_LIST_LIMIT})
PAGE_CURSOR = Param("cursor", LISTING_CURSOR,
                   description="nextCursor of the page before, as given: any other string is 400 invalid-cursor")


# ---------------------------------------------------------------- responses

def _device(description: str, *headers: str) -> Answer:
    return Answer(description, "Device", ("ETag", "Idempotent-Replayed", *headers))


# None: the status's standard meaning, as openapi.STANDARD words it.
COMMON = {"400": None, "503": None}
WRITE_ERRORS = {"400": None, "413": None, "415": None, "503": None, "504": None}
REUSED = "The Idempotency-Key was used for a different request"
LOCKED = "The device is leased and the request has not the holder's Lease-Token"
NO_DEVICE = "No such device"
PRECONDITIONS = {"412": "Precondition failed", "428": "Precondition required"}
NOT_HELD = "The Lease-Token names no active lease"
INDEX_BUILDING = ("Storage unavailable, or a declared field's index is still being built (index-building, with its "
                  "progress); Retry-After is set")
DELTA_RULES = (
    "delta: every desired leaf (a scalar, an array compared whole, or an empty object) that reported lacks or "
    "holds differently (numbers by exact value), at its full path with the desired value, except leaves the "
    "device refused (an ack of 400 or more) and desires past their expiry; reported-only members are not in it; "
    "{} when there is no difference.")
_PATCHED = {"200": _device("Patched"), "404": NO_DEVICE,
            "409": "A JSON Patch test failed, or the Lease-Token names no active lease", "423": LOCKED,
            "422": "The patch cannot be applied to the state, or the Idempotency-Key was used for a different request",
            **PRECONDITIONS, **WRITE_ERRORS}
_SECTION_REPLACED = {"200": _device("Replaced"), "404": NO_DEVICE, "409": NOT_HELD, "423": LOCKED, "422": REUSED,
                     **PRECONDITIONS, **WRITE_ERRORS}


def _section_routes(section: str) -> list[Route]:
    rule, name = f"/devices/<device_id>/{section}", section.capitalize()
    query = (INCLUDE, *DESIRE_QUERY) if section == DESIRED else (INCLUDE,)
    return [
        Route(("PATCH",), rule, f"patch{name}", Writes(WriteKind.UPDATE, section), _PATCHED, query,
              DEVICE_WRITE_HEADERS, PATCH_BODY, description=(
                  f"Merge patch (null removes) or JSON Patch (paths inside {section}) of {section}. Answers the "
                  "whole device with its delta.")),
        Route(("PUT",), rule, f"put{name}", Writes(WriteKind.UPDATE, section), _SECTION_REPLACED, query,
              DEVICE_WRITE_HEADERS, Body({JSON: {"type": "object", "required": [section],
                                                 "additionalProperties": False,
                                                 "properties": {section: STATE_SCHEMA}}}),
              description=f"Replace {section} whole. Answers the whole device with its delta."),
    ]


# ---------------------------------------------------------------- devices' identity

_EXPIRES_AT = {"type": "string", "format": "date-time", "maxLength": 64,
               "pattern": f"^{jobs.RFC3339_PATTERN.pattern}$",
               "description": "RFC 3339 with its offset, in the future; absent: never"}
_PEM = {"type": "string", "minLength": 1, "maxLength": MAX_PEM_CHARS}
_PUBLIC_KEY = {**_PEM, "description": "An EC P-256 or RSA (2048 bits or more) public key in PEM"}
_CERTIFICATE = {**_PEM, "description": "An X.509 certificate in PEM, of any issuer"}


def _credential(kind: str, **material) -> dict:
    return {"type": "object", "required": ["type", *material], "additionalProperties": False,
            "properties": {"type": {"type": "string", "enum": [kind]}, **material, "expiresAt": _EXPIRES_AT}}


_CREDENTIAL_MEMBERS = {"type": "object", "required": ["type"], "additionalProperties": False, "properties": {
    "type": {"type": "string", "enum": list(CREDENTIAL_KINDS)}, "publicKey": _PUBLIC_KEY, "certificate": _CERTIFICATE,
    "expiresAt": _EXPIRES_AT}}


def _one_credential(body, where: str) -> dict:
    """A credential's body: its members, then the one key material its type takes (none for a secret)."""
    body = validate(_CREDENTIAL_MEMBERS, body, where)
    kind = body["type"]
    material = {"publicKey": "publicKey", "certificate": "certificate"}.get(kind)
    if [name for name in ("publicKey", "certificate") if name in body] != ([material] if material else []):
        raise BadRequest(f"a {kind} credential takes " + (f"{material} (PEM) and no other key" if material
                                                          else "no key: the service makes the secret"))
    return body


CREDENTIAL_BODY = Body({JSON: Checked({"anyOf": [
    _credential("publicKey", publicKey=_PUBLIC_KEY), _credential("certificate", certificate=_CERTIFICATE),
    _credential("secret")],
    "description": "A public key, a certificate, or a secret the service makes (type secret, no key)"},
    _one_credential, validate=False)})
ENROLLMENT_BODY = Body({JSON: {
    "type": "object", "required": ["idPattern", "maxDevices"], "additionalProperties": False,
    "properties": {
        "enrollmentId": {"type": "string", "pattern": f"^{ENROLLMENT_ID_PATTERN.pattern}$",
                         "description": "Absent: one is made"},
        "idPattern": {"type": "string", "minLength": 1, "maxLength": MAX_ID_PATTERN_CHARS,
                      "description": "A regular expression the whole device id must match (no nested repetition, "
                                     "no backreferences)"},
        "initial": {"type": "object", "additionalProperties": False,
                    "properties": {STATE: STATE_SCHEMA, DESIRED: STATE_SCHEMA},
                    "description": "The documents each device it provisions is created with"},
        "maxDevices": {"type": "integer", "minimum": 1, "maximum": MAX_ENROLLMENT_DEVICES},
        "expiresAt": _EXPIRES_AT}}})
PROVISION_BODY = Body({JSON: {"type": "object", "additionalProperties": False, "properties": {
    "publicKey": {**_PEM, "description": "The device's own public key (EC P-256 or RSA 2048+, PEM), registered as "
                                         "its credential; absent: the derived key is registered as a secret"}}}},
    required=False)
_CREDENTIALS = _resource(CREDENTIALS)
_ENROLLMENTS = (MANAGE, ENROLLMENTS)
NO_ENROLLMENT = "No such enrollment (or it was deleted): enrollment-not-found"
ASSERTION_RULES = (
    f"A JWT the device signs: header kid = the credential's id (for provisioning, the enrollment's), alg its "
    f"credential's (ES256, RS256, or HS256 keyed with the secret's bytes); claims sub = the device id, aud = "
    f"device-state, iat, exp at most {MAX_LIFETIME_SECONDS} s after iat, jti used once.")
IDENTITY_ROUTES = (
    Route(("POST",), "/devices/<device_id>/credentials", "addCredential", (MANAGE, _CREDENTIALS), {
        "201": Answer("Registered; a secret is in this answer alone (Cache-Control: no-store)", "NewCredential",
                      ("Cache-Control",)),
        "404": NO_DEVICE, "409": f"The device holds {MAX_CREDENTIALS} credentials (too-many-credentials), or this "
                                 "certificate already (credential-exists)",
        **WRITE_ERRORS}, body=CREDENTIAL_BODY, description=(
        f"Register a public key, a certificate, or a secret the service makes, for the device to prove itself "
        f"with (an assertion at POST /devices/{{deviceId}}/token; a certificate also over mutual TLS). At most "
        f"{MAX_CREDENTIALS} per device: a key rotates by adding the new one and revoking the old; one past its "
        f"expiresAt holds no place.")),
    Route(("GET", "HEAD"), "/devices/<device_id>/credentials", "listCredentials", (MANAGE, _CREDENTIALS), {
        "200": Answer("The device's credentials (never a secret; a revoked one is gone)", "CredentialList"),
        "404": NO_DEVICE, **COMMON}),
    Route(("DELETE",), "/devices/<device_id>/credentials/<credential_id>", "revokeCredential",
          (MANAGE, _CREDENTIALS), {
              "204": Answer("Revoked: every token minted from it is refused from the next request on"),
              "404": "The device holds no such credential (never, or revoked already): credential-not-found",
              **COMMON, "504": None}),
    Route(("POST",), "/enrollments", "createEnrollment", _ENROLLMENTS, {
        "201": Answer("Created; its groupKey is in this answer alone (Cache-Control: no-store)", "NewEnrollment",
                      ("Location", "Cache-Control")),
        "409": "An enrollment of that id exists: enrollment-exists", **WRITE_ERRORS}, body=ENROLLMENT_BODY,
          description=(
        "A group enrollment: a device whose factory stored deviceKey = base64(HMAC-SHA256(base64decode(groupKey), "
        "deviceId)) provisions itself at POST /devices/{deviceId}/provision.")),
    Route(("GET", "HEAD"), "/enrollments", "listEnrollments", _ENROLLMENTS, {
        "200": Answer("A page of the enrollments not deleted, by id (never a group key)", "EnrollmentPage"), **COMMON,
    }, query=(Param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_ENROLLMENTS_LIMIT,
                              "default": DEFAULT_LIST_LIMIT}), PAGE_CURSOR)),
    Route(("GET", "HEAD"), "/enrollments/<enrollment_id>", "getEnrollment", _ENROLLMENTS, {
        "200": Answer("The enrollment with how many devices it provisioned", "Enrollment"), "404": NO_ENROLLMENT,
        **COMMON}),
    Route(("DELETE",), "/enrollments/<enrollment_id>", "deleteEnrollment", _ENROLLMENTS, {
        "204": Answer("Deleted: no device provisions itself by it any more; those it provisioned keep their "
                      "credentials"), "404": NO_ENROLLMENT, **COMMON, "504": None}),
    Route(("POST",), "/devices/<device_id>/provision", "provisionDevice", BY_ASSERTION, {
        "201": Answer("Provisioned: the device created from the enrollment's initial documents, its credential "
                      "registered, and a device token (Cache-Control: no-store)", "Provisioned", ("Cache-Control",)),
        "200": Answer("Provisioned before by this enrollment: a fresh token, the same credential", "Provisioned",
                      ("Cache-Control",)),
        "403": "The enrollment refuses: enrollment-ended (deleted or expired), enrollment-full, id-not-allowed (the "
               "id does not match its idPattern), provisioned-credential-revoked",
        "409": "A device of that id exists that this enrollment did not provision: device-exists",
        "429": "Too many tokens or keys are being signed or opened at once; Retry-After is set",
        **WRITE_ERRORS}, body=PROVISION_BODY, description=(
        "A device provisions itself by a group enrollment with an HS256 assertion keyed with the key the "
        "enrollment derives for it (kid = the enrollment's id). " + ASSERTION_RULES)),
)

ROUTES: tuple[Route, ...] = (
    Route(("GET", "HEAD"), "/openapi.json", "getOpenApi", PUBLIC,
          {"200": Answer("This document", "OpenApi"), "400": "A path or query that is not UTF-8"}),
    Route(("GET", "HEAD"), "/devices", "listDevices", (LIST, COLLECTION), {
        "200": Answer("A page of devices: the fleet in key order, or those the filter matches", "DevicePage"),
        "400": "Bad request: a malformed filter (its position named), a filter with a branch on no declared field "
               "(unindexed-filter), a bad cursor or limit, a query that is not UTF-8",
        "503": INDEX_BUILDING,
    }, query=(
        Param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT, "default": DEFAULT_LIST_LIMIT}),
        Param("cursor", LISTING_CURSOR,
              description="nextCursor of the page before, as given: it belongs to the listing that issued it (the "
                          "same filter and sort, or none) and is sealed with the service's key, so any other "
                          "(changed, another listing's, issued before the key was replaced) is 400 invalid-cursor; "
                          "limit may change between pages"),
        FILTER,
        Param("sort", Checked({"type": "string", "pattern": f"^[ +-]{_FIELD}$"}, problem=InvalidFilter),
              description="With a filter: +path or -path on a declared field (FLEET_INDEX); devices lacking it come "
                          "last. A + sent unencoded arrives as a space, taken as +"),
        INCLUDE)),
    Route(("POST",), "/devices", "createDevice", Writes(WriteKind.CREATE), {
        "201": _device("Created", "Location"), "409": "The device exists", "422": REUSED, **WRITE_ERRORS,
    }, query=(INCLUDE,), headers=(IDEMPOTENCY_KEY,), body=Body({JSON: CREATE_BODY})),
    Route(("GET", "HEAD"), "/devices/count", "countDevices", (LIST, COLLECTION), {
        "200": Answer("How many devices the filter matches", "DeviceCount"),
        "400": "Bad request: a missing or malformed filter, a filter with a branch on no declared field "
               "(unindexed-filter), a count that would read more than it may (filter-too-broad: the items of over "
               f"{MAX_COUNT_ITEMS} devices, or over {MAX_COUNT_INDEX_ENTRIES} index entries; limit names "
               "which, fields the paths judged on the items), groupBy on an undeclared field, a query that is not "
               "UTF-8",
        "503": INDEX_BUILDING,
    }, query=(
        Param(FILTER.name, FILTER.schema, FILTER.description, required=True, example="eq(reported/online,true)"),
        Param("groupBy", Checked({"type": "string", "pattern": f"^{_FIELD}$"}, problem=InvalidFilter),
              description="A declared field (FLEET_INDEX): the count per value, most frequent first (null: devices "
                          "without it)"))),
    Route(("GET", "HEAD"), "/devices/<device_id>", "getDevice", (READ, _resource()), {
        "200": _device("The device"), "304": Answer("Not modified"), "404": NO_DEVICE,
        "412": "If-Match does not match the device", **COMMON,
    }, query=(INCLUDE,), headers=CONDITIONAL),
    Route(("PUT",), "/devices/<device_id>", "putDevice", Writes(WriteKind.PUT), {
        "200": _device("Replaced"), "201": _device("Created", "Location"), "409": NOT_HELD, "423": LOCKED,
        **PRECONDITIONS, "422": REUSED, **WRITE_ERRORS,
    }, query=(INCLUDE,), headers=DEVICE_WRITE_HEADERS, body=Body({JSON: PUT_BODY})),
    Route(("PATCH",), "/devices/<device_id>", "patchDevice", Writes(WriteKind.UPDATE, STATE), _PATCHED,
          query=(INCLUDE,), headers=DEVICE_WRITE_HEADERS, body=PATCH_BODY),
    Route(("DELETE",), "/devices/<device_id>", "deleteDevice", Writes(WriteKind.DELETE), {
        "204": Answer("Deleted"), "404": NO_DEVICE, "409": NOT_HELD, "423": LOCKED, "422": REUSED,
        **PRECONDITIONS, **COMMON,
    }, headers=DEVICE_WRITE_HEADERS),
    *_section_routes(DESIRED),
    *_section_routes(REPORTED),
    Route(("POST",), "/devices/<device_id>/desired/acks", "acknowledgeDesired", (WRITE, _resource(REPORTED)), {
        "200": _device("Recorded"), "404": NO_DEVICE,
        "409": "desire-moved: desired set the leaf again, or no longer holds it, since the version acknowledged "
               "(path, ackVersion, leafVersion); or the Lease-Token names no active lease",
        "423": LOCKED, "422": REUSED, **WRITE_ERRORS,
    }, query=(INCLUDE,), headers=(IDEMPOTENCY_KEY, LEASE_TOKEN), body=Body({JSON: ACKS_BODY}), description=(
        "The device's answers to desires, per leaf (IoT Plug and Play's convention): 200 applied, 202 in progress "
        "(the leaf stays in the delta), 400-499 refused and 500-599 failed (the leaf leaves the delta until desired "
        "sets it again). Each names the leaf's desired version it answers; all are recorded in one write, or none.")),
    Route(("GET", "HEAD"), "/devices/<device_id>/delta", "getDelta", (READ, _resource()), {
        "200": Answer("The delta", "Delta", ("ETag",)), "304": Answer("Not modified"), "404": NO_DEVICE,
        "412": "If-Match does not match the device", **COMMON,
    }, query=(
        Param("since", {"type": "integer", "minimum": 0, "maximum": MAX_VERSION}, SINCE_DESCRIPTION),
        Param("waitSeconds", {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECONDS, "default": 0},
              "Long-poll: wait for a write after since (without since: after the version found)"),
    ), headers=CONDITIONAL, waits="query", description=(
        "What the device must change. " + DELTA_RULES + " Waits up to waitSeconds until a write after version since "
        "(without since: the version found first) has changed desired or reported (at once when one already has); "
        "either way it answers the current delta.")),
    Route(("GET", "HEAD"), "/devices/<device_id>/changes", "listChanges", needed_to_follow("{device_id}")[0], {
        "200": Answer("The changes after since (empty at the wait's end)", "ChangePage"),
        "400": "Malformed parameter, or since past the device's current version",
        "404": "No such device: no device, tombstone or change",
        "410": "changes-expired: since is older than the retention; currentVersion says where to continue after "
               "reading the device",
        "503": None,
    }, query=(
        Param("since", {"type": "integer", "minimum": 0, "maximum": MAX_VERSION, "default": 0},
              "The last version seen (0: from the creation)"),
        Param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_FEED_LIMIT, "default": DEFAULT_FEED_LIMIT}),
        Param("waitSeconds", {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECONDS, "default": 0},
              "Long-poll: when nothing is newer, wait up to this long for a change"),
        Param("sections", Checked({"type": "string", "pattern": f"^({'|'.join(SECTIONS)})(,({'|'.join(SECTIONS)}))*$"},
                                  parse.section_set),
              "Only changes to these sections (comma-separated); nextSince still moves past the others"),
    ), waits="query", description=(
        "Every change of the device, oldest first, contiguous from since + 1: no gaps, no duplicates, across deletes "
        "and re-creations (versions never repeat). The feed trails writes by the stream's delay (usually well under "
        "a second); a writer that needs its own change asks with since = its version - 1. Changes are kept for the "
        "retention (CHANGE_RETENTION_SECONDS, default 7 days); since older than that is 410.")),
    Route(("GET", "HEAD"), "/devices/<device_id>/versions/<version>", "getDeviceVersion", (READ, _resource()), {
        "200": _device("The device at that version"),
        "404": "No such version: never written, deleted at it, or past the retention", **COMMON,
    }, query=(INCLUDE,), description=(
        "The device as it was at this version, within the change retention. The current version is always shown; "
        "an older one the history has not recorded yet (it trails writes by the stream's delay) is 503 "
        "not-yet-recorded with Retry-After.")),
    Route(("POST",), "/devices/<device_id>/leases", "acquireLease", (WRITE, _resource(LEASES)), {
        "201": Answer("The lease", "Lease", ("Location",)), "404": NO_DEVICE,
        "409": "Leased by another holder and not acquired within the wait; Retry-After and holderExpiresAt say "
               "when it runs out",
        "410": "The waiting ticket was ended (DELETE …/leases/{fencingToken}) before it got the lease",
        **WRITE_ERRORS,
    }, body=LEASE_BODY, waits="body", description=(
        "Queue for the device's FIFO lease and wait up to waitSeconds (default 0) to get it for ttlSeconds (default "
        "60). " + DEVICE_TTL)),
    Route(("GET", "HEAD"), "/devices/<device_id>/leases", "getLeaseStatus", (READ, _resource(LEASES)), {
        "200": Answer("The holder, if any, and the tickets waiting behind it, by fencing token (what DELETE "
                      "…/leases/{fencingToken} ends); never a leaseId or leaseToken", "LeaseStatus"),
        "404": NO_DEVICE, **COMMON}),
    Route(("PUT",), "/devices/<device_id>/leases/<lease_id>", "heartbeatLease", (WRITE, _resource(LEASES)), {
        "200": Answer("The lease", "Lease"), "404": "No lease has this id",
        "410": "The lease has expired, was released, or was ended by a back-end", **WRITE_ERRORS,
    }, body=Body({JSON: {"type": "object", "additionalProperties": False, "properties": {"ttlSeconds": _TTL}}},
                 required=False),
          description="Extend the held lease by ttlSeconds (default: its own) from now. " + DEVICE_TTL),
    Route(("DELETE",), "/devices/<device_id>/leases/<lease_id>", "releaseLease", (WRITE, _resource(LEASES)), {
        "204": Answer("Released or ended (or already gone)"), "404": "No lease has this id or fencing token",
        **COMMON, "504": None,
    }, description=(
        "With the leaseId: release the lease (or withdraw the waiting ticket). With the fencingToken alone: end that "
        "lease or waiting ticket whoever holds it (devices.write only); its holder's next heartbeat is 410 and its "
        "leaseToken opens nothing.")),
    Route(("POST",), "/devices/<device_id>/token", "issueDeviceToken", (ISSUE, _resource(TOKEN)), {
        "200": Answer("The token; never cached (Cache-Control: no-store)", "DeviceToken", ("Cache-Control",)),
        "404": "No such device (never created, deleted or expired): device-not-found", "415": None,
        "429": "Too many tokens are being signed at once (the signing key's request quota); Retry-After says when "
               "to try again",
        "503": "Token signing is unavailable for now; Retry-After is set",
    }, body=Body({JSON: {"type": "object", "additionalProperties": False, "maxProperties": 0}}, required=False),
          assertion=True, description=(
        "A device token (a JWT naming this device, signed by the device-token issuer) for the device itself, called "
        "with its client certificate, a device token, or an assertion signed with a credential it registered (POST "
        "/devices/{deviceId}/credentials): every route and the WebSocket API accept it. " + ASSERTION_RULES + " "
        "An assertion refused is 401 with its problem type (assertion-expired, assertion-replayed, "
        "credential-unknown, credential-revoked, ...). Renewal with a "
        "token is refused once the device last authenticated with its certificate longer ago than the renewal bound "
        "(403 certificate-required); no token outlives that bound. A token names a device that exists when it is "
        "issued.")),
    Route(("GET", "HEAD"), "/devices/<device_id>/jobs", "listDeviceJobs", (READ, _resource()), {
        "200": Answer("A page of the jobs whose write reached the device, by job id, each with the device's "
                      "execution", "DeviceJobs"),
        "404": NO_DEVICE, **COMMON,
    }, query=(JOB_LIMIT, PAGE_CURSOR), description=(
        "Each job whose desired write reached the device, while the device keeps its mark (until a day after the "
        "execution's deadline). A device may read its own.")),
    Route(("POST",), "/jobs", "createJob", (WRITE, JOBS), {
        "201": Answer("The job, started", "Job", ("Location", "ETag", "Idempotent-Replayed")),
        "400": "Bad request: the job cannot be run (invalid-job, its member named), a filter on an undeclared field "
               "(unindexed-filter), a malformed filter",
        "409": "A job of that jobId exists", "422": REUSED, **WRITE_ERRORS,
    }, headers=(IDEMPOTENCY_KEY,), body=Body({JSON: JOB_BODY}), description=(
        "One desired change for every device a filter matches (or a list names), written at most once per device "
        "and tracked per device from what the device reports. See docs/api/jobs.md.")),
    Route(("GET", "HEAD"), "/jobs", "listJobs", (READ, JOBS), {
        "200": Answer("A page of jobs, newest first", "JobPage"), **COMMON,
    }, query=(Param("status", {"type": "string", "enum": list(jobs.JOB_STATUSES)}), JOB_LIMIT, PAGE_CURSOR)),
    Route(("GET", "HEAD"), "/jobs/<job_id>", "getJob", (READ, JOBS), {
        "200": Answer("The job with its counts", "Job", ("ETag",)), "304": Answer("Not modified"),
        "404": "No such job", **COMMON,
    }, query=(Param("waitSeconds", {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECONDS, "default": 0},
                    "Long-poll: wait until the job's ETag differs from If-None-Match's"),),
        headers=(JOB_IF_NONE_MATCH,), waits="query"),
    Route(("GET", "HEAD"), "/jobs/<job_id>/executions", "listJobExecutions", (READ, JOBS), {
        "200": Answer("A page of the job's executions, in target order", "ExecutionPage"),
        "404": "No such job", **COMMON,
    }, query=(Param("state", {"type": "string", "enum": list(jobs.EXECUTION_STATES)}), JOB_LIMIT, PAGE_CURSOR)),
    Route(("POST",), "/jobs/<job_id>/cancel", "cancelJob", (WRITE, JOBS), {
        "200": Answer("The job, canceled", "Job", ("ETag", "Idempotent-Replayed")), "404": "No such job",
        "409": "The job has ended (job-ended)", "422": REUSED, **COMMON, "504": None,
    }, query=(Param("force", {"type": "boolean", "default": False},
                    "Also remove the job's leaves from devices still in progress where the job still owns them"),),
        headers=(IDEMPOTENCY_KEY,), description=(
        "Stops queuing: queued executions are CANCELED, never written. With an Idempotency-Key, the same request "
        "sent again (after a lost answer or a 504) answers the job again with Idempotent-Replayed: true, rather than "
        "409 job-ended.")),
    *IDENTITY_ROUTES,
    Route(("POST",), "/transactions", "runTransaction", EachOperation(), {
        "200": Answer("Applied: the devices in order (null for a delete)", "TransactionResult",
                      ("Idempotent-Replayed",)),
        "404": "Every failing operation's device is missing (see operations)",
        "409": "Operations failed for different reasons, or exist/condition/test failed",
        "412": "Every failing operation's ifMatch is stale",
        "422": "A patch cannot be applied, or the Idempotency-Key was reused",
        "423": "Every failing operation's device is leased to another holder",
        **WRITE_ERRORS,
        "413": ("Body over the limit, an item or the whole transaction too large, or the answer, the devices with "
                "their metadata, past what a Lambda may answer (limit answer-size); nothing was written"),
    }, query=(INCLUDE,), headers=(IDEMPOTENCY_KEY,), body=Body({JSON: TRANSACTION}), description=(
        f"All-or-nothing changes to up to {MAX_OPERATIONS} devices ({MAX_OPERATIONS - 1} with Idempotency-Key).")),
)

BY_OPERATION = {declaration.operation: declaration for declaration in ROUTES}
# (method, rule) -> its declaration: what a 405's Allow header and the route table of rights read.
BY_METHOD_AND_RULE = {(method, declaration.rule): declaration for declaration in ROUTES
                      for method in declaration.methods}
# (method, API Gateway resource path) of every route that may wait: the stack gives them a function
# of their own (infra/api.py), the dev server (make serve) a share of its workers.
WAITING_ROUTES = frozenset((method, declaration.openapi_path.lstrip("/")) for declaration in ROUTES
                           if declaration.waits for method in declaration.methods)


def rules_for_path(path: str) -> list[Route]:
    """Every declaration whose rule matches ``path`` (a trailing slash as absent, as Powertools has it)."""
    path = path.rstrip("/") or "/"
    return [declaration for declaration in ROUTES if _rule_pattern(declaration.rule).fullmatch(path)]


@functools.lru_cache(maxsize=None)
def _rule_pattern(rule: str) -> re.Pattern:
    return re.compile(re.sub(r"<(\w+)>", r"(?P<\1>[^/]+)", re.escape(rule)))


def unroutable(path: str) -> Exception:
    """The refusal of a path a route of its method would take but for a parameter holding a
    character Powertools routes none with (a raw ", \\, ` or control character, a symbol): the
    device id's own refusal when it is the device id, else a BadRequest. Percent-encoded, the same
    parameter reaches its route and is refused there alike."""
    for declaration in rules_for_path(path):
        for name, value in _rule_pattern(declaration.rule).fullmatch(path.rstrip("/") or "/").groupdict().items():
            if name == "device_id":
                try:
                    validate_device_id(unquote(value))
                except InvalidDeviceId as refused:
                    return refused
    return BadRequest("a path parameter holds a character none may (such as \", \\, ` or a control character)")


def allowed_methods(path: str) -> list[str]:
    """The methods a 405 lists: those of the fixed path when one matches (/devices/count, not /devices/<id>)."""
    matches = rules_for_path(path)
    exact = [declaration for declaration in matches if "<" not in declaration.rule]
    return sorted({method for declaration in exact or matches for method in declaration.methods})
