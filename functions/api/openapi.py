"""The API's OpenAPI 3 document, kept beside the routes (a test checks the two agree).
Served at GET /openapi.json. Its limits are the library's and the routes' own constants,
so the document cannot drift from what the service enforces."""

import re
from decimal import Decimal

from functions.auth import rights
from functions.auth.principals import SCOPES, Principal
from functions.device_state import (CONFIRMATION_BYTES, DEVICE_ID_PATTERN, KEY_PATTERN, MAX_CLEARED_KEPT,
                                    MAX_CLEARED_KEPT_BYTES, MAX_COUNT_INDEX_ENTRIES, MAX_COUNT_ITEMS, MAX_EXPONENT,
                                    MAX_FILTER_CHARS, MAX_LIST_LIMIT, MAX_MEMBER_NAME_BYTES, MAX_PATCH_OPERATIONS,
                                    MAX_POINTER_BYTES, MAX_SIGNIFICANT_DIGITS, MAX_STATE_DEPTH, MAX_STATE_ITEM_BYTES,
                                    METADATA_ENTRY_BYTES, MIN_EXPONENT, STATUS_BYTES)
from functions.device_state import MAX_OPERATIONS

from .devices import DEFAULT_LIST_LIMIT
from .leases import LIMITS as LEASE_LIMITS
from .leases import MAX_OWNER_LENGTH
from .request_parsing import LISTING_CURSOR_PATTERN, MAX_BODY_BYTES

_TTL = {"type": "number", "minimum": LEASE_LIMITS["ttlSeconds"][0], "maximum": LEASE_LIMITS["ttlSeconds"][1]}
_WAIT = {"type": "number", "minimum": LEASE_LIMITS["waitSeconds"][0], "maximum": LEASE_LIMITS["waitSeconds"][1]}
_TOKEN_PATTERN = "^[0-9a-f]{32}$"  # request_parsing.LEASE_TOKEN_PATTERN
# One or more entity tags, or *; the characters inside the quotes as RFC 9110's etagc (ASCII).
_TAGS_PATTERN = r'^\s*(\*|(W/)?"[!#-~]*"(\s*,\s*(W/)?"[!#-~]*")*)\s*$'

_DEVICE_ID = {"name": "deviceId", "in": "path", "required": True,
              "schema": {"type": "string", "pattern": f"^{DEVICE_ID_PATTERN.pattern}$"}}
_ETAG_HEADER = {"description": 'Strong entity tag of the device: "<version>"', "schema": {"type": "string"}}
_IF_MATCH = {"name": "If-Match", "in": "header", "required": False,
             "schema": {"type": "string", "minLength": 1, "pattern": _TAGS_PATTERN},
             "description": 'Only if the device is at this version ("<v>", strong comparison) or exists (*), '
                            'else 412.'}
_IF_NONE_MATCH = {"name": "If-None-Match", "in": "header", "required": False,
                  "schema": {"type": "string", "minLength": 1, "pattern": _TAGS_PATTERN}}
_IDEMPOTENCY_KEY = {"name": "Idempotency-Key", "in": "header", "required": False,
                    "schema": {"type": "string", "pattern": f"^{KEY_PATTERN.pattern}$"},
                    "description": "Apply this write at most once in 24 h; a retry with the same key and request "
                                   "gets the first answer again with Idempotent-Replayed: true."}
_LEASE_TOKEN = {"name": "Lease-Token", "in": "header", "required": False,
                "schema": {"type": "string", "pattern": _TOKEN_PATTERN},
                "description": "The secret leaseToken of the active lease's grant; needed while one is active "
                               "(else 423), refused when it names no active lease (409)."}
_LEASE_ID = {"name": "leaseId", "in": "path", "required": True, "schema": {"type": "string"},
             "description": "The leaseId its grant returned; on DELETE also the lease's fencingToken alone "
                            "(digits), which ends that lease or waiting ticket whoever holds it: a back-end with "
                            "devices.write may, a device may not (403)."}


_FILTER = {"name": "filter", "in": "query",
           "description": "RQL over declared fields (FLEET_INDEX): eq, ne, gt, ge, lt, le, in, like (a prefix "
                          'ending in *), exists, and, or, not; e.g. and(eq(reported/online,true),like(state/site,'
                          '"berlin-*")). exists(delta) and exists(delta/<path>) filter beside a declared field. '
                          "See docs/api/fleet-query.md.",
           "schema": {"type": "string", "minLength": 1, "maxLength": MAX_FILTER_CHARS}}


