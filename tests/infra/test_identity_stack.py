"""Devices' identity in the stack: the devices.admin scope's routes reach the API function alone;
the symmetric KMS key that seals devices' secrets and enrollments' group keys rotates yearly, is
kept unless the stack is throwaway, and may be used (Encrypt, Decrypt, under the service's
encryption context) by the API function's role alone, in its key policy and in IAM; the
alarms on refused assertions, refused provisionings and sealing failures, each with its runbook
entry; and requireRegisteredCredentials reaching the API and push functions."""

from __future__ import annotations

from fnmatch import fnmatch

import pytest
from aws_cdk.assertions import Template

from functions import config
from functions.api.routes import BY_ASSERTION, ROUTES, openapi_path
from functions.auth.rights import CREDENTIALS, ENROLLMENTS
from functions.auth.sealing import SEALING_KEY_FILE, SEALING_KMS_KEY, SERVICE
from functions.device_state import metrics as names
from infra import api as api_module
from infra import monitoring, push
from infra.bundling import REPO_ROOT
from infra.device_tokens import ADMIN_ACTIONS
from tests.infra.conftest import synth_stack
from tests.infra.test_auth_stack import http_routes
from tests.infra.test_device_tokens_stack import actions, role_of, statements_of_roles
from tests.infra.test_snapstart import alias_of
from tests.infra.test_stack import alarm_named, api_function, under

SEALING = ("kms:Encrypt", "kms:Decrypt")
CONTEXT = {"StringEquals": {"kms:EncryptionContext:service": SERVICE}}
IDENTITY_ROUTES = sorted((method, declaration.rule) for declaration in ROUTES for method in declaration.methods
                         if declaration.right == BY_ASSERTION or declaration.right[1].endswith((CREDENTIALS,
                                                                                                ENROLLMENTS)))


def sealing_key(template: Template) -> tuple[str, dict]:
    return under(template, "AWS::KMS::Key", "Sealing")


def test_the_identity_routes_are_the_api_functions_the_one_that_seals():
    """Credentials, enrollments and provisioning are no waiting route: the $default route takes
    them to the API function, the one function with the sealing key."""
    assert {rule for _, rule in IDENTITY_ROUTES} == {
        "/devices/<device_id>/credentials", "/devices/<device_id>/credentials/<credential_id>", "/enrollments",
        "/enrollments/<enrollment_id>", "/devices/<device_id>/provision"}
    template = Template.from_stack(synth_stack()[1])
    routes = http_routes(template)
    waiting = {openapi_path(rule).lstrip("/") for _, rule in IDENTITY_ROUTES}
    assert not [key for key in routes if key.split(" ")[-1].lstrip("/") in waiting]
    function_logical, function = api_function(template)
    assert SEALING_KMS_KEY in function["Properties"]["Environment"]["Variables"]
    assert routes["$default"]["IntegrationUri"] == {"Ref": alias_of(template, function_logical)[0]}


def test_the_sealing_key_is_symmetric_rotates_and_is_kept(template):
    _, key = sealing_key(template)
    props = key["Properties"]
    assert props.get("KeySpec", "SYMMETRIC_DEFAULT") == "SYMMETRIC_DEFAULT"
    assert props.get("KeyUsage", "ENCRYPT_DECRYPT") == "ENCRYPT_DECRYPT"
    assert props["EnableKeyRotation"] is True
    assert key["DeletionPolicy"] == "Retain" and props["PendingWindowInDays"] == 30
    _, throwaway = sealing_key(Template.from_stack(synth_stack({"throwaway": True})[1]))
    assert throwaway["DeletionPolicy"] == "Delete" and throwaway["Properties"]["PendingWindowInDays"] == 7


def test_the_key_policy_lets_only_the_api_function_seal_under_the_services_context(template):
    _, key = sealing_key(template)
    _, function = api_function(template)
    by_sid = {statement["Sid"]: statement for statement in key["Properties"]["KeyPolicy"]["Statement"]}
    assert set(by_sid) == {"KeyAdministration", "SealAndOpen"}
    assert actions(by_sid["KeyAdministration"]) == list(ADMIN_ACTIONS)
    assert not [action for action in ADMIN_ACTIONS if fnmatch("kms:CreateGrant", action)]  # a grant to oneself
    assert not {"kms:*", "kms:Decrypt", "kms:Encrypt"} & set(actions(by_sid["KeyAdministration"]))
    assert by_sid["SealAndOpen"]["Principal"] == {"AWS": {"Fn::GetAtt": [role_of(function), "Arn"]}}
    assert sorted(actions(by_sid["SealAndOpen"])) == sorted(SEALING)
    assert by_sid["SealAndOpen"]["Condition"] == CONTEXT


def test_encrypt_and_decrypt_are_in_the_api_functions_role_alone_on_this_key_alone(template):
    key_id, _ = sealing_key(template)
    _, function = api_function(template)
    _, waiting = api_function(template, "WaitingFunction")
    users = [(role, statement) for role, statement in statements_of_roles(template)
             if {"kms:Decrypt", "kms:Encrypt"} <= set(actions(statement))
             and statement["Resource"] == {"Fn::GetAtt": [key_id, "Arn"]}]
    assert [role for role, _ in users] == [role_of(function)]
    assert users[0][1]["Condition"] == CONTEXT
    assert role_of(waiting) not in {role for role, statement in statements_of_roles(template)
                                    if set(actions(statement)) & {"kms:Decrypt", "kms:Encrypt", "kms:*"}}


def test_only_the_api_function_knows_the_sealing_key(template):
    key_id, _ = sealing_key(template)
    knowing = [function for function in template.find_resources("AWS::Lambda::Function").values()
               if SEALING_KMS_KEY in function["Properties"].get("Environment", {}).get("Variables", {})]
    assert knowing == [api_function(template)[1]]
    variables = knowing[0]["Properties"]["Environment"]["Variables"]
    assert variables[SEALING_KMS_KEY] == {"Fn::GetAtt": [key_id, "Arn"]} and SEALING_KEY_FILE not in variables


@pytest.mark.parametrize("name, metric, threshold", [
    ("AssertionsRefused", names.ASSERTIONS_REFUSED, monitoring.ASSERTIONS_REFUSED_PER_PERIOD),
    ("ProvisioningsRefused", names.PROVISIONINGS_REFUSED, monitoring.PROVISIONINGS_REFUSED_PER_PERIOD),
    ("SealingFailures", names.SEALING_FAILURES, monitoring.SEALING_FAILURES_PER_PERIOD),
])
def test_identity_alarms_watch_the_service_metrics_and_have_runbook_entries(template, name, metric, threshold):
    props = alarm_named(template, name)
    assert (props["Namespace"], props["MetricName"], props["Statistic"]) == (names.NAMESPACE, metric, "Sum")
    assert props["Threshold"] == threshold and props["Period"] == 300
    assert props["Dimensions"] == [{"Name": key, "Value": value} for key, value in names.DIMENSIONS.items()]
    assert f"| `{name}` |" in (REPO_ROOT / "docs" / "operations.md").read_text(), f"no runbook entry for {name}"


@pytest.mark.parametrize("given, expected", [(None, "false"), (True, "true")])
def test_require_registered_credentials_reaches_the_api_and_push_functions(given, expected):
    template = Template.from_stack(synth_stack({} if given is None else {"requireRegisteredCredentials": given})[1])
    for handler in (api_module.HANDLER, push.HANDLER):
        found = template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": handler}})
        assert found, handler
        for function in found.values():
            assert function["Properties"]["Environment"]["Variables"][
                config.REQUIRE_REGISTERED_CREDENTIALS] == expected, handler
