"""The API's OpenAPI 3 document, served at GET /openapi.json and built from the route
declarations (``routes``) when that route is first asked for, never at a cold start: each
operation's parameters, body and rights are those the service holds requests to. Here live only
what the document adds for readers: the schemas of what the service answers (and of what a
state holds, which the library checks), the standard meaning of common statuses, and the
document's own texts."""

from __future__ import annotations

from decimal import Decimal

from functions.auth import rights
from functions.auth.principals import SCOPES, Principal
from functions.device_state.jobs import EXECUTION_STATES, JOB_STATUSES
from functions.device_state import (CONFIRMATION_BYTES, DEVICE_SECTIONS, MAX_CLEARED_KEPT, MAX_CLEARED_KEPT_BYTES,
                                    MAX_EXPONENT, MAX_MEMBER_NAME_BYTES, MAX_OPERATIONS, MAX_PATCH_OPERATIONS,
                                    MAX_POINTER_BYTES, MAX_SIGNIFICANT_DIGITS, MAX_STATE_DEPTH, MAX_STATE_ITEM_BYTES,
                                    METADATA_ENTRY_BYTES, MIN_EXPONENT, SECTIONS, STATUS_BYTES)

from .request_parsing import LEASE_TOKEN_PATTERN, MAX_BODY_BYTES
from .routes import BY_ASSERTION, DELTA_RULES, PER_OPERATION, PUBLIC, ROUTES, EachOperation, Param, Route, Writes
from .validation import Ref

# The limits every write is checked against before anything is written (the problem's
# `limit` member names the one a request broke).
LIMITS = {
    "memberNameBytes": MAX_MEMBER_NAME_BYTES,  # 400, limit member-name
    "stateDepth": MAX_STATE_DEPTH,  # 400, limit nesting-depth
    "patchMembers": MAX_PATCH_OPERATIONS,  # 400, limit patch-members
    "stateItemBytes": MAX_STATE_ITEM_BYTES,  # 413, limit item-size
    "leafPointerBytes": MAX_POINTER_BYTES,  # 400, limit leaf-pointer
    "metadataEntryBytes": METADATA_ENTRY_BYTES,  # per desired/reported leaf, beside its pointer, in the item
    "statusEntryBytes": STATUS_BYTES,  # per desired leaf with a status, beside its pointer and the ack's reason
    "confirmationEntryBytes": CONFIRMATION_BYTES,  # per kept confirmation of a cleared desire, beside its pointer
    "keptConfirmations": MAX_CLEARED_KEPT,  # the newest kept, as many as fit in these bounds
    "keptConfirmationBytes": MAX_CLEARED_KEPT_BYTES,
    "bodyBytes": MAX_BODY_BYTES,  # 413
    "transactionOperations": MAX_OPERATIONS,
}
_LIMITS_TEXT = (f"Limits, checked before anything is written: object member names up to {MAX_MEMBER_NAME_BYTES} "
                f"bytes of UTF-8 (400, limit member-name); state nested up to {MAX_STATE_DEPTH} levels (400, "
                f"nesting-depth); a patch sets up to {MAX_PATCH_OPERATIONS} members or JSON Patch operations (400, "
                f"patch-members); the JSON Pointer of a desired or reported leaf up to {MAX_POINTER_BYTES} bytes "
                f"escaped (400, leaf-pointer); the device's stored item up to {MAX_STATE_ITEM_BYTES} bytes, which "
                f"keeps room for the lease holder, the write journal and the version's change record (413, "
                f"item-size): it holds state, desired and reported and, per leaf of desired and reported, a "
                f"metadata entry of the leaf's JSON Pointer (escaped) plus {METADATA_ENTRY_BYTES} bytes, per "
                f"desired leaf with an expiry, clear on confirm or an ack a status of its pointer plus "
                f"{STATUS_BYTES} bytes and the ack's reason, and the newest confirmations of cleared desires, each "
                f"its pointer plus {CONFIRMATION_BYTES} bytes, at most {MAX_CLEARED_KEPT} and "
                f"{MAX_CLEARED_KEPT_BYTES} bytes of them (a write that needs their room drops them); "
                f"bodies up to {MAX_BODY_BYTES} bytes (413); transactions of up to {MAX_OPERATIONS} operations "
                f"({MAX_OPERATIONS - 1} with Idempotency-Key) whose answer, the devices with their metadata, fits "
                f"in what a Lambda may answer (413, answer-size).")