def _problem(description):
    return {"description": description,
            "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def _device(description, *extra_headers):
    headers = {"ETag": _ETAG_HEADER, "Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]}}}
    for name in extra_headers:
        headers[name] = {"schema": {"type": "string"}}
    return {"description": description, "headers": headers,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Device"}}}}


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
                f"({MAX_OPERATIONS - 1} with Idempotency-Key).")

_COMMON_ERRORS = {
    "400": _problem("Malformed request: JSON, deviceId, headers or parameters; a path or query that is not UTF-8; "
                    "a number DynamoDB cannot hold "
                    "exactly (limit precision), text that is not valid Unicode, nesting too deep (limit "
                    f"nesting-depth), a member name over {MAX_MEMBER_NAME_BYTES} bytes (limit member-name), a patch "
                    f"of more than {MAX_PATCH_OPERATIONS} members (limit patch-members), a desired or reported "
                    f"leaf whose JSON Pointer passes {MAX_POINTER_BYTES} bytes (limit leaf-pointer)"),
    "413": _problem(f"Body over {MAX_BODY_BYTES} bytes, or the device's item would pass {MAX_STATE_ITEM_BYTES} "
                    "bytes, per-leaf metadata of desired and reported included (limit item-size)"),
    "415": _problem("Unsupported Content-Type"),
    "503": _problem("Contention retries exhausted or storage unavailable; Retry-After is set"),
}

# A write whose DynamoDB answer was lost and could not be settled: applied at most once, maybe not at all.
_OUTCOME_UNKNOWN = _problem("outcome-unknown: the change may or may not have been applied (once at most); "
                            "GET the device to see, or retry with an Idempotency-Key")
_WRITE_ERRORS = {**_COMMON_ERRORS, "504": _OUTCOME_UNKNOWN}

_REUSED = _problem("The Idempotency-Key was used for a different request")
_LOCKED = _problem("The device is leased and the request has not the holder's Lease-Token")
_LEASE = {"description": "The lease", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Lease"}}}}
_DEVICE_TTL = (f"A device's lease is capped: from a device token or certificate, ttlSeconds above "
               f"{rights.DEVICE_MAX_LEASE_SECONDS} is 400.")
_LEASE_BODY = {"required": False, "content": {"application/json": {"schema": {
    "type": "object", "additionalProperties": False,
    "properties": {"ttlSeconds": {**_TTL, "description": _DEVICE_TTL}, "waitSeconds": _WAIT,
                   "owner": {"type": "string", "minLength": 1, "maxLength": MAX_OWNER_LENGTH}}}}}}

# What a state can hold, as DynamoDB stores it exactly. JSON Schema cannot count significant
# digits or nesting levels, so the document admits a subset of what is stored: integers of at
# most MAX_SIGNIFICANT_DIGITS digits and non-integral numbers within DynamoDB's magnitudes.
_REF_VALUE = {"$ref": "#/components/schemas/Value"}
_LARGEST = Decimal(f"9.9E{MAX_EXPONENT}")  # Decimal: the service's JSON has no floats
_SMALLEST = Decimal(f"1E{MIN_EXPONENT}")
_NUMBERS = [
    {"type": "integer", "minimum": -(10 ** MAX_SIGNIFICANT_DIGITS - 1), "maximum": 10 ** MAX_SIGNIFICANT_DIGITS - 1},
    {"type": "number", "not": {"type": "integer"}, "minimum": _SMALLEST, "maximum": _LARGEST},
    {"type": "number", "not": {"type": "integer"}, "minimum": -_LARGEST, "maximum": -_SMALLEST},
]
_OBJECT_OF_VALUES = {"type": "object", "properties": {"": {"not": {}}},  # DynamoDB has no empty member name
                     "additionalProperties": _REF_VALUE}
_STATE = {**_OBJECT_OF_VALUES, "description": (
    f"Any JSON object DynamoDB can hold exactly: numbers of at most {MAX_SIGNIFICANT_DIGITS} significant digits "
    f"within 1E{MIN_EXPONENT}..9.9E{MAX_EXPONENT} in magnitude, no empty member names, at most 31 levels deep, "
    "and an item under 400 KB.")}

_STATE_BODY = {"type": "object", "required": ["state"], "additionalProperties": False,
               "description": "deviceId may be repeated in the body when it equals the path's",
               "properties": {"state": _STATE}}

# A JSON Pointer into the state: one or more non-empty member names, ~0 and ~1 escaped.
_POINTER = {"type": "string", "pattern": "^(/([^~/]|~[01])+)+$"}


def _json_patch_operations() -> list:
    """One schema per op, with the members that op needs (RFC 6902, plus increment)."""
    def operation(op, **members):
        required = ["op", "path", *[name for name in members if name in ("value", "from")]]
        return {"type": "object", "required": required, "additionalProperties": False,
                "properties": {"op": {"type": "string", "enum": [op]}, "path": _POINTER, **members}}

    number = {"anyOf": _NUMBERS}
    # min <= max is a rule JSON Schema cannot state between two members: when both are given,
    # the document admits min <= 0 <= max.
    integer, positive, negative = _NUMBERS
    low = {"anyOf": [{**integer, "maximum": 0}, negative]}
    high = {"anyOf": [{**integer, "minimum": 0}, positive]}
    return [operation("add", value=_REF_VALUE), operation("remove"), operation("replace", value=_REF_VALUE),
            operation("move", **{"from": _POINTER}), operation("copy", **{"from": _POINTER}),
            operation("test", value=_REF_VALUE),
            operation("increment", value=number, min=number), operation("increment", value=number, max=number),
            {**operation("increment", value=number, min=low, max=high), "required": ["op", "path", "value", "min", "max"]}]


def _transaction_operations() -> list:
    """One schema per action; ifNoneMatch only on a put, and then without ifMatch."""
    device_id = {"type": "string", "pattern": f"^{DEVICE_ID_PATTERN.pattern}$"}
    if_match = {"type": "string", "pattern": '^(\\*|"[1-9][0-9]{0,17}")$',
                "description": 'One strong entity tag ("3") or *'}
    lease_token = {"type": "string", "pattern": _TOKEN_PATTERN}
    put = {"type": "object", "required": ["state"], "additionalProperties": False, "properties": {"state": _STATE}}

    def operation(action, value, **optional):
        return {"type": "object", "required": ["deviceId", action], "additionalProperties": False,
                "properties": {"deviceId": device_id, action: value, "leaseToken": lease_token, **optional}}

    return [operation("mergePatch", _OBJECT_OF_VALUES, ifMatch=if_match),
            operation("jsonPatch", {"$ref": "#/components/schemas/JsonPatch"}, ifMatch=if_match),
            operation("put", put, ifMatch=if_match),
            {**operation("put", put, ifNoneMatch={"type": "string", "enum": ["*"]}),
             "required": ["deviceId", "put", "ifNoneMatch"]},
            operation("delete", {"type": "boolean", "enum": [True]}, ifMatch=if_match),
            operation("check", {"type": "boolean", "enum": [True]}, ifMatch=if_match)]

OPENAPI = {
    "openapi": "3.0.3",
    "info": {"title": "Device-state service", "version": "1.0.0",
             "description": "Read and change the state of smart devices with optimistic locking. " + _LIMITS_TEXT,
             "x-limits": LIMITS},
    "servers": [{"url": "/", "description": "The API's base path, where GET /openapi.json was served from: / "
                                            "under make serve, the stage (/prod) behind API Gateway"}],
    "paths": {
        "/devices": {
            "get": {
                "operationId": "listDevices",
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                                "maximum": MAX_LIST_LIMIT,
                                                                "default": DEFAULT_LIST_LIMIT}},
                    {"name": "cursor", "in": "query", "description": "nextCursor of the page before, as given: it "
                     "belongs to the listing that issued it (the same filter and sort, or none) and is sealed with "
                     "the service's key, so any other (changed, another listing's, issued before the key was "
                     "replaced) is 400 invalid-cursor; limit may change between pages",
                     "schema": {"type": "string", "pattern": LISTING_CURSOR_PATTERN}},
                    _FILTER,
                    {"name": "sort", "in": "query", "description": "With a filter: +path or -path on a declared "
                     "field (FLEET_INDEX); devices lacking it come last",
                     "schema": {"type": "string", "pattern": "^[+-](state|desired|reported)/.+$"}},
                ],
                "responses": {
                    "200": {"description": "A page of devices: the fleet in key order, or those the filter matches",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DevicePage"}}}},
                    "400": _problem("Bad request: a malformed filter (its position named), a filter with a branch "
                                    "on no declared field (unindexed-filter), a bad cursor or limit, a query that "
                                    "is not UTF-8"),
                    "503": _problem("Storage unavailable, or a declared field's index is still being built "
                                    "(index-building, with its progress); Retry-After is set"),
                },
            },
            "post": {
                "operationId": "createDevice",
                "parameters": [_IDEMPOTENCY_KEY],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "required": ["deviceId", "state"], "additionalProperties": False,
                    "properties": {"deviceId": {"type": "string", "pattern": f"^{DEVICE_ID_PATTERN.pattern}$"},
                                   "state": _STATE}}}}},
                "responses": {"201": _device("Created", "Location"),
                              "409": _problem("The device exists"), "422": _REUSED, **_WRITE_ERRORS},
            },
        },
        "/devices/count": {
            "get": {
                "operationId": "countDevices",
                "parameters": [{**_FILTER, "required": True},
                               {"name": "groupBy", "in": "query", "description": "A declared field (FLEET_INDEX): "
                                "the count per value, most frequent first (null: devices without it)",
                                "schema": {"type": "string", "pattern": "^(state|desired|reported)/.+$"}}],
                "responses": {
                    "200": {"description": "How many devices the filter matches",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DeviceCount"}}}},
                    "400": _problem("Bad request: a missing or malformed filter, a filter with a branch on no "
                                    "declared field (unindexed-filter), a count that would read more than it may "
                                    f"(filter-too-broad: the items of over {MAX_COUNT_ITEMS} devices, or over "
                                    f"{MAX_COUNT_INDEX_ENTRIES} index entries; limit names which, fields the paths "
                                    "judged on the items), groupBy on an undeclared field, a query that is not UTF-8"),
                    "503": _problem("Storage unavailable, or a declared field's index is still being built "
                                    "(index-building, with its progress); Retry-After is set"),
                },
            },
        },
        "/devices/{deviceId}": {
            "parameters": [_DEVICE_ID],
            "get": {
                "operationId": "getDevice",
                "parameters": [_IF_MATCH, _IF_NONE_MATCH],
                "responses": {"200": _device("The device"), "304": {"description": "Not modified"},
                              "400": _COMMON_ERRORS["400"], "404": _problem("No such device"),
                              "412": _problem("If-Match does not match the device"),
                              "503": _COMMON_ERRORS["503"]},
            },
            "put": {
                "operationId": "putDevice",
                "parameters": [_IF_MATCH, _IF_NONE_MATCH, _IDEMPOTENCY_KEY, _LEASE_TOKEN],
                "requestBody": {"required": True, "content": {"application/json": {"schema": _STATE_BODY}}},
                "responses": {"200": _device("Replaced"), "201": _device("Created", "Location"),
                              "409": _problem("The Lease-Token names no active lease"), "423": _LOCKED,
                              "412": _problem("Precondition failed"), "428": _problem("Precondition required"),
                              "422": _REUSED, **_WRITE_ERRORS},
            },
            "patch": {
                "operationId": "patchDevice",
                "parameters": [_IF_MATCH, _IF_NONE_MATCH, _IDEMPOTENCY_KEY, _LEASE_TOKEN],
                "requestBody": {"required": True, "content": {
                    "application/merge-patch+json": {"schema": _OBJECT_OF_VALUES},
                    "application/json": {"schema": _OBJECT_OF_VALUES},
                    "application/json-patch+json": {"schema": {"$ref": "#/components/schemas/JsonPatch"}},
                }},
                "responses": {"200": _device("Patched"), "404": _problem("No such device"),
                              "409": _problem("A JSON Patch test failed, or the Lease-Token names no active lease"),
                              "423": _LOCKED,
                              "412": _problem("Precondition failed"),
                              "422": _problem("The patch cannot be applied to the state, or the "
                                              "Idempotency-Key was used for a different request"),
                              "428": _problem("Precondition required"), **_WRITE_ERRORS},
            },
            "delete": {
                "operationId": "deleteDevice",
                "parameters": [_IF_MATCH, _IF_NONE_MATCH, _IDEMPOTENCY_KEY, _LEASE_TOKEN],
                "responses": {"204": {"description": "Deleted"}, "404": _problem("No such device"),
                              "409": _problem("The Lease-Token names no active lease"), "423": _LOCKED,
                              "422": _REUSED,
                              "412": _problem("Precondition failed"), "428": _problem("Precondition required"),
                              "400": _COMMON_ERRORS["400"], "503": _COMMON_ERRORS["503"]},
            },
        },
        "/devices/{deviceId}/leases": {
            "parameters": [_DEVICE_ID],
            "post": {
                "operationId": "acquireLease",
                "description": "Queue for the device's FIFO lease and wait up to waitSeconds (default 0) to get it "
                               "for ttlSeconds (default 60). " + _DEVICE_TTL,
                "requestBody": _LEASE_BODY,
                "responses": {"201": {**_LEASE, "headers": {"Location": {"schema": {"type": "string"}}}},
                              "404": _problem("No such device"),
                              "409": _problem("Leased by another holder and not acquired within the wait; "
                                              "Retry-After and holderExpiresAt say when it runs out"),
                              "410": _problem("The waiting ticket was ended (DELETE …/leases/{fencingToken}) "
                                              "before it got the lease"),
                              **_WRITE_ERRORS},
            },
            "get": {
                "operationId": "getLeaseStatus",
                "responses": {"200": {"description": "The holder, if any, and the tickets waiting behind it, by "
                                                     "fencing token (what DELETE …/leases/{fencingToken} ends); "
                                                     "never a leaseId or leaseToken",
                                      "content": {"application/json": {"schema": {
                                          "$ref": "#/components/schemas/LeaseStatus"}}}},
                              "400": _COMMON_ERRORS["400"], "404": _problem("No such device"),
                              "503": _COMMON_ERRORS["503"]},
            },
        },
        "/devices/{deviceId}/leases/{leaseId}": {
            "parameters": [_DEVICE_ID, _LEASE_ID],
            "put": {
                "operationId": "heartbeatLease",
                "description": "Extend the held lease by ttlSeconds (default: its own) from now. " + _DEVICE_TTL,
                "requestBody": {"required": False, "content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": False, "properties": {"ttlSeconds": _TTL}}}}},
                "responses": {"200": _LEASE, "404": _problem("No lease has this id"),
                              "410": _problem("The lease has expired, was released, or was ended by a back-end"),
                              **_WRITE_ERRORS},
            },
            "delete": {
                "operationId": "releaseLease",
                "description": "With the leaseId: release the lease (or withdraw the waiting ticket). With the "
                               "fencingToken alone: end that lease or waiting ticket whoever holds it (devices.write "
                               "only); its holder's next heartbeat is 410 and its leaseToken opens nothing.",
                "responses": {"204": {"description": "Released or ended (or already gone)"},
                              "400": _COMMON_ERRORS["400"],
                              "404": _problem("No lease has this id or fencing token"),
                              "503": _COMMON_ERRORS["503"], "504": _OUTCOME_UNKNOWN},
            },
        },
        "/transactions": {
            "post": {
                "operationId": "runTransaction",
                "description": f"All-or-nothing changes to up to {MAX_OPERATIONS} devices "
                               f"({MAX_OPERATIONS - 1} with Idempotency-Key).",
                "parameters": [_IDEMPOTENCY_KEY],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "$ref": "#/components/schemas/Transaction"}}}},
                "responses": {
                    "200": {"description": "Applied: the devices in order (null for a delete)",
                            "headers": {"Idempotent-Replayed": {"schema": {"type": "string"}}},
                            "content": {"application/json": {"schema": {
                                "type": "object", "required": ["devices"], "properties": {"devices": {
                                    "type": "array", "items": {"$ref": "#/components/schemas/Device"}}}}}}},
                    "404": _problem("Every failing operation's device is missing (see operations)"),
                    "409": _problem("Operations failed for different reasons, or exist/condition/test failed"),
                    "412": _problem("Every failing operation's ifMatch is stale"),
                    "422": _problem("A patch cannot be applied, or the Idempotency-Key was reused"),
                    "423": _problem("Every failing operation's device is leased to another holder"),
                    **_WRITE_ERRORS,
                },
            },
        },
        "/openapi.json": {
            "get": {"operationId": "getOpenApi",
                    "responses": {"200": {"description": "This document",
                                          "content": {"application/json": {"schema": {"type": "object"}}}},
                                  "400": _problem("A path or query that is not UTF-8")}},
        },
    },
    "components": {
        "schemas": {
            "Device": {
                "type": "object", "required": ["deviceId", "version", "state", "createdAt", "updatedAt"],
                "properties": {"deviceId": {"type": "string"}, "version": {"type": "integer", "minimum": 1},
                               "state": {"type": "object"}, "createdAt": {"type": "string", "format": "date-time"},
                               "updatedAt": {"type": "string", "format": "date-time"}},
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
            "DevicePage": {
                "type": "object", "required": ["items", "nextCursor"],
                "properties": {"items": {"type": "array", "items": {"$ref": "#/components/schemas/Device"}},
                               "nextCursor": {"type": "string", "nullable": True}},
            },
            "Value": {"description": "A JSON value a state can hold", "anyOf": [
                {"type": "string"}, {"type": "boolean"}, *_NUMBERS,
                {"type": "array", "items": _REF_VALUE}, _OBJECT_OF_VALUES,
                {"type": "string", "nullable": True, "enum": [None]}]},
            "JsonPatch": {"type": "array", "items": {"anyOf": _json_patch_operations()}},
            "Transaction": {
                "type": "object", "required": ["operations"], "additionalProperties": False,
                "description": "Each device at most once per transaction; at most "
                               f"{MAX_OPERATIONS - 1} operations with an Idempotency-Key.",
                "properties": {"operations": {"type": "array", "minItems": 1, "maxItems": MAX_OPERATIONS,
                                              "items": {"anyOf": _transaction_operations()}}},
            },
            "Lease": {
                "type": "object",
                "required": ["deviceId", "leaseId", "leaseToken", "fencingToken", "expiresAt", "ttlSeconds"],
                "properties": {"deviceId": {"type": "string"}, "leaseId": {"type": "string"},
                               "leaseToken": {"type": "string", "pattern": _TOKEN_PATTERN,
                                              "description": "Secret: present it as Lease-Token to write"},
                               "fencingToken": {"type": "integer", "minimum": 1},
                               "expiresAt": {"type": "string", "format": "date-time"},
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
                                   "fencingToken": {"type": "integer"},
                                   "expiresAt": {"type": "string", "format": "date-time"},
                                   "owner": {"type": "string", "nullable": True}}}},
            },
            "Problem": {
                "type": "object", "required": ["type", "title", "status", "detail"],
                "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                               "status": {"type": "integer"}, "detail": {"type": "string"},
                               "instance": {"type": "string"}, "deviceId": {"type": "string"},
                               "currentVersion": {"type": "integer"}, "limit": {"type": "string"},
                               "holderExpiresAt": {"type": "string", "format": "date-time"},
                               "leaseExpiresAt": {"type": "string", "format": "date-time"},
                               "operations": {"type": "array", "items": {"type": "object", "properties": {
                                   "index": {"type": "integer"}, "deviceId": {"type": "string"},
                                   "status": {"type": "integer"}, "reason": {"type": "string"},
                                   "detail": {"type": "string"},
                                   "currentVersion": {"type": "integer", "nullable": True}}}}},
            },
        },
    },
}


