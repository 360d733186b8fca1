"""The key that seals listings' cursors, deployed: a secret Secrets Manager generates, resolved
into both API functions' environment by a dynamic reference (never a value in the template),
read by no other function, and replaced by the next cursorKeyGeneration."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Template

from functions import config
from functions.device_state import MIN_CURSOR_KEY_BYTES
from infra import api as api_module
from tests.infra.conftest import synth_stack
from tests.infra.test_stack import api_function


def secrets(template: Template) -> dict:
    return template.find_resources("AWS::SecretsManager::Secret")


def reference(secret_id: str) -> dict:
    return {"Fn::Join": ["", ["{{resolve:secretsmanager:", {"Ref": secret_id}, ":SecretString:::}}"]]}


def test_the_key_is_a_generated_secret_of_letters_and_digits(template):
    (secret_id, secret), = secrets(template).items()
    assert secret_id.startswith(f"DeviceApi{api_module.CURSOR_KEY_SECRET}")
    generated = secret["Properties"]["GenerateSecretString"]
    assert generated == {"ExcludePunctuation": True, "IncludeSpace": False,
                         "PasswordLength": api_module.CURSOR_KEY_CHARACTERS}
    assert api_module.CURSOR_KEY_CHARACTERS >= MIN_CURSOR_KEY_BYTES  # the functions take it
    assert "SecretString" not in secret["Properties"]  # no value of ours in the template


@pytest.mark.parametrize("construct", ["Function", "WaitingFunction"])
def test_both_api_functions_resolve_it_from_the_secret_at_deploy(template, construct):
    (secret_id, _), = secrets(template).items()
    _, function = api_function(template, construct)
    assert function["Properties"]["Environment"]["Variables"][config.CURSOR_KEY] == reference(secret_id)


def test_no_other_function_reads_it_and_no_role_may_read_the_secret(template):
    holders = [logical for logical, function in template.find_resources("AWS::Lambda::Function").items()
               if config.CURSOR_KEY in function["Properties"].get("Environment", {}).get("Variables", {})]
    runner = [logical for logical in template.find_resources("AWS::Lambda::Function")
              if logical.startswith("JobsFunction")]  # a job's fleet query cursor, kept on the table
    assert len(runner) == 1
    assert sorted(holders) == sorted([api_function(template, construct)[0]
                                      for construct in ("Function", "WaitingFunction")] + runner)
    assert "secretsmanager:GetSecretValue" not in json.dumps(template.find_resources("AWS::IAM::Policy"))


def test_the_next_generation_replaces_the_secret_and_what_the_functions_resolve():
    _, stack = synth_stack({"cursorKeyGeneration": "2"})
    replaced = Template.from_stack(stack)
    (secret_id, _), = secrets(replaced).items()
    assert secret_id.startswith(f"DeviceApi{api_module.CURSOR_KEY_SECRET}2")
    _, function = api_function(replaced)
    assert function["Properties"]["Environment"]["Variables"][config.CURSOR_KEY] == reference(secret_id)


@pytest.mark.parametrize("generation", ["0", "-1", "two", True])
def test_a_bad_generation_fails_the_synth(generation):
    with pytest.raises(ValueError, match="cursorKeyGeneration"):
        synth_stack({"cursorKeyGeneration": generation})