_AUTH_TEXT = ("Every operation but GET /openapi.json needs credentials: a back-end sends a bearer token (JWT) whose "
              "scope claim names what it may do (devices.read, devices.write, devices.report; devices.admin "
              "registers and revokes devices' credentials and manages enrollments); a device sends a "
              "bearer token with a device_id claim, or, on the device domain, a client certificate (mutual TLS, "
              "SAN URI:urn:device:<id> or CN <id>; OpenAPI 3.0 has no scheme for it, see x-mutual-tls), never "
              "both; with a certificate it gets a device token from POST /devices/{deviceId}/token for where no "
              "certificate goes (the WebSocket API), or with an assertion it signs with a credential it "
              "registered (deviceAssertion). A device may read itself, write its own reported section and "
              "take its own leases (for at most "
              f"{rights.DEVICE_MAX_LEASE_SECONDS} s at a time; a back-end with devices.write may end any lease). "
              "A write needs, beside its operation's own right, write on every section it sets, on every route and "
              "in every transaction operation: state and desired take devices.write, reported devices.report, so "
              "a create, replace or transaction put whose body has reported needs devices.write and "
              "devices.report.")

# What a status means where a route's declaration gives it no words of its own (None).
STANDARD = {
    "400": "Malformed request: JSON, deviceId, headers or parameters; a path or query that is not UTF-8; a number "
           "DynamoDB cannot hold exactly (limit precision), text that is not valid Unicode, nesting too deep (limit "
           f"nesting-depth), a member name over {MAX_MEMBER_NAME_BYTES} bytes (limit member-name), a patch of more "
           f"than {MAX_PATCH_OPERATIONS} members (limit patch-members), a desired or reported leaf whose JSON Pointer "
           f"passes {MAX_POINTER_BYTES} bytes (limit leaf-pointer)",
    "413": f"Body over {MAX_BODY_BYTES} bytes, or the device's item would pass {MAX_STATE_ITEM_BYTES} bytes, per-leaf "
           "metadata of desired and reported included (limit item-size)",
    "415": "Unsupported Content-Type",
    "503": "Contention retries exhausted or storage unavailable; Retry-After is set",
    # A write whose DynamoDB answer was lost and could not be settled: applied at most once, maybe not at all.
    "504": "outcome-unknown: the change may or may not have been applied (once at most); GET the device to see, or "
           "retry with an Idempotency-Key",
}
# The 403 of a write whose body may name sections beyond what its route's own right covers.
_SECTIONS_403 = ("These credentials may not do this to this device (the problem names the action and resource); "
                 "a body with reported also needs devices.report")
_FORBIDDEN = "These credentials may not do this to this device (the problem names the action and resource)"
_UNAUTHORIZED = "No credentials, or a token that is not valid (WWW-Authenticate says which)"

RESPONSE_HEADERS = {
    "ETag": {"description": 'Strong entity tag of the device: "<version>"', "schema": {"type": "string"}},
    "Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]}},
    "Location": {"schema": {"type": "string"}},
    "Cache-Control": {"schema": {"type": "string", "enum": ["no-store"]}},
}

# ---------------------------------------------------------------- what a state holds