# ---- The change feed and history (issue 15): GET /devices/{id}/changes, /versions/{v}.
from functions.device_state import MAX_FEED_LIMIT  # noqa: E402
from .changes import DEFAULT_FEED_LIMIT, MAX_VERSION, MAX_WAIT_SECONDS  # noqa: E402

_FEED_GUARANTEE = (
    "Every change of the device, oldest first, contiguous from since + 1: no gaps, no duplicates, across "
    "deletes and re-creations (versions never repeat). The feed trails writes by the stream's delay (usually "
    "well under a second); a writer that needs its own change asks with since = its version - 1. Changes are "
    "kept for the retention (CHANGE_RETENTION_SECONDS, default 7 days); since older than that is 410.")
OPENAPI["paths"]["/devices/{deviceId}/changes"] = {
    "parameters": [_DEVICE_ID],
    "get": {
        "operationId": "listChanges", "description": _FEED_GUARANTEE,
        "parameters": [
            {"name": "since", "in": "query", "description": "The last version seen (0: from the creation)",
             "schema": {"type": "integer", "minimum": 0, "maximum": MAX_VERSION, "default": 0}},
            {"name": "limit", "in": "query",
             "schema": {"type": "integer", "minimum": 1, "maximum": MAX_FEED_LIMIT, "default": DEFAULT_FEED_LIMIT}},
            {"name": "waitSeconds", "in": "query",
             "description": "Long-poll: when nothing is newer, wait up to this long for a change",
             "schema": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECONDS, "default": 0}},
        ],
        "responses": {
            "200": {"description": "The changes after since (empty at the wait's end)", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/ChangePage"}}}},
            "400": _problem("Malformed parameter, or since past the device's current version"),
            "404": _problem("No such device: no device, tombstone or change"),
            "410": _problem("changes-expired: since is older than the retention; currentVersion says where to "
                            "continue after reading the device"),
            "503": _COMMON_ERRORS["503"],
        },
    },
}
OPENAPI["paths"]["/devices/{deviceId}/versions/{version}"] = {
    "parameters": [_DEVICE_ID, {"name": "version", "in": "path", "required": True,
                                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_VERSION}}],
    "get": {
        "operationId": "getDeviceVersion",
        "description": "The device as it was at this version, within the change retention. The current "
                       "version is always shown; an older one the history has not recorded yet (it trails "
                       "writes by the stream's delay) is 503 not-yet-recorded with Retry-After.",
        "responses": {"200": _device("The device at that version"), "400": _COMMON_ERRORS["400"],
                      "404": _problem("No such version: never written, deleted at it, or past the retention"),
                      "503": _COMMON_ERRORS["503"]},
    },
}
OPENAPI["components"]["schemas"]["Change"] = {
    "type": "object", "required": ["deviceId", "version", "previousVersion", "kind", "patch", "updatedAt"],
    "properties": {
        "deviceId": {"type": "string"}, "version": {"type": "integer", "minimum": 1},
        "previousVersion": {"type": "integer", "minimum": 0},
        "kind": {"type": "string", "enum": ["created", "updated", "replaced", "deleted"]},
        "patch": {"type": "array", "nullable": True, "items": {"type": "object"},
                  "description": "RFC 6902 from the previous state ({} for created) to this one; null for deleted"},
        "updatedAt": {"type": "string", "format": "date-time"}},
}
OPENAPI["components"]["schemas"]["ChangePage"] = {
    "type": "object", "required": ["changes", "nextSince"],
    "properties": {"changes": {"type": "array", "items": {"$ref": "#/components/schemas/Change"}},
                   "nextSince": {"type": "integer", "minimum": 0}},
}
# ---- end of the change feed block


