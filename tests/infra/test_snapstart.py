"""Lambda SnapStart: every function of ours (API, waiting, authorizer, stream processor, push
and fan-out) snapshots its published versions, API Gateway (REST and WebSocket) and the
stream's event source mappings invoke the alias on such a version, and the `snapStart`
context flag turns it all off (the functions are then invoked unqualified)."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Template

from functions.changes import handler as changes_handler
from infra import api as api_module
from infra import push as push_module
from tests.infra.conftest import synth_stack
from tests.infra.test_auth_stack import http_routes

HANDLERS = (api_module.HANDLER, "functions.changes.handler.lambda_handler", api_module.AUTHORIZER_HANDLER,
            push_module.HANDLER, push_module.FANOUT_HANDLER)
STREAM_HANDLERS = (HANDLERS[1], push_module.FANOUT_HANDLER)  # the stream's two consumers


def functions_of(template: Template, handler: str) -> dict[str, dict]:
    """{logical id: resource} of the functions running ``handler`` (two run the API's)."""
    found = template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": handler}})
    assert found, handler
    return found


def function_of(template: Template, handler: str) -> tuple[str, dict]:
    found = functions_of(template, handler)
    assert len(found) == 1, handler
    return next(iter(found.items()))


def alias_of(template: Template, function_logical: str) -> tuple[str, dict]:
    aliases = {logical: resource["Properties"] for logical, resource in
               template.find_resources("AWS::Lambda::Alias").items()
               if resource["Properties"]["FunctionName"] == {"Ref": function_logical}}
    assert len(aliases) == 1, function_logical
    return next(iter(aliases.items()))


@pytest.mark.parametrize("handler", HANDLERS)
def test_snapstart_is_on_for_published_versions_behind_the_live_alias(template, handler):
    for logical, function in functions_of(template, handler).items():
        assert function["Properties"]["SnapStart"] == {"ApplyOn": "PublishedVersions"}
        assert function["Properties"]["Runtime"] in ("python3.12", "python3.13")  # SnapStart needs 3.12+
        _, alias = alias_of(template, logical)
        assert alias["Name"] == api_module.ALIAS_NAME
        version_logical = alias["FunctionVersion"]["Fn::GetAtt"][0]
        version = template.to_json()["Resources"][version_logical]
        assert version["Type"] == "AWS::Lambda::Version"
        assert version["Properties"]["FunctionName"] == {"Ref": logical}


def test_api_gateway_invokes_the_aliases(template):
    api_aliases = {alias_of(template, logical)[0] for logical in functions_of(template, api_module.HANDLER)}
    http_uris = {json.dumps(props["IntegrationUri"]) for props in http_routes(template).values()}
    assert len(api_aliases) == 2 and http_uris == {json.dumps({"Ref": alias}) for alias in api_aliases}
    authorizer_alias, _ = alias_of(template, function_of(template, api_module.AUTHORIZER_HANDLER)[0])
    push_alias, _ = alias_of(template, function_of(template, push_module.HANDLER)[0])
    websocket_uris = {json.dumps(integration["Properties"]["IntegrationUri"]) for integration in
                      template.find_resources("AWS::ApiGatewayV2::Integration").values()} - http_uris
    assert websocket_uris and all(push_alias in uri for uri in websocket_uris)
    [websocket_authorizer] = template.find_resources("AWS::ApiGatewayV2::Authorizer").values()
    assert authorizer_alias in json.dumps(websocket_authorizer["Properties"]["AuthorizerUri"])
    permissions = template.find_resources("AWS::Lambda::Permission",
                                          {"Properties": {"Principal": "apigateway.amazonaws.com"}})
    assert {json.dumps(permission["Properties"]["FunctionName"]) for permission in permissions.values()} == {
        json.dumps({"Ref": alias}) for alias in (*api_aliases, authorizer_alias, push_alias)}


@pytest.mark.parametrize("handler", STREAM_HANDLERS)
def test_each_stream_mapping_invokes_its_consumers_alias(template, handler):
    alias_logical, _ = alias_of(template, function_of(template, handler)[0])
    names = [json.dumps(mapping["Properties"]["FunctionName"])  # "<function>:live", from the alias ARN
             for mapping in template.find_resources("AWS::Lambda::EventSourceMapping").values()]
    [name] = [name for name in names if alias_logical in name]
    assert f":{api_module.ALIAS_NAME}" in name


def test_the_snapstart_flag_off_leaves_unqualified_functions_without_snapshots():
    _, stack = synth_stack({"snapStart": "false"})
    template = Template.from_stack(stack)
    for handler in HANDLERS:
        for function in functions_of(template, handler).values():
            assert "SnapStart" not in function["Properties"]
    assert not template.find_resources("AWS::Lambda::Alias")
    mappings = template.find_resources("AWS::Lambda::EventSourceMapping").values()
    assert sorted(json.dumps(mapping["Properties"]["FunctionName"]) for mapping in mappings) == sorted(
        json.dumps({"Ref": function_of(template, handler)[0]}) for handler in STREAM_HANDLERS)
    uris = [json.dumps(m["Properties"]["Integration"]["Uri"])
            for m in template.find_resources("AWS::ApiGateway::Method").values()]
    api_functions = functions_of(template, api_module.HANDLER)
    assert all(any(logical in uri for logical in api_functions) for uri in uris)


def test_the_changes_handler_is_the_one_the_stack_names():
    assert HANDLERS[1] == f"{changes_handler.__name__}.lambda_handler"
