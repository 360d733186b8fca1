"""The API's OpenAPI 3 document, kept beside the routes (a test checks the two agree).
Served at GET /openapi.json. Its limits are the library's and the routes' own constants,
so the document cannot drift from what the service enforces."""

from functions.device_state.idempotency import KEY_PATTERN
from functions.device_state.manager import MAX_LIST_LIMIT
from functions.device_state.transactions import MAX_OPERATIONS
from functions.device_state.values import DEVICE_ID_PATTERN

from .devices import DEFAULT_LIST_LIMIT
from .leases import LIMITS as LEASE_LIMITS
from .leases import MAX_OWNER_LENGTH
from .request_parsing import CURSOR_PATTERN, MAX_BODY_BYTES

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
_LEASE_ID = {"name": "leaseId", "in": "path", "required": True, "schema": {"type": "string"}}


def _problem(description):
    return {"description": description,
            "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def _device(description, *extra_headers):
    headers = {"ETag": _ETAG_HEADER, "Idempotent-Replayed": {"schema": {"type": "string", "enum": ["true"]}}}
    for name in extra_headers:
        headers[name] = {"schema": {"type": "string"}}
    return {"description": description, "headers": headers,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Device"}}}}


_COMMON_ERRORS = {
    "400": _problem("Malformed request: JSON, deviceId, headers or parameters; a number DynamoDB cannot hold "
                    "exactly (limit precision), text that is not valid Unicode, nesting too deep"),
    "413": _problem(f"Body over {MAX_BODY_BYTES} bytes, or resulting item too large"),
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
_LEASE_BODY = {"required": False, "content": {"application/json": {"schema": {
    "type": "object", "additionalProperties": False,
    "properties": {"ttlSeconds": _TTL, "waitSeconds": _WAIT,
                   "owner": {"type": "string", "minLength": 1, "maxLength": MAX_OWNER_LENGTH}}}}}}

_STATE_BODY = {"type": "object", "required": ["state"], "additionalProperties": False,
               "properties": {"state": {"type": "object"}, "deviceId": {"type": "string"}}}

OPENAPI = {
    "openapi": "3.0.3",
    "info": {"title": "Device-state service", "version": "1.0.0",
             "description": "Read and change the state of smart devices with optimistic locking."},
    "paths": {
        "/devices": {
            "get": {
                "operationId": "listDevices",
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                                "maximum": MAX_LIST_LIMIT,
                                                                "default": DEFAULT_LIST_LIMIT}},
                    {"name": "cursor", "in": "query", "description": "nextCursor of the page before",
                     "schema": {"type": "string", "pattern": CURSOR_PATTERN}},
                ],
                "responses": {
                    "200": {"description": "A page of devices",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DevicePage"}}}},
                    "400": _COMMON_ERRORS["400"], "503": _COMMON_ERRORS["503"],
                },
            },
            "post": {
                "operationId": "createDevice",
                "parameters": [_IDEMPOTENCY_KEY],
                "requestBody": {"required": True, "content": {"application/json": {"schema": {
                    "type": "object", "required": ["deviceId", "state"], "additionalProperties": False,
                    "properties": {"deviceId": {"type": "string", "pattern": f"^{DEVICE_ID_PATTERN.pattern}$"},
                                   "state": {"type": "object"}}}}}},
                "responses": {"201": _device("Created", "Location"),
                              "409": _problem("The device exists"), "422": _REUSED, **_WRITE_ERRORS},
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
                    "application/merge-patch+json": {"schema": {"type": "object"}},
                    "application/json": {"schema": {"type": "object"}},
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
                               "for ttlSeconds (default 60).",
                "requestBody": _LEASE_BODY,
                "responses": {"201": {**_LEASE, "headers": {"Location": {"schema": {"type": "string"}}}},
                              "404": _problem("No such device"),
                              "409": _problem("Leased by another holder and not acquired within the wait; "
                                              "Retry-After and holderExpiresAt say when it runs out"),
                              **_WRITE_ERRORS},
            },
            "get": {
                "operationId": "getLeaseStatus",
                "responses": {"200": {"description": "The holder, if any, and how many wait",
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
                "description": "Extend the held lease by ttlSeconds (default: its own) from now.",
                "requestBody": {"required": False, "content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": False, "properties": {"ttlSeconds": _TTL}}}}},
                "responses": {"200": _LEASE, "404": _problem("No lease has this id"),
                              "410": _problem("The lease has expired or was released"), **_WRITE_ERRORS},
            },
            "delete": {
                "operationId": "releaseLease",
                "responses": {"204": {"description": "Released (or already gone)"},
                              "400": _COMMON_ERRORS["400"], "404": _problem("No lease has this id"),
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
                                          "content": {"application/json": {"schema": {"type": "object"}}}}}},
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
            "DevicePage": {
                "type": "object", "required": ["items", "nextCursor"],
                "properties": {"items": {"type": "array", "items": {"$ref": "#/components/schemas/Device"}},
                               "nextCursor": {"type": "string", "nullable": True}},
            },
            "JsonPatch": {
                "type": "array",
                "items": {"type": "object", "required": ["op", "path"], "properties": {
                    "op": {"type": "string",
                           "enum": ["add", "remove", "replace", "move", "copy", "test", "increment"]},
                    "path": {"type": "string"}, "from": {"type": "string"}, "value": {},
                    "min": {"type": "number"}, "max": {"type": "number"}}},
            },
            "Transaction": {
                "type": "object", "required": ["operations"], "additionalProperties": False,
                "properties": {"operations": {"type": "array", "minItems": 1, "maxItems": MAX_OPERATIONS, "items": {
                    "type": "object", "required": ["deviceId"], "additionalProperties": False,
                    "properties": {
                        "deviceId": {"type": "string", "pattern": f"^{DEVICE_ID_PATTERN.pattern}$"},
                        "mergePatch": {"type": "object"},
                        "jsonPatch": {"$ref": "#/components/schemas/JsonPatch"},
                        "put": {"type": "object", "required": ["state"],
                                "properties": {"state": {"type": "object"}}},
                        "delete": {"type": "boolean", "enum": [True]},
                        "check": {"type": "boolean", "enum": [True]},
                        "ifMatch": {"type": "string", "pattern": _TAGS_PATTERN},
                        "ifNoneMatch": {"type": "string", "enum": ["*"]},
                        "leaseToken": {"type": "string", "pattern": _TOKEN_PATTERN},
                    }}}},
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
                "type": "object", "required": ["deviceId", "holder", "queueLength"],
                "properties": {"deviceId": {"type": "string"}, "queueLength": {"type": "integer", "minimum": 0},
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
from functions.device_state.changes import MAX_FEED_LIMIT  # noqa: E402
from .changes import DEFAULT_FEED_LIMIT, MAX_WAIT_SECONDS  # noqa: E402

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
             "schema": {"type": "integer", "minimum": 0, "default": 0}},
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
                                "schema": {"type": "integer", "minimum": 1}}],
    "get": {
        "operationId": "getDeviceVersion",
        "description": "The device as it was at this version, within the change retention.",
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
from functions.device_state.sections import DEVICE_SECTIONS  # noqa: E402
from .devices import MAX_DELTA_WAIT_SECONDS  # noqa: E402

_INCLUDE = {"name": "include", "in": "query", "required": False, "schema": {"type": "string", "enum": ["metadata"]},
            "description": "metadata: add per-leaf version, updatedAt and confirmedVersion of desired and reported"}
_DELTA_RULES = (
    "delta: every desired leaf (a scalar, an array compared whole, or an empty object) that reported lacks or "
    "holds differently (numbers by exact value), at its full path with the desired value; reported-only "
    "members are not in it; {} when there is no difference.")
_CONFIRMATION = (
    "A desired leaf carries confirmedVersion v when reported holds an equal value at the same path, last set "
    "at version v >= the desired leaf's version.")
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
                "properties": {_section: {"type": "object"}}}}}},
            "responses": {"200": _device("Replaced"), "404": _problem("No such device"),
                          "409": _problem("The Lease-Token names no active lease"), "423": _LOCKED,
                          "412": _problem("Precondition failed"), "428": _problem("Precondition required"),
                          "422": _REUSED, **_WRITE_ERRORS},
        },
    }