# ---- Desired, reported and delta: section routes, the lean delta, include=metadata.
from functions.device_state import (DEVICE_SECTIONS, MAX_ACKS, MAX_EXPIRY_SECONDS, MAX_REASON_CHARS,  # noqa: E402
                                    MIN_EXPIRY_SECONDS)
from .devices import MAX_DELTA_WAIT_SECONDS  # noqa: E402

_INCLUDE = {"name": "include", "in": "query", "required": False, "schema": {"type": "string", "enum": ["metadata"]},
            "description": "metadata: add per-leaf version, updatedAt and confirmedVersion of desired and reported"}
_DELTA_RULES = (
    "delta: every desired leaf (a scalar, an array compared whole, or an empty object) that reported lacks or "
    "holds differently (numbers by exact value), at its full path with the desired value, except leaves the "
    "device refused (an ack of 400 or more) and desires past their expiry; reported-only members are not in it; "
    "{} when there is no difference.")
_CONFIRMATION = (
    "A desired leaf carries confirmedVersion v when reported holds an equal value at the same path, last set "
    "at version v >= the desired leaf's version; expiresAt and expired (a desire with expiresIn), clearOnConfirm, "
    "and ack {code, version, reason, at} (the device's answer to this desire); a leaf cleared on confirm keeps "
    "{version, confirmedVersion, cleared: true}.")
