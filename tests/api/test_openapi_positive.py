"""The OpenAPI document states what the server accepts: schemathesis' positive data (requests
valid by the document) for every operation, sent to the real dev server on DynamoDB Local, is
never refused as malformed (400/422). Outcomes that depend on what is stored rather than on the
request's shape stay allowed: a missing device (404), a conflict (409/412/423), and the few
400/422 problems listed in STORED_STATE below, each for its reason. (schemathesis through plain
hypothesis, as in test_schemathesis.py: its pytest plugin does not run under pytest 9.)"""

from __future__ import annotations

import base64
import json
import re
from urllib.parse import unquote

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from functions.api.openapi import OPENAPI
from functions.device_state.model.values import dumps
from tests.api.test_http import server  # noqa: F401  (the real server, module scoped)
from tests.api.test_schemathesis import history_is_off
from functions.auth.assertions import device_key
from tests.auth import assertion, bearer

pytestmark = pytest.mark.dynamodb_local

EXAMPLES_PER_OPERATION = 10
ENROLLMENT = "positive-examples"
# Refusals that no document can rule out, because they depend on what is stored or on a rule
# between array items that JSON Schema cannot state: problem type suffix -> detail pattern.
STORED_STATE = {
    "patch-not-applicable": r"",  # the patch names members the stored state lacks (RFC 6902 errors)
    "idempotency-key-reused": r"",  # the key was used before, for another request
    "invalid-since": r"since \(\d+\) is past the device's current version",  # since > stored version
    "invalid-transaction": r"appears more than once",  # a device named twice: a rule across items
    # A fleet filter: a grammar JSON Schema cannot state, over the fields the server declares.
    "invalid-filter": r"",
    "unindexed-filter": r"FLEET_INDEX",
    # A cursor belongs to the filter and sort (or the plain listing) that issued it, sort needs a
    # filter, and a PUT's body may repeat the path's deviceId only as it is: rules between
    # parameters that OpenAPI 3.0 cannot state.
    "invalid-cursor": r"cursors belong to one filter and sort",
    # A job's desired patch: rules over the whole tree (no null leaf, no empty object, at most so many
    # leaves and bytes), and endsAt after the server's now.
    "invalid-job": r"^desired( sets| is|:)|^endsAt is (a time after now|not a valid time)",
    "bad-request": r"sort orders the devices a filter finds|deviceId in the body differs from the one in the path"
                   # an expiry in the future: the clock's rule, not the document's
                   r"|expiresAt must be in the future",
    # What a key, a certificate or a regular expression is: a grammar JSON Schema cannot state.
    "invalid-credential": r"",
    "invalid-enrollment": r"idPattern",
}

_SCHEMA = schemathesis.openapi.from_dict(json.loads(dumps(OPENAPI)))
_OPERATIONS = {result.ok().label: result.ok() for result in _SCHEMA.get_all_operations()}


def _problem(server, case, response) -> dict:  # noqa: F811
    """The problem a refusal carries; a HEAD has no body, so the same request as GET tells."""
    if case.method.upper() != "HEAD":
        return response.json()
    again = case.call(base_url=f"http://127.0.0.1:{server.port}", method="GET", timeout=30, headers=bearer())
    assert again.status_code == response.status_code, (response.status_code, again.text)
    return again.json()


def _credentials(case, group_key: bytes) -> dict:
    """Every scope; the device itself where only it may call (its token route); for provisioning,
    the device's assertion signed with the key ``ENROLLMENT`` derives for it."""
    device_id = unquote(case.path_parameters.get("deviceId", ""))  # as the server reads the path
    if case.path.endswith("/token"):
        return bearer(device=device_id)
    if case.path.endswith("/provision"):
        return {"Authorization": f"Bearer {assertion(device_id, ENROLLMENT, device_key(group_key, device_id))}"}
    return bearer()


