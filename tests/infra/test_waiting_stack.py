"""Waiting apart from writing: the routes that wait (long-polls of the feed and the delta,
lease requests) integrate a function of their own with its own reserved concurrency; every
other method integrates the API function."""

from __future__ import annotations

import re

import pytest
from aws_cdk.assertions import Template

from functions import config
from functions.api.routes import BY_METHOD_AND_RULE
from infra import api as api_module
from infra import monitoring
from functions.auth.device_tokens import ISSUING_VARIABLES
from functions.auth.sealing import VARIABLES as SEALING_VARIABLES
from infra.stack import CONTEXT_DEFAULTS
from tests.infra.conftest import synth_stack
from tests.infra.test_auth_stack import http_routes
from tests.infra.test_stack import REPO_ROOT, alarm_named, api_function
from tests.infra.test_snapstart import alias_of

WAITING = {("GET", "devices/{deviceId}/changes"), ("HEAD", "devices/{deviceId}/changes"),
           ("GET", "devices/{deviceId}/delta"), ("HEAD", "devices/{deviceId}/delta"),
           ("POST", "devices/{deviceId}/leases"), ("GET", "jobs/{jobId}"), ("HEAD", "jobs/{jobId}")}


def test_the_waiting_routes_are_the_feed_and_delta_long_polls_lease_requests_and_job_long_polls():
    assert api_module.WAITING_ROUTES == WAITING
    assert WAITING <= {(method, api_module.resource_path(rule)) for method, rule in BY_METHOD_AND_RULE}


def test_the_dev_server_counts_the_same_routes_as_waiting():
    """localdev/http_front.py caps waiting requests by their waitSeconds; the stack routes them by route."""
    from localdev import http_front

    for method, rule in BY_METHOD_AND_RULE:
        path = re.sub(r"<\w+>", "x1", rule)
        waits = http_front.waits(method, f"{path}?waitSeconds=5", b'{"waitSeconds": 5}')
        assert waits == ((method, api_module.resource_path(rule)) in WAITING), (method, rule)


def test_waiting_methods_integrate_the_waiting_function_and_every_other_the_api_function(template):
    api_logical, _ = api_function(template)
    waiting_logical, _ = api_function(template, "WaitingFunction")
    assert api_logical != waiting_logical
    api_alias, _ = alias_of(template, api_logical)
    waiting_alias, _ = alias_of(template, waiting_logical)
    routes = http_routes(template)
    assert routes["$default"]["IntegrationUri"] == {"Ref": api_alias}  # every request no other route takes
    assert {key for key in routes if key != "$default"} == {f"{method} /{path}" for method, path in WAITING}
    for key, props in routes.items():
        if key != "$default":
            assert props["IntegrationUri"] == {"Ref": waiting_alias}, key


def test_the_waiting_function_is_the_api_function_twin_with_its_own_logs_and_role(template):
    _, api = api_function(template)
    _, waiting = api_function(template, "WaitingFunction")
    same = ("Handler", "Code", "Layers", "Runtime", "Architectures", "Timeout", "MemorySize", "TracingConfig")
    assert {key: waiting["Properties"][key] for key in same} == {key: api["Properties"][key] for key in same}
    # The same environment but the signing and sealing variables (POST /devices/{id}/token and the
    # identity routes never wait, so the waiting function never signs nor seals, and has no KMS
    # right) and NEVER_WAIT, which only the API function has: a waiting request the gateway hands
    # it anyway is answered at once.
    variables = api["Properties"]["Environment"]["Variables"]
    signing = {name: value for name, value in variables.items() if name in ISSUING_VARIABLES + SEALING_VARIABLES}
    assert signing and variables[config.NEVER_WAIT] == "true"
    assert waiting["Properties"]["Environment"]["Variables"] == {
        name: value for name, value in variables.items() if name not in signing and name != config.NEVER_WAIT}
    assert waiting["Properties"]["LoggingConfig"] != api["Properties"]["LoggingConfig"]
    assert waiting["Properties"]["Role"] != api["Properties"]["Role"]

    def statements(function):
        role = function["Properties"]["Role"]["Fn::GetAtt"][0]
        return [statement for policy in template.find_resources("AWS::IAM::Policy").values()
                if {"Ref": role} in policy["Properties"]["Roles"]
                for statement in policy["Properties"]["PolicyDocument"]["Statement"]]

    def dynamodb(function):
        return [s for s in statements(function) if str(s["Action"]).startswith(("dynamodb:", "['dynamodb:"))]

    assert dynamodb(waiting) == dynamodb(api) and len(dynamodb(api)) == 1
    assert not [s for s in statements(waiting) if "kms:" in str(s["Action"])]
    logs = [s for s in statements(waiting) if "logs:PutLogEvents" in s["Action"]]
    assert [s["Resource"]["Fn::GetAtt"][0] for s in logs] == [
        waiting["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]]


def test_the_waiting_function_has_its_own_reserved_concurrency_from_context(template):
    _, api = api_function(template)
    _, waiting = api_function(template, "WaitingFunction")
    assert waiting["Properties"]["ReservedConcurrentExecutions"] == CONTEXT_DEFAULTS["waitingReservedConcurrency"] == 50
    assert api["Properties"]["ReservedConcurrentExecutions"] == CONTEXT_DEFAULTS["reservedConcurrency"]
    _, stack = synth_stack({"waitingReservedConcurrency": "20"})
    _, waiting = api_function(Template.from_stack(stack), "WaitingFunction")
    assert waiting["Properties"]["ReservedConcurrentExecutions"] == 20
    _, stack = synth_stack({"waitingReservedConcurrency": "none"})
    _, waiting = api_function(Template.from_stack(stack), "WaitingFunction")
    assert "ReservedConcurrentExecutions" not in waiting["Properties"]


@pytest.mark.parametrize("name, metric, threshold", [
    ("WaitingThrottles", "Throttles", monitoring.WAITING_THROTTLES_PER_PERIOD),
    ("WaitingErrors", "Errors", monitoring.LAMBDA_ERRORS_PER_PERIOD),
])
def test_the_waiting_function_alarms_watch_it_and_have_runbook_entries(template, name, metric, threshold):
    waiting_logical, _ = api_function(template, "WaitingFunction")
    props = alarm_named(template, name)
    assert props["Namespace"] == "AWS/Lambda" and props["MetricName"] == metric
    assert props["Threshold"] == threshold
    assert props["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": waiting_logical}}]
    assert f"`{name}`" in (REPO_ROOT / "docs" / "operations.md").read_text()


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b"{" * 5000, b"\xff\xfe", b"[]", b"null"])
def test_no_body_makes_the_dev_servers_waiting_check_fail(body):
    """A lease request's body is read for its waitSeconds before the handler runs: whatever it
    holds, the check answers (the handler then says what is wrong with it)."""
    from localdev import http_front

    assert http_front.waits("POST", "/devices/x1/leases", body) is False
