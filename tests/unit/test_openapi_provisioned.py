"""The document's answer schemas take the service's real answers: Provisioned (the 200 and 201 of
POST /devices/{deviceId}/provision, a device token beside deviceId and credentialId) validates a
real answer and still refuses a member it does not name; and no schema composes, by allOf, a
member that forbids additional properties (which would refuse every answer the others add to)."""

from __future__ import annotations

import json

import pytest
from openapi_schema_validator import OAS30Validator

from functions.api.openapi import OPENAPI
from functions.device_state.model.values import dumps

DOCUMENT = json.loads(dumps(OPENAPI))
SCHEMAS = DOCUMENT["components"]["schemas"]

PROVISIONED = {"deviceId": "lamp-1", "credentialId": "abcd1234", "token": "x.y.z", "tokenType": "Bearer",
               "expiresIn": 3600, "expiresAt": "2030-01-01T00:00:00Z"}


def validator(name: str) -> OAS30Validator:
    return OAS30Validator({"$ref": f"#/components/schemas/{name}", "components": DOCUMENT["components"]})


def test_a_real_provision_answer_is_valid():
    errors = [error.message for error in validator("Provisioned").iter_errors(PROVISIONED)]
    assert not errors, errors


@pytest.mark.parametrize("missing", sorted(PROVISIONED))
def test_a_provision_answer_without_a_required_member_is_invalid(missing):
    answer = {name: value for name, value in PROVISIONED.items() if name != missing}
    assert not validator("Provisioned").is_valid(answer), missing


def test_a_provision_answer_with_an_unknown_member_is_invalid():
    assert not validator("Provisioned").is_valid({**PROVISIONED, "unexpected": 1})


def test_provisioned_is_a_device_token_with_device_id_and_credential_id():
    """Built from DeviceToken: the two cannot drift."""
    token, provisioned = SCHEMAS["DeviceToken"], SCHEMAS["Provisioned"]
    assert set(provisioned["required"]) == set(token["required"]) | {"deviceId", "credentialId"}
    assert {name: provisioned["properties"][name] for name in token["properties"]} == token["properties"]
    assert provisioned["additionalProperties"] is False


def _resolved(schema: dict) -> dict:
    while "$ref" in schema:
        schema = SCHEMAS[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _all_ofs(value, where: str):
    if isinstance(value, dict):
        if "allOf" in value:
            yield where, value["allOf"]
        for name, member in value.items():
            yield from _all_ofs(member, f"{where}/{name}")
    elif isinstance(value, list):
        for index, member in enumerate(value):
            yield from _all_ofs(member, f"{where}/{index}")


def test_no_all_of_has_a_member_that_forbids_additional_properties():
    closed = [where for where, members in _all_ofs(DOCUMENT, "#") if len(members) > 1
              for member in members if _resolved(member).get("additionalProperties") is False]
    assert not closed, closed
