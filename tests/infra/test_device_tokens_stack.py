"""The device-token issuer in the stack: an asymmetric KMS key (ECC_NIST_P256, SIGN_VERIFY)
whose key policy lets only the API function sign and only the public-key custom resource read
the public key (the account administers it, never signs); kms:Sign in the API function's role
alone; the public key resolved at deploy time into DEVICE_TOKEN_JWKS for every function that
authenticates callers; the route reaching the signing function; the lifetime from
context, checked at synth."""

from __future__ import annotations

from fnmatch import fnmatch

import json
import time

import pytest
from aws_cdk.assertions import Template
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from functions.auth import kms_jwks_resource
from functions.auth.credentials import (AUTH_ISSUER, DEVICE_TOKEN_AUDIENCE, DEVICE_TOKEN_ISSUER, DEVICE_TOKEN_JWKS,
                                        AuthConfig, AuthConfigError, verify_token)
from functions.auth.device_tokens import (DEVICE_TOKEN_KMS_KEY, DEVICE_TOKEN_MAX_SECONDS, DEVICE_TOKEN_SECONDS,
                                          TokenSettings, issue)
from functions.auth.principals import Principal
from functions.auth.signers import KmsSigner
from infra import api as api_module
from infra import push
from infra.device_tokens import ADMIN_ACTIONS
from tests.auth import ISSUER
from tests.infra.conftest import synth_stack
from tests.infra.test_auth_stack import http_routes
from tests.infra.test_snapstart import alias_of
from tests.infra.test_stack import api_function, only, under
from tests.unit.test_device_tokens import KEY_ARN, FakeKms

SIGNING = ("kms:Sign", "kms:*", "kms:Sign*")


def key_of(template: Template) -> tuple[str, dict]:
    return under(template, "AWS::KMS::Key", "DeviceTokens")


def role_of(function: dict) -> str:
    return function["Properties"]["Role"]["Fn::GetAtt"][0]


def statements_of_roles(template: Template) -> list[tuple[str, dict]]:
    return [(role["Ref"], statement) for policy in template.find_resources("AWS::IAM::Policy").values()
            for role in policy["Properties"]["Roles"] for statement in policy["Properties"]["PolicyDocument"]["Statement"]]


def actions(statement: dict) -> list[str]:
    return statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]


def test_the_key_is_an_asymmetric_signing_key_kms_cannot_rotate(template):
    _, key = key_of(template)
    props = key["Properties"]
    assert (props["KeySpec"], props["KeyUsage"], props["EnableKeyRotation"]) == ("ECC_NIST_P256", "SIGN_VERIFY",
                                                                                  False)
    assert key["DeletionPolicy"] == "Retain" and props["PendingWindowInDays"] == 30
    _, throwaway = key_of(Template.from_stack(synth_stack({"throwaway": True})[1]))
    assert throwaway["DeletionPolicy"] == "Delete" and throwaway["Properties"]["PendingWindowInDays"] == 7


def test_the_key_policy_lets_only_the_api_function_sign_and_the_account_only_administer(template):
    _, key = key_of(template)
    _, function = api_function(template)
    public_key_function = only(template, "AWS::Lambda::Function", {
        "Code": {"ZipFile": open(kms_jwks_resource.__file__).read()}})[1]
    by_sid = {statement["Sid"]: statement for statement in key["Properties"]["KeyPolicy"]["Statement"]}
    assert set(by_sid) == {"KeyAdministration", "Sign", "ReadPublicKey"}
    assert actions(by_sid["KeyAdministration"]) == list(ADMIN_ACTIONS)
    assert not [action for action in ADMIN_ACTIONS if fnmatch("kms:CreateGrant", action)]  # a grant to oneself
    assert not set(actions(by_sid["KeyAdministration"])) & set(SIGNING)  # no kms:*, no kms:Sign
    assert by_sid["Sign"]["Principal"] == {"AWS": {"Fn::GetAtt": [role_of(function), "Arn"]}}
    assert actions(by_sid["Sign"]) == ["kms:Sign"]
    assert by_sid["ReadPublicKey"]["Principal"] == {"AWS": {"Fn::GetAtt": [role_of(public_key_function), "Arn"]}}
    assert actions(by_sid["ReadPublicKey"]) == ["kms:GetPublicKey"]


def test_kms_sign_is_in_the_api_functions_role_alone_on_this_key_alone(template):
    key_id, _ = key_of(template)
    _, function = api_function(template)
    signers = [(role, statement) for role, statement in statements_of_roles(template)
               if set(actions(statement)) & set(SIGNING)]
    assert [role for role, _ in signers] == [role_of(function)]
    assert signers[0][1]["Resource"] == {"Fn::GetAtt": [key_id, "Arn"]}
    readers = [(role, statement) for role, statement in statements_of_roles(template)
               if "kms:GetPublicKey" in actions(statement)]
    assert len(readers) == 1 and readers[0][1]["Resource"] == {"Fn::GetAtt": [key_id, "Arn"]}