OPENAPI["paths"]["/devices/{deviceId}/delta"] = {
    "parameters": [_DEVICE_ID],
    "get": {
        "operationId": "getDelta",
        "description": "What the device must change. " + _DELTA_RULES + " With since, waits up to waitSeconds "
                       "until a write after version since has changed desired or reported (at once when one "
                       "already has); either way it answers the current delta.",
        "parameters": [
            _IF_NONE_MATCH,
            {"name": "since", "in": "query", "description": "The last version the caller has seen",
             "schema": {"type": "integer", "minimum": 0}},
            {"name": "waitSeconds", "in": "query", "description": "Long-poll (needs since)",
             "schema": {"type": "integer", "minimum": 0, "maximum": MAX_DELTA_WAIT_SECONDS, "default": 0}},
        ],
        "responses": {
            "200": {"description": "The delta", "headers": {"ETag": _ETAG_HEADER}, "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Delta"}}}},
            "304": {"description": "Not modified"}, "400": _COMMON_ERRORS["400"],
            "404": _problem("No such device"), "503": _COMMON_ERRORS["503"]},
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
    "metadata": {"type": "object", "description": "Only with include=metadata: per section, per leaf (nested like "
                                                  "the section) {version, updatedAt}. " + _CONFIRMATION,
                 "properties": {section: {"type": "object"} for section in DEVICE_SECTIONS}},
})
_sections_members = {section: {"type": "object"} for section in DEVICE_SECTIONS}
_STATE_BODY["properties"].update(_sections_members)  # PUT /devices/{id}: absent sections stay as they are
OPENAPI["paths"]["/devices"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"].update(
    _sections_members)  # absent sections are {}
OPENAPI["paths"]["/devices"]["get"]["parameters"].append(_INCLUDE)
OPENAPI["paths"]["/devices"]["post"]["parameters"].append(_INCLUDE)
for _method in ("get", "put", "patch"):
    OPENAPI["paths"]["/devices/{deviceId}"][_method]["parameters"].append(_INCLUDE)
OPENAPI["paths"]["/devices/{deviceId}/versions/{version}"]["get"]["parameters"] = [_INCLUDE]
OPENAPI["paths"]["/devices/{deviceId}/changes"]["get"]["parameters"].append({
    "name": "sections", "in": "query", "schema": {"type": "string", "pattern": "^(state|desired|reported)"
                                                                              "(,(state|desired|reported))*$"},
    "description": "Only changes to these sections (comma-separated); nextSince still moves past the others"})
_schemas["Change"]["properties"]["sections"] = {
    "type": "array", "items": {"type": "string", "enum": ["state", "desired", "reported"]},
    "description": "The sections the write changed"}
_schemas["Change"]["properties"]["patch"]["description"] = (
    "RFC 6902 over the whole document {state, desired, reported} (paths /state/..., /desired/..., /reported/...) "
    "from the previous version ({} for created) to this one; null for deleted")
_operation = _schemas["Transaction"]["properties"]["operations"]["items"]["properties"]
_operation["section"] = {"type": "string", "enum": ["state", "desired", "reported"], "default": "state",
                         "description": "The section a mergePatch or jsonPatch applies to"}
_operation["put"]["properties"].update(_sections_members)
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