# What a state can hold, as DynamoDB stores it exactly. JSON Schema cannot count significant
# digits or nesting levels, so the document admits a subset of what is stored: integers of at
# most MAX_SIGNIFICANT_DIGITS digits and non-integral numbers within DynamoDB's magnitudes.
_REF_VALUE = {"$ref": "#/components/schemas/Value"}
_LARGEST = Decimal(f"9.9E{MAX_EXPONENT}")  # Decimal: the service's JSON has no floats
_SMALLEST = Decimal(f"1E{MIN_EXPONENT}")
NUMBERS = [
    {"type": "integer", "minimum": -(10 ** MAX_SIGNIFICANT_DIGITS - 1), "maximum": 10 ** MAX_SIGNIFICANT_DIGITS - 1},
    {"type": "number", "not": {"type": "integer"}, "minimum": _SMALLEST, "maximum": _LARGEST},
    {"type": "number", "not": {"type": "integer"}, "minimum": -_LARGEST, "maximum": -_SMALLEST},
]
_OBJECT_OF_VALUES = {"type": "object", "properties": {"": {"not": {}}},  # DynamoDB has no empty member name
                     "additionalProperties": _REF_VALUE}
# A JSON Pointer into the state (RFC 6901): "" for the whole state, or member names each after a
# /, ~0 and ~1 escaped. Whether it names what the operation needs is the patch's to tell (422).
_POINTER = {"type": "string", "pattern": "^(/([^~/]|~[01])*)*$"}


def _json_patch_operations() -> list:
    """One schema per op, with the members that op needs (RFC 6902, plus increment); any other
    member is ignored, as RFC 6902 has it."""
    def operation(op, **members):
        required = ["op", "path", *[name for name in members if name in ("value", "from")]]
        return {"type": "object", "required": required,
                "properties": {"op": {"type": "string", "enum": [op]}, "path": _POINTER, **members}}

    number = {"anyOf": NUMBERS}
    # min <= max is a rule JSON Schema cannot state between two members: when both are given,
    # the document admits min <= 0 <= max.
    integer, positive, negative = NUMBERS
    low = {"anyOf": [{**integer, "maximum": 0}, negative]}
    high = {"anyOf": [{**integer, "minimum": 0}, positive]}
    return [operation("add", value=_REF_VALUE), operation("remove"), operation("replace", value=_REF_VALUE),
            operation("move", **{"from": _POINTER}), operation("copy", **{"from": _POINTER}),
            operation("test", value=_REF_VALUE),
            operation("increment", value=number, min=number), operation("increment", value=number, max=number),
            {**operation("increment", value=number, min=low, max=high),
             "required": ["op", "path", "value", "min", "max"]}]


_CONFIRMATION = (
    "A desired leaf carries confirmedVersion v when reported holds an equal value at the same path, last set "
    "at version v >= the desired leaf's version; expiresAt and expired (a desire with expiresIn), clearOnConfirm, "
    "and ack {code, version, reason, at} (the device's answer to this desire); a leaf cleared on confirm keeps "
    "{version, confirmedVersion, cleared: true}.")
_TIME = {"type": "string", "format": "date-time"}
_SECTION_NAMES = {"type": "string", "enum": list(SECTIONS)}
# A device token's answer. Provisioned is built from it as one closed object with deviceId and
# credentialId added, not an allOf: a member with additionalProperties false would refuse what the others add.
_DEVICE_TOKEN = {
    "type": "object", "required": ["token", "tokenType", "expiresIn", "expiresAt"],
    "additionalProperties": False,
    "properties": {"token": {"type": "string"}, "tokenType": {"type": "string", "enum": ["Bearer"]},
                   "expiresIn": {"type": "integer", "minimum": 1,
                                 "description": "Seconds from now until the token expires"},
                   "expiresAt": _TIME}}

