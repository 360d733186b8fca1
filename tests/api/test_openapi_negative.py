"""The OpenAPI document states what the server refuses: schemathesis' negative data (requests
the document forbids: a parameter, header or body out of its schema) for every operation, sent
to the real dev server on DynamoDB Local, is refused as malformed (400, 413 or 415, a problem
document), never accepted and never a 5xx. The other direction is test_openapi_positive.py; both
hold the routes' declarations (functions/api/routes.py), from which the server takes its checks
and the document its schemas, to what the service does. (schemathesis through plain hypothesis,
as in test_schemathesis.py.)

Most cases name a device that exists (with state, desired and reported), so that a request
wrongly let through would be answered 2xx, not masked by a 404; the others let the device id
itself be what is wrong."""

from __future__ import annotations

import copy
import json
from urllib.parse import unquote

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode, checks
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup

from functions.api.openapi import OPENAPI
from functions.device_state import DEVICE_ID_PATTERN
from functions.device_state.model.values import dumps
from tests.api.test_http import server  # noqa: F401  (the real server, module scoped)
from tests.auth import assertion, bearer

pytestmark = pytest.mark.dynamodb_local

EXAMPLES_PER_OPERATION = 12
DEVICE = "negative-lamp"
REFUSED_AS_MALFORMED = (400, 413, 415)


def loosened(document: dict) -> dict:
    """The document less what JSON Schema cannot state exactly, where it states a subset of what
    the service takes (so its positive data is always taken): a number in a state is bounded by
    its significant digits and DynamoDB's magnitudes, not by a range; a JSON Patch increment's
    min and max by each other, not by zero; an ack's path by bytes, not by characters. And less
    its security: the test sends its own credentials."""
    document = copy.deepcopy(document)
    schemas = document["components"]["schemas"]
    number = {"type": "number"}
    schemas["Value"]["anyOf"] = [branch for branch in schemas["Value"]["anyOf"]
                                 if branch.get("type") not in ("integer", "number")] + [number]
    for operation in schemas["JsonPatch"]["items"]["anyOf"]:
        for member in ("value", "min", "max"):
            if operation["properties"]["op"]["enum"] == ["increment"] and member in operation["properties"]:
                operation["properties"][member] = number
    for item in document["paths"].values():
        for method, operation in item.items():
            if method == "parameters":
                continue
            operation.pop("security", None)
            content = operation.get("requestBody", {}).get("content", {})
            acks = content.get("application/json", {}).get("schema", {}).get("properties", {}).get("acks")
            if acks:
                acks["items"]["properties"]["path"].pop("maxLength")
    document["components"].pop("securitySchemes")
    return document


_CONFIG = SchemathesisConfig.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": list(REFUSED_AS_MALFORMED)}}})
_SCHEMA = schemathesis.openapi.from_dict(loosened(json.loads(dumps(OPENAPI))), config=_CONFIG)
# Every operation that takes anything that can be wrong (GET /openapi.json takes nothing).
_OPERATIONS = {result.ok().label: result.ok() for result in _SCHEMA.get_all_operations()
               if result.ok().path_parameters or result.ok().query or result.ok().headers or result.ok().body}


# A valid value of every query parameter and header a route with a body takes, so that a case can
# have its body alone wrong (schemathesis breaks a random set of locations, and the first one the
# server checks would hide how it takes the others). Were the body let through, each would make the
# answer tell: a 2xx, or a 409/412/422 (a lease token no lease backs, a key used before).
_VALID_QUERY = {"include": "metadata", "expiresIn": "60", "clearOnConfirm": "false"}
_VALID_HEADERS = {"If-Match": "*", "If-None-Match": '"999999"', "Idempotency-Key": "negative-body",
                  "Lease-Token": "0" * 32}


def _strategy(operation):
    """Negative cases of the operation: on the existing device, with anything but its id wrong, and
    with its body alone wrong; and with the device id itself free to be wrong."""
    strategies = [operation.as_strategy(generation_mode=GenerationMode.NEGATIVE)]
    on_device = {"deviceId": DEVICE} if "deviceId" in {parameter.name for parameter in operation.path_parameters} \
        else None
    if on_device and (operation.query or operation.headers or operation.body):
        strategies.append(operation.as_strategy(generation_mode=GenerationMode.NEGATIVE, path_parameters=on_device))
    if operation.body:
        strategies += [operation.as_strategy(
            generation_mode=GenerationMode.NEGATIVE, path_parameters=on_device,
            query={parameter.name: _VALID_QUERY[parameter.name] for parameter in operation.query},
            headers={parameter.name: _VALID_HEADERS[parameter.name] for parameter in operation.headers})] * 2
    return st.one_of(strategies)


