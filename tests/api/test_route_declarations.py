"""A route is one declaration (functions/api/routes.py) and ``common.route`` holds every request to
it before the route's code runs: the caller's rights on what the body writes included, so a route
cannot forget them. Shown with routes declared here, whose code only records that it ran."""

from __future__ import annotations

import json

import pytest

import functions.api.handler  # noqa: F401  (every route of the service registered, as deployed)
from functions.api import common, routes
from functions.api.resolver import APIGatewayRestResolver, Router
from functions.api.routes import JSON, TRANSACTION, Body, EachOperation, Route, Writes
from functions.auth.rights import Forbidden, WriteKind
from localdev.apigw import LambdaContext, make_event
from tests.auth import bearer

PUT_BODY = {"type": "object", "required": ["state"], "additionalProperties": False,
            "properties": {"state": {"type": "object"}, "reported": {"type": "object"}}}


@pytest.fixture
def app(monkeypatch):
    """A resolver with two routes declared for the test, whose code records each call."""
    monkeypatch.setattr(common, "REGISTERED", {})
    for declaration in (
        Route(("PUT",), "/test-only/<device_id>", "testOnlyPut", Writes(WriteKind.PUT), {},
              body=Body({JSON: PUT_BODY})),
        Route(("POST",), "/test-only", "testOnlyTransaction", EachOperation(), {}, body=Body({JSON: TRANSACTION})),
    ):
        monkeypatch.setitem(routes.BY_OPERATION, declaration.operation, declaration)
    resolver, router, calls = APIGatewayRestResolver(), Router(), []

    @common.route(router, "testOnlyPut")
    def put(request):
        calls.append(request)
        return common.json_response({})

    @common.route(router, "testOnlyTransaction")
    def transaction(request):
        calls.append(request)
        return common.json_response({})

    resolver.include_router(router)
    resolver.calls = calls
    return resolver


def _call(app, method, path, body, scopes):
    event = make_event(method, path, {**bearer(scopes), "Content-Type": "application/json"}, json.dumps(body))
    return app.resolve(event, LambdaContext())


def test_a_body_that_sets_a_section_the_caller_may_not_write_never_reaches_the_routes_code(app):
    body = {"state": {}, "reported": {"p": 1}}
    with pytest.raises(Forbidden) as refused:
        _call(app, "PUT", "/test-only/lamp-1", body, ["devices.write"])
    assert (refused.value.action, refused.value.resource) == ("write", "device:lamp-1/reported")
    assert app.calls == []
    assert _call(app, "PUT", "/test-only/lamp-1", body, ["devices.write", "devices.report"])["statusCode"] == 200
    assert app.calls[0].body == body and app.calls[0].path == {"device_id": "lamp-1"}


def test_each_operation_of_a_transaction_is_authorized_before_the_routes_code_runs(app):
    body = {"operations": [{"deviceId": "lamp-1", "mergePatch": {"a": 1}},
                           {"deviceId": "lamp-2", "mergePatch": {"p": 1}, "section": "reported"}]}
    with pytest.raises(Forbidden) as refused:
        _call(app, "POST", "/test-only", body, ["devices.write"])
    assert (refused.value.index, refused.value.resource) == (1, "device:lamp-2/reported")
    assert app.calls == []
    assert _call(app, "POST", "/test-only", body, ["devices.write", "devices.report"])["statusCode"] == 200
    assert [entry.operation.device_id for entry in app.calls[0].body["operations"]] == ["lamp-1", "lamp-2"]


def test_a_route_is_registered_once():
    with pytest.raises(LookupError, match="registered twice"):
        common.route(Router(), "getDevice")(lambda request: None)


def test_the_routes_that_wait_are_those_whose_declaration_says_so():
    waiting = {(method, declaration.rule) for declaration in routes.ROUTES if declaration.waits
               for method in declaration.methods}
    assert waiting == {("GET", "/devices/<device_id>/changes"), ("HEAD", "/devices/<device_id>/changes"),
                       ("GET", "/devices/<device_id>/delta"), ("HEAD", "/devices/<device_id>/delta"),
                       ("POST", "/devices/<device_id>/leases"), ("GET", "/jobs/<job_id>"), ("HEAD", "/jobs/<job_id>")}
    assert routes.WAITING_ROUTES == {(method, routes.openapi_path(rule).lstrip("/")) for method, rule in waiting}


@pytest.mark.parametrize("engine", ["moto"], indirect=True)
def test_a_required_query_parameter_missing_is_400_with_its_example_and_the_document_shows_it(api):
    refused = api("GET", "/devices/count")
    assert refused.status == 400 and "the query needs filter, e.g. filter=eq(reported/online,true)" in \
        refused.json["detail"], refused.text
    from functions.api.openapi import OPENAPI

    count = OPENAPI["paths"]["/devices/count"]["get"]["parameters"]
    assert next(parameter for parameter in count if parameter["name"] == "filter")["example"] == \
        "eq(reported/online,true)"