SCHEMAS = {
    "State": {**_OBJECT_OF_VALUES, "description": (
        f"Any JSON object DynamoDB can hold exactly: numbers of at most {MAX_SIGNIFICANT_DIGITS} significant digits "
        f"within 1E{MIN_EXPONENT}..9.9E{MAX_EXPONENT} in magnitude, no empty member names, at most 31 levels deep, "
        "and an item under 400 KB.")},
    "MergePatch": {**_OBJECT_OF_VALUES, "description": "RFC 7396: members set, null removes one"},
    "Value": {"description": "A JSON value a state can hold", "anyOf": [
        {"type": "string"}, {"type": "boolean"}, *NUMBERS,
        {"type": "array", "items": _REF_VALUE}, _OBJECT_OF_VALUES,
        {"type": "string", "nullable": True, "enum": [None]}]},
    "JsonPatch": {"type": "array", "items": {"anyOf": _json_patch_operations()}},
    "Device": {
        "type": "object", "required": ["deviceId", "version", "state", "createdAt", "updatedAt", *DEVICE_SECTIONS,
                                       "delta"],
        "properties": {
            "deviceId": {"type": "string"}, "version": {"type": "integer", "minimum": 1},
            "state": {"type": "object"}, "createdAt": _TIME, "updatedAt": _TIME,
            "desired": {"type": "object", "description": "What apps want the device to be"},
            "reported": {"type": "object", "description": "What the device says it is"},
            "delta": {"type": "object", "description": DELTA_RULES},
            "connectivity": {
                "type": "object", "description": "On reads only (GET /devices/{deviceId}, /devices): whether the "
                                                 "device holds a WebSocket connection of its own credentials, since "
                                                 "when, and when it was last seen (its connects, writes and reads of "
                                                 "itself; at most once a minute). Not a version: it changes no ETag.",
                "properties": {"connected": {"type": "boolean"}, "since": {**_TIME, "nullable": True},
                               "lastSeen": {**_TIME, "nullable": True}}},
            "metadata": {"type": "object", "description": "Only with include=metadata: per section, per leaf "
                                                          "(nested like the section) {version, updatedAt}. "
                                                          + _CONFIRMATION,
                         "properties": {section: {"type": "object"} for section in DEVICE_SECTIONS}},
        },
    },
    "DeviceCount": {
        "type": "object", "required": ["count"],
        "properties": {"count": {"type": "integer", "minimum": 0},
                       "groups": {"type": "array", "items": {
                           "type": "object", "required": ["value", "count"],
                           "properties": {"value": {"nullable": True, "anyOf": [
                               {"type": "string"}, {"type": "number"}, {"type": "boolean"}]},
                               "count": {"type": "integer", "minimum": 1}}}}},
    },
    "Job": {
        "type": "object", "required": ["jobId", "status", "counts", "total", "createdAt", "desired"],
        "properties": {"jobId": {"type": "string"}, "status": {"type": "string", "enum": list(JOB_STATUSES)},
                       "counts": {"type": "object", "properties": {
                           state: {"type": "integer", "minimum": 0} for state in EXECUTION_STATES}},
                       "total": {"type": "integer", "minimum": 0}, "createdAt": _TIME, "completedAt": _TIME,
                       "endsAt": _TIME, "desired": {"type": "object"}, "filter": {"type": "string"},
                       "deviceIdCount": {"type": "integer"}, "targets": {"type": "string"},
                       "targeting": {"type": "boolean"}, "abortedBy": {"type": "object"}},
    },
    "JobPage": {
        "type": "object", "required": ["items", "nextCursor"],
        "properties": {"items": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}},
                       "nextCursor": {"type": "string", "nullable": True}},
    },
    "Execution": {
        "type": "object", "required": ["deviceId", "state", "version"],
        "properties": {"deviceId": {"type": "string"}, "state": {"type": "string", "enum": list(EXECUTION_STATES)},
                       "version": {"type": "integer", "minimum": 0}, "updatedAt": {**_TIME, "nullable": True},
                       "code": {"type": "integer"}, "reason": {"type": "string"}},
    },
    "ExecutionPage": {
        "type": "object", "required": ["items", "nextCursor"],
        "properties": {"items": {"type": "array", "items": {"$ref": "#/components/schemas/Execution"}},
                       "nextCursor": {"type": "string", "nullable": True}},
    },
    "DeviceJobs": {
        "type": "object", "required": ["items", "nextCursor"],
        "properties": {"items": {"type": "array", "items": {
            "type": "object", "required": ["jobId", "status", "execution"],
            "properties": {"jobId": {"type": "string"}, "status": {"type": "string"},
                           "execution": {"$ref": "#/components/schemas/Execution"}}}},
            "nextCursor": {"type": "string", "nullable": True}},
    },
    "DevicePage": {
        "type": "object", "required": ["items", "nextCursor"],
        "properties": {"items": {"type": "array", "items": {"$ref": "#/components/schemas/Device"}},
                       "nextCursor": {"type": "string", "nullable": True}},
    },
    "Delta": {"type": "object", "required": ["deviceId", "version", "delta"], "properties": {
        "deviceId": {"type": "string"}, "version": {"type": "integer", "minimum": 1}, "delta": {"type": "object"}}},
    "TransactionResult": {"type": "object", "required": ["devices"], "properties": {"devices": {
        "type": "array", "items": {"$ref": "#/components/schemas/Device"}}}},
    "Lease": {
        "type": "object", "required": ["deviceId", "leaseId", "leaseToken", "fencingToken", "expiresAt", "ttlSeconds"],
        "properties": {"deviceId": {"type": "string"}, "leaseId": {"type": "string"},
                       "leaseToken": {"type": "string", "pattern": LEASE_TOKEN_PATTERN,
                                      "description": "Secret: present it as Lease-Token to write"},
                       "fencingToken": {"type": "integer", "minimum": 1}, "expiresAt": _TIME,
                       "ttlSeconds": {"type": "number"}},
    },
    "LeaseStatus": {
        "type": "object", "required": ["deviceId", "holder", "queueLength", "queue"],
        "properties": {"deviceId": {"type": "string"}, "queueLength": {"type": "integer", "minimum": 0},
                       "queue": {"type": "array", "description": "The waiting tickets, in order",
                                 "items": {"type": "object", "required": ["fencingToken", "owner"],
                                           "properties": {"fencingToken": {"type": "integer", "minimum": 1},
                                                          "owner": {"type": "string", "nullable": True}}}},
                       "holder": {"type": "object", "nullable": True, "properties": {
                           "fencingToken": {"type": "integer"}, "expiresAt": _TIME,
                           "owner": {"type": "string", "nullable": True}}}},
    },
    "DeviceToken": _DEVICE_TOKEN,
    "Credential": {
        "type": "object", "required": ["credentialId", "type", "createdAt"],
        "properties": {"credentialId": {"type": "string"},
                       "type": {"type": "string", "enum": ["publicKey", "certificate", "secret"]},
                       "thumbprint": {"type": "string", "description": "A certificate's SHA-256 (hex)"},
                       "createdAt": _TIME, "expiresAt": _TIME,
                       "enrollmentId": {"type": "string", "description": "The enrollment that provisioned it"}}},
    "NewCredential": {"allOf": [{"$ref": "#/components/schemas/Credential"}, {"type": "object", "properties": {
        "secret": {"type": "string", "description": "A secret's bytes (base64): shown in this answer alone"}}}]},
    "CredentialList": {"type": "object", "required": ["items"], "properties": {
        "items": {"type": "array", "items": {"$ref": "#/components/schemas/Credential"}}}},
    "Enrollment": {
        "type": "object", "required": ["enrollmentId", "idPattern", "initial", "maxDevices", "provisioned",
                                       "createdAt"],
        "properties": {"enrollmentId": {"type": "string"}, "idPattern": {"type": "string"},
                       "initial": {"type": "object"}, "maxDevices": {"type": "integer", "minimum": 1},
                       "provisioned": {"type": "integer", "minimum": 0}, "createdAt": _TIME, "expiresAt": _TIME}},
    "NewEnrollment": {"allOf": [{"$ref": "#/components/schemas/Enrollment"}, {
        "type": "object", "required": ["groupKey"], "properties": {
            "groupKey": {"type": "string", "description": "32 random bytes (base64): shown in this answer alone"}}}]},
    "EnrollmentPage": {"type": "object", "required": ["items", "nextCursor"], "properties": {
        "items": {"type": "array", "items": {"$ref": "#/components/schemas/Enrollment"}},
        "nextCursor": {"type": "string", "nullable": True}}},
    "Provisioned": {**_DEVICE_TOKEN, "required": ["deviceId", "credentialId", *_DEVICE_TOKEN["required"]],
                    "properties": {"deviceId": {"type": "string"}, "credentialId": {"type": "string"},
                                   **_DEVICE_TOKEN["properties"]}},
    "Change": {
        "type": "object", "required": ["deviceId", "version", "previousVersion", "kind", "patch", "updatedAt"],
        "properties": {
            "deviceId": {"type": "string"}, "version": {"type": "integer", "minimum": 1},
            "previousVersion": {"type": "integer", "minimum": 0},
            "kind": {"type": "string", "enum": ["created", "updated", "replaced", "deleted"]},
            "patch": {"type": "array", "nullable": True, "items": {"type": "object"},
                      "description": "RFC 6902 over the whole document {state, desired, reported} (paths "
                                     "/state/..., /desired/..., /reported/...) from the previous version ({} for "
                                     "created) to this one; null for deleted"},
            "updatedAt": _TIME,
            "acks": {"type": "array", "description": "Only on a change that recorded acknowledgements: each {path, "
                                                     "version, code, reason, at}", "items": {"type": "object"}},
            "acksOmitted": {"type": "boolean", "enum": [True], "description": (
                "Instead of acks when they take more than 8 KB as JSON: the version's desired metadata "
                "(GET /devices/{deviceId}/versions/{version}?include=metadata) holds them")},
            "sections": {"type": "array", "items": _SECTION_NAMES, "description": "The sections the write changed"}},
    },
    "ChangePage": {
        "type": "object", "required": ["changes", "nextSince"],
        "properties": {"changes": {"type": "array", "items": {"$ref": "#/components/schemas/Change"}},
                       "nextSince": {"type": "integer", "minimum": 0}},
    },
    "OpenApi": {"type": "object"},
    "Problem": {
        "type": "object", "required": ["type", "title", "status", "detail"],
        "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                       "status": {"type": "integer"}, "detail": {"type": "string"},
                       "instance": {"type": "string"}, "deviceId": {"type": "string"},
                       "currentVersion": {"type": "integer"}, "limit": {"type": "string"},
                       "holderExpiresAt": _TIME, "leaseExpiresAt": _TIME,
                       "operations": {"type": "array", "items": {"type": "object", "properties": {
                           "index": {"type": "integer"}, "deviceId": {"type": "string"},
                           "status": {"type": "integer"}, "reason": {"type": "string"},
                           "detail": {"type": "string"},
                           "currentVersion": {"type": "integer", "nullable": True},
                           "leaseExpiresAt": _TIME}}}},
    },
}