for _section in DEVICE_SECTIONS:
    OPENAPI["paths"][f"/devices/{{deviceId}}/{_section}"] = {
        "parameters": [_DEVICE_ID],
        "patch": {
            "operationId": f"patch{_section.capitalize()}",
            "description": f"Merge patch (null removes) or JSON Patch (paths inside {_section}) of {_section}. "
                           "Answers the whole device with its delta.",
            "parameters": [_IF_MATCH, _IF_NONE_MATCH, _IDEMPOTENCY_KEY, _LEASE_TOKEN, _INCLUDE],
            "requestBody": OPENAPI["paths"]["/devices/{deviceId}"]["patch"]["requestBody"],
            "responses": {**OPENAPI["paths"]["/devices/{deviceId}"]["patch"]["responses"]},
        },
        "put": {
            "operationId": f"put{_section.capitalize()}",
            "description": f"Replace {_section} whole. Answers the whole device with its delta.",
            "parameters": [_IF_MATCH, _IF_NONE_MATCH, _IDEMPOTENCY_KEY, _LEASE_TOKEN, _INCLUDE],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": [_section], "additionalProperties": False,
                "properties": {_section: _STATE}}}}},
            "responses": {"200": _device("Replaced"), "404": _problem("No such device"),
                          "409": _problem("The Lease-Token names no active lease"), "423": _LOCKED,
                          "412": _problem("Precondition failed"), "428": _problem("Precondition required"),
                          "422": _REUSED, **_WRITE_ERRORS},
        },
    }