def _credentials(case) -> dict:
    """Every scope; the device itself where only it may call (its token route: a device whose id is
    no device id has no token, so another device's stands in, refused after the path)."""
    if case.path.endswith("/token"):
        device_id = unquote(case.path_parameters["deviceId"])
        return bearer(device=device_id if DEVICE_ID_PATTERN.fullmatch(device_id) else DEVICE)
    if case.path.endswith("/provision"):  # an assertion: the request's shape is checked before its signature
        return {"Authorization": f"Bearer {assertion(DEVICE, 'no-such-enrollment', bytes(32))}"}
    return bearer()


@pytest.fixture(scope="module")
def device(server):  # noqa: F811
    status, _, body = server.request("POST", "/devices", {"deviceId": DEVICE, "state": {"n": 1}, "desired": {"n": 2},
                                                          "reported": {"n": 1}}, headers=bearer())
    assert status == 201, body


@pytest.mark.parametrize("label", sorted(_OPERATIONS))
def test_data_the_document_forbids_is_refused_as_malformed(server, device, label):  # noqa: F811
    wrong = []

    # Every case is sent and every wrong answer listed (no shrinking: it would send hundreds more).
    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=_strategy(_OPERATIONS[label]))
    def send(case):
        response = case.call(base_url=f"http://127.0.0.1:{server.port}", timeout=30, headers=_credentials(case))
        where = (response.status_code, case.path_parameters, case.query, case.headers, case.body, response.text[:300])
        if response.status_code >= 500 or (response.status_code >= 400 and
                                           response.headers.get("content-type") != ["application/problem+json"]):
            wrong.append(where)
            return
        try:
            case.validate_response(response, checks=[checks.negative_data_rejection])
        except FailureGroup as failure:  # the case broke the document, and was taken
            wrong.append((*where, str(failure).strip().splitlines()[-1]))

    send()
    assert not wrong, f"{label}: what the document forbids is not refused as malformed:\n" + "\n".join(map(repr, wrong))


def test_the_loosened_document_still_forbids_what_it_can_state():
    """The loosening drops number ranges and one length, nothing else: a state stays an object of
    values, a transaction's operations keep their shapes."""
    document = loosened(json.loads(dumps(OPENAPI)))
    schemas = document["components"]["schemas"]
    assert {"type": "number"} in schemas["Value"]["anyOf"] and {"type": "string"} in schemas["Value"]["anyOf"]
    assert schemas["State"]["type"] == "object"
    assert schemas["Transaction"] == json.loads(dumps(OPENAPI))["components"]["schemas"]["Transaction"]
    assert not any("security" in operation for item in document["paths"].values()
                   for method, operation in item.items() if method != "parameters")


# What the negative run found, pinned: each failed before the routes were declared.

def test_a_lease_request_naming_no_owner_with_null_is_refused_and_takes_no_lease(server):  # noqa: F811
    """owner is a string (1-128 characters) or absent; null was taken as absent."""
    assert server.request("POST", "/devices", {"deviceId": "owner-lamp", "state": {}}, headers=bearer())[0] == 201
    status, _, body = server.request("POST", "/devices/owner-lamp/leases", {"owner": None}, headers=bearer())
    assert status == 400 and "owner" in json.loads(body)["detail"], body
    status, _, body = server.request("GET", "/devices/owner-lamp/leases", headers=bearer())
    assert status == 200 and json.loads(body)["holder"] is None


def test_a_heartbeat_body_the_document_forbids_is_refused_before_its_lease_is_looked_up(server, device):  # noqa: F811
    status, _, body = server.request("PUT", f"/devices/{DEVICE}/leases/0", {"ttlSeconds": {}}, headers=bearer())
    assert status == 400 and "ttlSeconds" in json.loads(body)["detail"], body


def test_json_patch_as_rfc_6902_has_it_is_what_the_document_allows():
    """The whole section at the path "" (add, replace, test) and members an operation does not
    define (ignored): the service took both, and the document forbade them."""
    from openapi_schema_validator import OAS30Validator

    document = json.loads(dumps(OPENAPI))
    patch = OAS30Validator({"$ref": "#/components/schemas/JsonPatch", "components": document["components"]})
    for operation in ({"op": "replace", "path": "", "value": {"n": 1}}, {"op": "test", "path": "", "value": {}},
                      {"op": "add", "path": "/n", "value": 1, "comment": "ignored"}):
        assert patch.is_valid([operation]), operation
    assert not patch.is_valid([{"op": "add", "path": "n", "value": 1}])  # a pointer starts with /