def test_every_function_that_authenticates_trusts_the_device_token_issuer_and_only_the_api_signs(template):
    key_id, _ = key_of(template)
    resource_id, resource = only(template, "Custom::DeviceTokenPublicKey")
    assert resource["Properties"]["KeyArn"] == {"Fn::GetAtt": [key_id, "Arn"]}
    functions = template.find_resources("AWS::Lambda::Function")
    trusting = {function["Properties"]["Handler"]: function["Properties"]["Environment"]["Variables"]
                for function in functions.values() if DEVICE_TOKEN_JWKS in
                function["Properties"].get("Environment", {}).get("Variables", {})}
    assert set(trusting) == {api_module.HANDLER, api_module.AUTHORIZER_HANDLER, push.HANDLER, push.FANOUT_HANDLER}
    for variables in trusting.values():
        assert variables[DEVICE_TOKEN_JWKS] == {"Fn::GetAtt": [resource_id, "Jwks"]}
        assert variables[DEVICE_TOKEN_ISSUER] == "urn:device-state:DeviceStateStack:device-tokens"
        assert variables[DEVICE_TOKEN_ISSUER] != variables[AUTH_ISSUER]
    signing = [function for function in functions.values()
               if DEVICE_TOKEN_KMS_KEY in function["Properties"].get("Environment", {}).get("Variables", {})]
    assert signing == [api_function(template)[1]]
    variables = signing[0]["Properties"]["Environment"]["Variables"]
    assert variables[DEVICE_TOKEN_KMS_KEY] == {"Fn::GetAtt": [key_id, "Arn"]}
    assert (variables[DEVICE_TOKEN_SECONDS], variables[DEVICE_TOKEN_MAX_SECONDS]) == ("3600", "3600")


def test_the_token_route_goes_to_the_signing_function(template):
    """POST /devices/{id}/token is no waiting route: the $default route takes it to the API
    function, the one with the signing variables (the function checks the device's credentials)."""
    routes = http_routes(template)
    assert not [key for key in routes if "/token" in key]
    function_logical, function = api_function(template)
    assert DEVICE_TOKEN_SECONDS in function["Properties"]["Environment"]["Variables"]
    assert routes["$default"]["IntegrationUri"] == {"Ref": alias_of(template, function_logical)[0]}


def test_the_lifetime_follows_context_and_a_bad_one_fails_the_synth():
    _, stack = synth_stack({"deviceTokenSeconds": 7200, "deviceTokenMaxSeconds": 7200,
                            "deviceTokenRenewalSeconds": 43200})
    variables = api_function(Template.from_stack(stack))[1]["Properties"]["Environment"]["Variables"]
    assert (variables[DEVICE_TOKEN_SECONDS], variables["DEVICE_TOKEN_RENEWAL_SECONDS"]) == ("7200", "43200")
    with pytest.raises(AuthConfigError, match="DEVICE_TOKEN_MAX_SECONDS"):
        synth_stack({"deviceTokenSeconds": 7200})  # longer than the stated maximum, not raised


def test_the_public_key_resource_turns_kms_public_key_into_the_jwks_the_functions_verify_with():
    kms = FakeKms()

    class Client:
        def get_public_key(self, KeyId):
            assert KeyId == KEY_ARN
            return {"KeyId": KEY_ARN, "KeySpec": "ECC_NIST_P256", "SigningAlgorithms": ["ECDSA_SHA_256"],
                    "PublicKey": kms.key.public_key().public_bytes(
                        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)}

    answer = kms_jwks_resource.on_event({"RequestType": "Create", "ResourceProperties": {"KeyArn": KEY_ARN}}, None,
                                        Client())
    assert answer["PhysicalResourceId"] == KEY_ARN and json.loads(answer["Data"]["Jwks"]) == kms.jwks()
    settings = TokenSettings("urn:device-state:x:device-tokens", "device-state", kms_key=KEY_ARN)
    config = AuthConfig.from_environment({**ISSUER.environment(), DEVICE_TOKEN_ISSUER: settings.issuer,
                                          DEVICE_TOKEN_AUDIENCE: settings.audience,
                                          DEVICE_TOKEN_JWKS: answer["Data"]["Jwks"]})
    token = issue(Principal.device("lamp-1", auth_time=int(time.time())), KmsSigner(KEY_ARN, kms), settings)["token"]
    assert verify_token(token, config).device_id == "lamp-1"
    assert kms_jwks_resource.on_event({"RequestType": "Delete", "PhysicalResourceId": KEY_ARN}, None, Client()) == {
        "PhysicalResourceId": KEY_ARN}


@pytest.mark.parametrize("key", [ec.generate_private_key(ec.SECP384R1()), rsa.generate_private_key(65537, 2048)])
def test_the_public_key_resource_refuses_any_other_key(key):
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(ValueError, match="P-256"):
        kms_jwks_resource.jwks(der, "kid")