# ---------------------------------------------------------------- from the declarations

def _parameter(parameter: Param, where: str) -> dict:
    entry = {"name": parameter.name, "in": where, "required": parameter.required or where == "path",
             "schema": parameter.schema}
    if parameter.description:
        entry["description"] = parameter.description
    if parameter.example:
        entry["example"] = parameter.example
    return entry


def _problem(description: str) -> dict:
    return {"description": description,
            "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def _response(status: str, answer) -> dict:
    if answer is None:
        return _problem(STANDARD[status])
    if isinstance(answer, str):
        return _problem(answer)
    response = {"description": answer.description}
    if answer.headers:
        response["headers"] = {name: RESPONSE_HEADERS[name] for name in answer.headers}
    if answer.schema:
        response["content"] = {"application/json": {"schema": {"$ref": f"#/components/schemas/{answer.schema}"}}}
    return response


def _may_call(principal: Principal, right) -> bool:
    """Whether the principal may call a route of this right on some device (its own, for a device)."""
    if right in (PUBLIC, PER_OPERATION):
        return True
    if right == BY_ASSERTION:
        return False
    action, template = right
    return rights.allowed(principal, action, template.format(device_id=principal.device_id or "any"))


def _secured(operation: dict, declaration: Route) -> None:
    """The operation's security (the scopes that grant it; a device token where a device may call
    it), and its 401 and 403 answers, from its declaration's rights."""
    right = declaration.right
    if right == PUBLIC:
        operation["security"] = []
        return
    operation["security"] = [{"backEnd": [scope]} for scope in SCOPES
                             if _may_call(Principal.client("any", [scope]), right)]
    if _may_call(Principal.device("any"), right):
        operation["security"].append({"deviceToken": []})
    if declaration.assertion:
        operation["security"].append({"deviceAssertion": []})
    writes = declaration.writes
    sets_sections = isinstance(writes, EachOperation) or (
        isinstance(writes, Writes) and writes.kind in (rights.WriteKind.CREATE, rights.WriteKind.PUT))
    operation["responses"]["401"] = _problem(_UNAUTHORIZED)
    operation["responses"]["403"] = _problem(_SECTIONS_403 if sets_sections else _FORBIDDEN)
    operation["responses"].setdefault("400", _problem(STANDARD["400"]))


def _operation(declaration: Route) -> dict:
    operation = {"operationId": declaration.operation}
    if declaration.description:
        operation["description"] = declaration.description
    parameters = [_parameter(parameter, "header") for parameter in declaration.headers] + \
                 [_parameter(parameter, "query") for parameter in declaration.query]
    if parameters:
        operation["parameters"] = parameters
    if declaration.body:
        operation["requestBody"] = {"required": declaration.body.required, "content": {
            media: {"schema": schema} for media, schema in declaration.body.content.items()}}
    operation["responses"] = {status: _response(status, answer) for status, answer in declaration.responses.items()}
    _secured(operation, declaration)
    return operation


def _head(get: dict) -> dict:
    """HEAD beside every GET (RFC 9110 9.3.2): the same parameters and statuses, no body."""
    return {**get, "operationId": get["operationId"] + "Head", "responses": {
        status: {key: value for key, value in response.items() if key != "content"}
        for status, response in get["responses"].items()}}


def _references(value, found: dict) -> dict:
    """Every component schema the declarations refer to (``validation.Ref``), by name."""
    if isinstance(value, Ref):
        if value.name not in found:
            found[value.name] = value.schema
            _references(value.schema, found)
    elif isinstance(value, dict):
        for member in value.values():
            _references(member, found)
    elif isinstance(value, (list, tuple)):
        for member in value:
            _references(member, found)
    return found


def build() -> dict:
    paths: dict = {}
    for declaration in ROUTES:
        item = paths.setdefault(declaration.openapi_path, {})
        if declaration.path:
            item["parameters"] = [_parameter(parameter, "path") for parameter in declaration.path]
        operation = _operation(declaration)
        for method in declaration.methods:
            item[method.lower()] = _head(operation) if method == "HEAD" else operation
    declared = _references([(d.path, d.query, d.headers, d.body and d.body.content) for d in ROUTES], {})
    return {
        "openapi": "3.0.3",
        "info": {"title": "Device-state service", "version": "1.0.0",
                 "description": "Read and change the state of smart devices with optimistic locking. " + _LIMITS_TEXT
                                + " " + _AUTH_TEXT,
                 "x-limits": LIMITS},
        "servers": [{"url": "/", "description": "The API's base path, where GET /openapi.json was served from: / "
                                                "under make serve, the stage (/prod) behind API Gateway"}],
        "paths": paths,
        "components": {
            "schemas": {**SCHEMAS, **declared},
            "securitySchemes": {
                "backEnd": {"type": "oauth2", "description": "A back-end's token: client credentials, scopes in scope",
                            "flows": {"clientCredentials": {"tokenUrl": "/oauth2/token", "scopes": {
                                scope: "see the table of rights in docs/api/auth.md" for scope in SCOPES}}}},
                "deviceToken": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                                "description": "A device's token: a device_id claim names the one device it is"},
                "deviceAssertion": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                                    "description": "A JWT the device signs with a credential it registered, or "
                                                   "with the key its enrollment derives for it (docs/api/identity.md)"},
            },
        },
        "x-mutual-tls": {"description": "Devices may call the device domain with a client certificate under the "
                                        "truststore instead of a token (not both: 400)"},
    }


OPENAPI = build()