_DESIRE_PARAMETERS = [
    {"name": "expiresIn", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": MIN_EXPIRY_SECONDS, "maximum": MAX_EXPIRY_SECONDS},
     "description": "Seconds after which each leaf this write sets leaves the delta unless the device confirmed it "
                    "(its metadata then says expired); nothing is written at the deadline"},
    {"name": "clearOnConfirm", "in": "query", "required": False, "schema": {"type": "boolean", "default": False},
     "description": "true: the report that confirms a leaf this write sets removes it from desired in the same "
                    "write (its metadata keeps the confirmation, cleared: true)"},
]
for _method in ("patch", "put"):
    OPENAPI["paths"]["/devices/{deviceId}/desired"][_method]["parameters"] += _DESIRE_PARAMETERS
OPENAPI["paths"]["/devices/{deviceId}/desired/acks"] = {
    "parameters": [_DEVICE_ID],
    "post": {
        "operationId": "acknowledgeDesired",
        "description": "The device's answers to desires, per leaf (IoT Plug and Play's convention): 200 applied, "
                       "202 in progress (the leaf stays in the delta), 400-499 refused and 500-599 failed (the leaf "
                       "leaves the delta until desired sets it again). Each names the leaf's desired version it "
                       "answers; all are recorded in one write, or none.",
        "parameters": [_IDEMPOTENCY_KEY, _LEASE_TOKEN, _INCLUDE],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["acks"], "additionalProperties": False,
            "properties": {"acks": {"type": "array", "minItems": 1, "maxItems": MAX_ACKS, "items": {
                "type": "object", "required": ["path", "version", "code"], "additionalProperties": False,
                "properties": {
                    "path": {"type": "string", "pattern": "^(/([^/~]|~[01])*)+$", "maxLength": 1024,
                             "description": "JSON Pointer of a desired leaf (at most 4,096 bytes)"},
                    "version": {"type": "integer", "minimum": 1, "maximum": MAX_VERSION,
                                "description": "The leaf's desired version"},
                    "code": {"type": "integer", "minimum": 200, "maximum": 599},
                    "reason": {"type": "string", "maxLength": MAX_REASON_CHARS}}}}}}}}},
        "responses": {"200": _device("Recorded"), "404": _problem("No such device"),
                      "409": _problem("desire-moved: desired set the leaf again, or no longer holds it, since the "
                                      "version acknowledged (path, ackVersion, leafVersion); or the Lease-Token "
                                      "names no active lease"),
                      "423": _LOCKED, "422": _REUSED, **_WRITE_ERRORS},
    },
}
OPENAPI["paths"]["/devices/{deviceId}/delta"] = {
    "parameters": [_DEVICE_ID],
    "get": {
        "operationId": "getDelta",
        "description": "What the device must change. " + _DELTA_RULES + " Waits up to waitSeconds until a "
                       "write after version since (without since: the version found first) has changed desired "
                       "or reported (at once when one already has); either way it answers the current delta.",
        "parameters": [
            _IF_MATCH, _IF_NONE_MATCH,
            {"name": "since", "in": "query", "description": "The last version the caller has seen (at most "
                                                         "the device's version)",
             "schema": {"type": "integer", "minimum": 0, "maximum": MAX_VERSION}},
            {"name": "waitSeconds", "in": "query",
             "description": "Long-poll: wait for a write after since (without since: after the version found)",
             "schema": {"type": "integer", "minimum": 0, "maximum": MAX_DELTA_WAIT_SECONDS, "default": 0}},
        ],
        "responses": {
            "200": {"description": "The delta", "headers": {"ETag": _ETAG_HEADER}, "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Delta"}}}},
            "304": {"description": "Not modified"}, "400": _COMMON_ERRORS["400"],
            "404": _problem("No such device"), "412": _problem("If-Match does not match the device"),
            "503": _COMMON_ERRORS["503"]},
    },
}
OPENAPI["paths"]["/devices/{deviceId}/token"] = {
    "parameters": [_DEVICE_ID],
    "post": {
        "operationId": "issueDeviceToken",
        "description": "A device token (a JWT naming this device, signed by the device-token issuer) for the device "
                       "itself, called with its client certificate or a device token: every route and the WebSocket "
                       "API accept it. Renewal with a token is refused once the device last authenticated with its "
                       "certificate longer ago than the renewal bound (403 certificate-required); no token outlives "
                       "that bound. A token names a device that exists when it is issued.",
        "requestBody": {"required": False, "content": {"application/json": {"schema": {
            "type": "object", "additionalProperties": False, "maxProperties": 0}}}},
        "responses": {
            "200": {"description": "The token; never cached (Cache-Control: no-store)",
                    "headers": {"Cache-Control": {"schema": {"type": "string", "enum": ["no-store"]}}},
                    "content": {"application/json": {"schema": {
                        "type": "object", "required": ["token", "tokenType", "expiresIn", "expiresAt"],
                        "additionalProperties": False, "properties": {
                            "token": {"type": "string"}, "tokenType": {"type": "string", "enum": ["Bearer"]},
                            "expiresIn": {"type": "integer", "minimum": 1,
                                          "description": "Seconds from now until the token expires"},
                            "expiresAt": {"type": "string", "format": "date-time"}}}}}},
            "404": _problem("No such device (never created, deleted or expired): device-not-found"),
            "415": _COMMON_ERRORS["415"],
            "429": _problem("Too many tokens are being signed at once (the signing key's request quota); "
                            "Retry-After says when to try again"),
            "503": _problem("Token signing is unavailable for now; Retry-After is set"),
        },
    },
}
_schemas = OPENAPI["components"]["schemas"]
_schemas["Delta"] = {"type": "object", "required": ["deviceId", "version", "delta"], "properties": {
    "deviceId": {"type": "string"}, "version": {"type": "integer", "minimum": 1}, "delta": {"type": "object"}}}
