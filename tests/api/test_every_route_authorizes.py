"""Every registered route authenticates and authorizes before it reads or writes anything:
called against a table that does not exist (so any read or write would fail with a 5xx or
404), a caller without the right gets its 401 or 403, while the control with the right
reaches the storage."""

from __future__ import annotations

import json
import re
import time

import jwt
import pytest

from functions.api import handler as handler_module
from functions.api.common import REGISTERED
from functions.config import api_config as load_config
from functions.auth.credentials import load_auth_config
from functions.api.routes import BY_ASSERTION, BY_METHOD_AND_RULE, PER_OPERATION, PUBLIC
from functions.device_state import CREDENTIAL_ID_PATTERN
from functions.device_state.client import dynamodb_client
from localdev.apigw import LambdaContext, make_event
from tests.auth import NO_CREDENTIALS, bearer, with_credentials

BODIES = {  # a well-formed body for each route that takes one
    ("POST", "/devices"): {"deviceId": "lamp-1", "state": {}},
    ("PUT", "/devices/<device_id>"): {"state": {}},
    ("PATCH", "/devices/<device_id>"): {"a": 1},
    ("PATCH", "/devices/<device_id>/desired"): {"a": 1},
    ("PATCH", "/devices/<device_id>/reported"): {"a": 1},
    ("PUT", "/devices/<device_id>/desired"): {"desired": {}},
    ("PUT", "/devices/<device_id>/reported"): {"reported": {}},
    ("POST", "/transactions"): {"operations": [{"deviceId": "lamp-1", "mergePatch": {"a": 1}}]},
    ("POST", "/jobs"): {"deviceIds": ["lamp-1"], "desired": {"a": 1}},
    ("POST", "/devices/<device_id>/credentials"): {"type": "secret"},
    ("POST", "/enrollments"): {"idPattern": "lamp-[0-9]+", "maxDevices": 1},
}
PROTECTED = [route for route, declaration in REGISTERED.items() if declaration.right not in (PUBLIC, BY_ASSERTION)]
BY_ASSERTIONS = [route for route, declaration in REGISTERED.items() if declaration.right == BY_ASSERTION]
# The caller with the right, where a back-end with every scope has none: a device token is the
# device's own.
CONTROLS = {("POST", "/devices/<device_id>/token"): bearer(device="lamp-1")}


@pytest.fixture
def missing_table(moto_table, monkeypatch):
    monkeypatch.setenv("TABLE_NAME", "no-such-table")
    monkeypatch.setenv("FLEET_INDEX", "state/site:string")  # so the control's count goes on to the table
    monkeypatch.delenv("DYNAMODB_ENDPOINT", raising=False)
    for cache in (handler_module._manager, load_config, load_auth_config, dynamodb_client):
        cache.cache_clear()
    yield
    for cache in (handler_module._manager, load_config, load_auth_config, dynamodb_client):
        cache.cache_clear()


CREDENTIAL_ID_LENGTH = int(re.search(r"\{(\d+)\}", CREDENTIAL_ID_PATTERN.pattern).group(1))
QUERIES = {(method, "/devices/count"): "?filter=exists(state/site)" for method in ("GET", "HEAD")}


def _call(method: str, rule: str, headers: dict) -> dict:
    path = re.sub(r"<device_id>", "lamp-1", rule).replace("<lease_id>", "1.0123456789abcdef").replace(
        "<version>", "1").replace("<credential_id>", "a" * CREDENTIAL_ID_LENGTH).replace(
        "<enrollment_id>", "line-7").replace("<job_id>", "job-1") + QUERIES.get((method, rule), "")
    body = BODIES.get((method, rule))
    content_type = {"PATCH": "application/merge-patch+json"}.get(method, "application/json")
    headers = {**headers, **({"Content-Type": content_type} if body is not None else {})}
    event = make_event(method, path, with_credentials(headers), None if body is None else json.dumps(body))
    return handler_module.lambda_handler(event, LambdaContext())


def test_every_declared_route_is_registered_and_no_other():
    assert set(REGISTERED) == set(BY_METHOD_AND_RULE)


@pytest.mark.parametrize("method, rule", PROTECTED, ids=lambda value: value)
def test_a_caller_without_the_right_is_refused_before_anything_is_read(missing_table, method, rule):
    for headers, status in ((bearer([]), 403), (bearer(device="lamp-2"), 403), (NO_CREDENTIALS, 401)):
        response = _call(method, rule, headers)
        assert response["statusCode"] == status, response
        problem = json.loads(response["body"])
        if status == 403:
            assert problem["resource"].startswith(("device:lamp-1", "devices", "enrollments", "jobs")), problem
            assert problem["action"] in problem["detail"] and problem["resource"] in problem["detail"]
            if REGISTERED[(method, rule)].right == PER_OPERATION:
                assert problem["index"] == 0
    control = _call(method, rule, CONTROLS.get((method, rule), bearer()))  # it goes on to the missing table
    assert control["statusCode"] >= 404 and control["statusCode"] not in (401, 403), control


@pytest.mark.parametrize("method, rule", BY_ASSERTIONS, ids=lambda value: value)
def test_a_route_of_assertions_refuses_every_token_and_reads_nothing_without_one(missing_table, method, rule):
    """Provisioning takes a device's assertion and nothing else: a back-end's token with every
    scope, a device token and no credentials are 401 before anything is read; an assertion (here
    of an enrollment the missing table cannot hold) goes on to the storage."""
    for headers in (bearer(), bearer(device="lamp-1"), NO_CREDENTIALS):
        response = _call(method, rule, headers)
        assert response["statusCode"] == 401, response
    now = int(time.time())
    assertion = jwt.encode({"sub": "lamp-1", "aud": "device-state", "iat": now, "exp": now + 60, "jti": "j-1"},
                           b"k" * 32, algorithm="HS256", headers={"kid": "line-7"})
    control = _call(method, rule, {"Authorization": f"Bearer {assertion}"})
    assert control["statusCode"] >= 404 and control["statusCode"] not in (401, 403), control


SETS_REPORTED = [  # a write whose body sets reported beside what its route's own right covers
    ("POST", "/devices", {"deviceId": "lamp-1", "state": {}, "reported": {"p": 1}}),
    ("PUT", "/devices/lamp-1", {"state": {}, "reported": {"p": 1}}),
    ("POST", "/transactions", {"operations": [{"deviceId": "lamp-1", "put": {"state": {}, "reported": {"p": 1}}}]}),
    ("POST", "/transactions", {"operations": [{"deviceId": "lamp-1", "put": {"state": {}, "reported": {"p": 1}},
                                               "ifNoneMatch": "*"}]}),
]


@pytest.mark.parametrize("method, path, body", SETS_REPORTED, ids=lambda value: json.dumps(value)[:60])
def test_the_sections_a_body_sets_are_authorized_before_anything_is_read(missing_table, method, path, body):
    """The route's right (create, replace) passes the authorizer; the handler refuses the
    reported section the body sets before any request to the (missing) table."""
    def call(scopes):
        event = make_event(method, path, with_credentials({**bearer(scopes), "Content-Type": "application/json"}),
                           json.dumps(body))
        return handler_module.lambda_handler(event, LambdaContext())

    refused = call(["devices.write"])
    assert refused["statusCode"] == 403, refused
    assert json.loads(refused["body"])["resource"] == "device:lamp-1/reported"
    control = call(["devices.write", "devices.report"])  # with both rights it goes on to the missing table
    assert control["statusCode"] >= 404 and control["statusCode"] not in (401, 403), control
