"""Callers in the CDK stack: every route of ROUTE_RIGHTS is a method."""

from __future__ import annotations

from aws_cdk.assertions import Template

from functions.auth.rights import ROUTE_RIGHTS
from infra import api as api_module


def methods_by_route(template: Template) -> dict[tuple[str, str], dict]:
    """{(HTTP method, "/devices/{deviceId}"): method properties} of every API Gateway method."""
    resources = template.find_resources("AWS::ApiGateway::Resource")

    def path(resource_id) -> str:
        if "Ref" not in resource_id:  # the API's root resource
            return ""
        props = resources[resource_id["Ref"]]["Properties"]
        return f"{path(props['ParentId'])}/{props['PathPart']}"

    return {(props["HttpMethod"], path(props["ResourceId"])): props for props in
            (method["Properties"] for method in template.find_resources("AWS::ApiGateway::Method").values())}


def gateway_path(rule: str) -> str:
    return "/" + api_module.resource_path(rule)


# ------------------------------------------------------------ routes and authorizer


def test_the_rules_become_api_gateway_paths():
    assert gateway_path("/devices/<device_id>/leases/<lease_id>") == "/devices/{deviceId}/leases/{leaseId}"
    assert gateway_path("/devices/<device_id>/versions/<version>") == "/devices/{deviceId}/versions/{version}"


def test_every_route_the_handler_knows_is_a_method_and_every_path_has_any(template):
    methods = methods_by_route(template)
    for method, rule in ROUTE_RIGHTS:
        assert (method, gateway_path(rule)) in methods, f"{method} {rule} has no API Gateway method"
    for rule in {"/devices/<device_id>/desired", "/devices/<device_id>/reported", "/devices/<device_id>/delta"}:
        assert ("ANY", gateway_path(rule)) in methods
    assert {path for _, path in methods} == {gateway_path(rule) for _, rule in ROUTE_RIGHTS}
    assert {(method, path) for method, path in methods if method != "ANY"} == {
        (method, gateway_path(rule)) for method, rule in ROUTE_RIGHTS}


def test_api_gateway_may_invoke_the_function_by_one_api_wide_permission(template):
    """Not two per method: Lambda caps a function's resource policy at 20 KB."""
    permissions = template.find_resources("AWS::Lambda::Permission",
                                          {"Properties": {"Principal": "apigateway.amazonaws.com"}})
    source_arns = [permission["Properties"]["SourceArn"]["Fn::Join"][1][-2:] for permission in permissions.values()]
    assert [arn for arn in source_arns if arn[-1] == "/*/*/*"] and all(
        arn[-1] == "/*/*/*" or arn[0] == "/authorizers/" for arn in source_arns), source_arns