_schemas["Device"]["required"] += ["desired", "reported", "delta"]
_schemas["Device"]["properties"].update({
    "desired": {"type": "object", "description": "What apps want the device to be"},
    "reported": {"type": "object", "description": "What the device says it is"},
    "delta": {"type": "object", "description": _DELTA_RULES},
    "connectivity": {
        "type": "object", "description": "On reads only (GET /devices/{deviceId}, /devices): whether the device "
                                         "holds a WebSocket connection of its own credentials, since when, and "
                                         "when it was last seen (its connects, writes and reads of itself; at most "
                                         "once a minute). Not a version: it changes no ETag.",
        "properties": {"connected": {"type": "boolean"},
                       "since": {"type": "string", "format": "date-time", "nullable": True},
                       "lastSeen": {"type": "string", "format": "date-time", "nullable": True}}},
    "metadata": {"type": "object", "description": "Only with include=metadata: per section, per leaf (nested like "
                                                  "the section) {version, updatedAt}. " + _CONFIRMATION,
                 "properties": {section: {"type": "object"} for section in DEVICE_SECTIONS}},
})
_sections_members = {section: _STATE for section in DEVICE_SECTIONS}
_STATE_BODY["properties"].update(_sections_members)  # PUT /devices/{id}: absent sections stay as they are
OPENAPI["paths"]["/devices"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"].update(
    _sections_members)  # absent sections are {}
OPENAPI["paths"]["/devices"]["get"]["parameters"].append(_INCLUDE)
OPENAPI["paths"]["/devices"]["post"]["parameters"].append(_INCLUDE)
for _method in ("get", "put", "patch"):
    OPENAPI["paths"]["/devices/{deviceId}"][_method]["parameters"].append(_INCLUDE)