@pytest.fixture(scope="module")
def group_key(server):  # noqa: F811
    """The group key of an enrollment that admits every device id, as many as the examples need."""
    status, _, body = server.request("POST", "/enrollments", {
        "enrollmentId": ENROLLMENT, "idPattern": "[A-Za-z0-9._:-]+", "maxDevices": 1_000_000}, headers=bearer())
    assert status == 201, body
    return base64.b64decode(json.loads(body)["groupKey"])


def _admitted_as_read(case) -> bool:
    """Whether each path parameter, read as the server reads it, still matches its pattern.
    schemathesis sends a '%' in a generated path parameter as it is, not as %25, so a value such
    as the text "%EF%BF%BD" (Hypothesis draws strings it finds in loaded modules) reaches the
    server as U+FFFD, which the document rules out: data the document does not admit."""
    for parameter in case.operation.path_parameters:
        pattern, value = parameter.definition["schema"].get("pattern"), case.path_parameters.get(parameter.name)
        if pattern and value is not None and not re.search(pattern, unquote(value)):
            return False
    return True


def _explained(problem: dict) -> bool:
    kind = problem.get("type", "").rsplit(":", 1)[-1]
    return kind in STORED_STATE and re.search(STORED_STATE[kind], problem.get("detail", "")) is not None


@pytest.mark.parametrize("label", sorted(_OPERATIONS))
def test_data_valid_by_the_document_is_not_refused_as_malformed(server, group_key, label):  # noqa: F811
    refused = []

    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=_OPERATIONS[label].as_strategy())
    def send(case):
        if not _admitted_as_read(case):
            return
        response = case.call(base_url=f"http://127.0.0.1:{server.port}", timeout=30,
                             headers=_credentials(case, group_key))
        assert response.status_code not in (401, 403), response.text  # the data reached the route
        if history_is_off(response):
            return
        assert response.status_code < 500, (response.status_code, response.text)
        if response.status_code in (400, 422):
            problem = _problem(server, case, response)
            if not _explained(problem):
                refused.append((case.path_parameters, case.query, case.headers, case.body, problem))

    send()
    assert not refused, f"{label}: the document admits what the server refuses:\n" + "\n".join(map(repr, refused))


def test_a_path_parameter_the_server_reads_outside_its_pattern_is_not_data_the_document_admits():
    operation = _OPERATIONS["PUT /devices/{deviceId}/leases/{leaseId}"]
    sent = {"deviceId": "lamp-1", "leaseId": "%EF%BF%BD"}  # U+FFFD, percent-encoded
    assert not _admitted_as_read(operation.Case(path_parameters=sent))
    assert _admitted_as_read(operation.Case(path_parameters={**sent, "leaseId": "%25EF"}))  # the text "%EF"


def test_the_refusal_check_can_fail():
    assert not _explained({"type": "urn:device-state:problem:invalid-value", "detail": "number out of range"})
    assert not _explained({"type": "urn:device-state:problem:bad-request", "detail": "deviceId differs"})
    assert _explained({"type": "urn:device-state:problem:invalid-since",
                       "detail": "since (9) is past the device's current version (1)"})


def test_no_query_pattern_admits_what_stands_in_for_bytes_that_are_not_utf8():
    """The server refuses U+FFFD and lone surrogates anywhere in a query (400 bad-request), so no
    query parameter's pattern in the document may admit them (Hypothesis drew a sort field
    holding U+FFFD from the pattern "(state|...)/.+")."""
    checked = 0
    for path, methods in OPENAPI["paths"].items():
        for method, operation in methods.items():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else ():
                pattern = parameter.get("schema", {}).get("pattern")
                if parameter.get("in") == "query" and pattern:
                    checked += 1
                    for stand_in in ("\ufffd", "\udcff"):
                        for value in ("+state/a" + stand_in, "state/" + stand_in, stand_in):
                            assert not re.search(pattern, value), (method, path, parameter["name"], value)
    assert checked >= 3  # sort, groupBy and filter at least