OPENAPI["paths"]["/devices/{deviceId}/versions/{version}"]["get"]["parameters"] = [_INCLUDE]
OPENAPI["paths"]["/transactions"]["post"]["parameters"].append(_INCLUDE)
OPENAPI["paths"]["/devices/{deviceId}/changes"]["get"]["parameters"].append({
    "name": "sections", "in": "query", "schema": {"type": "string", "pattern": "^(state|desired|reported)"
                                                                              "(,(state|desired|reported))*$"},
    "description": "Only changes to these sections (comma-separated); nextSince still moves past the others"})
_schemas["Change"]["properties"]["acks"] = {
    "type": "array", "description": "Only on a change that recorded acknowledgements: each {path, version, code, "
                                    "reason, at}", "items": {"type": "object"}}
_schemas["Change"]["properties"]["sections"] = {
    "type": "array", "items": {"type": "string", "enum": ["state", "desired", "reported"]},
    "description": "The sections the write changed"}
_schemas["Change"]["properties"]["patch"]["description"] = (
    "RFC 6902 over the whole document {state, desired, reported} (paths /state/..., /desired/..., /reported/...) "
    "from the previous version ({} for created) to this one; null for deleted")
for _operation in _schemas["Transaction"]["properties"]["operations"]["items"]["anyOf"]:
    _members = _operation["properties"]
    if "mergePatch" in _members or "jsonPatch" in _members:
        _members["section"] = {"type": "string", "enum": ["state", "desired", "reported"], "default": "state",
                               "description": "The section the patch applies to (its paths are inside it)"}
    if "put" in _members:
        _members["put"]["properties"].update(_sections_members)
# ---- end of the sections block


def _with_head(document: dict) -> dict:
    """HEAD beside every GET (RFC 9110 9.3.2): the same parameters and statuses, no body."""
    for item in document["paths"].values():
        if "get" in item:
            get = item["get"]
            item["head"] = {**get, "operationId": get["operationId"] + "Head", "responses": {
                status: {key: value for key, value in response.items() if key != "content"}
                for status, response in get["responses"].items()}}
    return document


_with_head(OPENAPI)

_AUTH_TEXT = ("Every operation but GET /openapi.json needs credentials: a back-end sends a bearer token (JWT) whose "
              "scope claim names what it may do (devices.read, devices.write, devices.report); a device sends a "
              "bearer token with a device_id claim, or, on the device domain, a client certificate (mutual TLS, "
              "SAN URI:urn:device:<id> or CN <id>; OpenAPI 3.0 has no scheme for it, see x-mutual-tls), never "
              "both; with a certificate it gets a device token from POST /devices/{deviceId}/token for where no "
              "certificate goes (the WebSocket API). A device may read itself, write its own reported section and "
              "take its own leases (for at most "
              f"{rights.DEVICE_MAX_LEASE_SECONDS} s at a time; a back-end with devices.write may end any lease). "
              "A write needs, beside its operation's own right, write on every section it sets, on every route and "
              "in every transaction operation: state and desired take devices.write, reported devices.report, so "
              "a create, replace or transaction put whose body has reported needs devices.write and "
              "devices.report.")
# The 403 of a write whose body may name sections beyond what its route's own right covers.
_SECTIONS_403 = ("These credentials may not do this to this device (the problem names the action and resource); "
                 "a body with reported also needs devices.report")


def _with_security(document: dict) -> dict:
    """Each operation's security (the scopes that grant it; a device token where a device may call it), and
    its 401 and 403 answers, from the route table of rights (functions/auth/rights.py)."""
    document["components"]["securitySchemes"] = {
        "backEnd": {"type": "oauth2", "description": "A back-end's token: client credentials, scopes in scope",
                    "flows": {"clientCredentials": {"tokenUrl": "/oauth2/token", "scopes": {
                        rights_scope: "see the table of rights in docs/api/auth.md" for rights_scope in SCOPES}}}},
        "deviceToken": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                        "description": "A device's token: a device_id claim names the one device it is"},
    }
    document["x-mutual-tls"] = {"description": "Devices may call the device domain with a client certificate "
                                               "under the truststore instead of a token (not both: 400)"}
    document["info"]["description"] += " " + _AUTH_TEXT
    for path, item in document["paths"].items():
        rule = re.sub(r"\{(\w+)\}", lambda name: "<" + re.sub(r"(?<!^)([A-Z])", r"_\1", name.group(1)).lower() + ">",
                      path)
        for method, operation in item.items():
            if method == "parameters":
                continue
            needed = rights.route_rights(method.upper(), rule)
            if needed == rights.PUBLIC:
                operation["security"] = []
                continue
            granting = [scope for scope in SCOPES if rights.may_call(Principal.client("any", [scope]), method.upper(),
                                                                     rule)]
            operation["security"] = [{"backEnd": [scope]} for scope in granting]
            if rights.may_call(Principal.device("any"), method.upper(), rule):
                operation["security"].append({"deviceToken": []})
            operation["responses"]["401"] = _problem("No credentials, or a token that is not valid "
                                                     "(WWW-Authenticate says which)")
            operation["responses"]["403"] = _problem(
                _SECTIONS_403 if _sets_sections(method.upper(), rule) else
                "These credentials may not do this to this device (the problem names the action and resource)")
            operation["responses"].setdefault("400", _COMMON_ERRORS["400"])
    return document


def _sets_sections(method: str, rule: str) -> bool:
    """Whether the route's body may name sections its route's own right does not cover (a create, a
    put, a transaction's operations)."""
    kind, _ = rights.WRITE_ROUTES.get((method, rule), (None, None))
    return kind in (rights.WriteKind.CREATE, rights.WriteKind.PUT) or rights.route_rights(method, rule) == \
        rights.PER_OPERATION


_with_security(OPENAPI)
