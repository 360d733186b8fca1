"""The deploy-time JWKS custom resource (functions/auth/jwks_resource.py): what it returns to
CloudFormation for each request type, and how it treats an issuer that is not ready or
serves no keys. No network: urlopen is replaced by a fake."""

from __future__ import annotations

import io
import json
import urllib.error

import pytest

from functions.auth import jwks_resource
from functions.auth.credentials import AUTH_AUDIENCE, AUTH_ISSUER, AUTH_JWKS, AuthConfig
from tests.auth import ISSUER

POOL = "https://cognito-idp.eu-west-1.amazonaws.com/eu-west-1_AbCdEf123"


def opener(*answers):
    """urlopen answering each call with the next of ``answers`` (an exception is raised)."""
    calls = []

    def urlopen(url, timeout):
        calls.append(url)
        answer = answers[len(calls) - 1]
        if isinstance(answer, Exception):
            raise answer
        return io.BytesIO(json.dumps(answer).encode())

    urlopen.calls = calls
    return urlopen


def event(request_type: str) -> dict:
    return {"RequestType": request_type, "ResourceProperties": {"ServiceToken": "arn:...", "Issuer": POOL},
            "PhysicalResourceId": jwks_resource.jwks_url(POOL)}


@pytest.mark.parametrize("request_type", ["Create", "Update"])
def test_create_and_update_return_the_issuers_keys_compact(monkeypatch, request_type):
    urlopen = opener(ISSUER.jwks())
    monkeypatch.setattr(jwks_resource.urllib.request, "urlopen", urlopen)
    answer = jwks_resource.on_event(event(request_type), None)
    assert urlopen.calls == [f"{POOL}/.well-known/jwks.json"]
    assert answer["PhysicalResourceId"] == f"{POOL}/.well-known/jwks.json"
    document = answer["Data"]["Jwks"]
    assert " " not in document and json.loads(document) == ISSUER.jwks()
    # What the functions will make of it, as AUTH_JWKS:
    config = AuthConfig.from_environment({AUTH_ISSUER: POOL, AUTH_AUDIENCE: "client", AUTH_JWKS: document})
    assert set(config.issuers[0].keys) == {ISSUER.kid}


def test_delete_fetches_nothing(monkeypatch):
    monkeypatch.setattr(jwks_resource.urllib.request, "urlopen", opener())
    assert jwks_resource.on_event(event("Delete"), None) == {"PhysicalResourceId": f"{POOL}/.well-known/jwks.json"}


def test_a_pool_not_serving_its_keys_yet_is_asked_again():
    urlopen = opener(urllib.error.URLError("connection refused"), {"keys": []}, ISSUER.jwks())
    slept = []
    assert json.loads(jwks_resource.fetch("https://x/jwks", opener=urlopen, sleep=slept.append)) == ISSUER.jwks()
    assert len(urlopen.calls) == 3 and slept == [1, 2]


def test_an_issuer_that_never_serves_keys_fails_the_deploy_with_its_url():
    urlopen = opener(*[{"error": "not found"}] * jwks_resource.ATTEMPTS)
    with pytest.raises(RuntimeError, match="no usable JWKS at https://x/jwks"):
        jwks_resource.fetch("https://x/jwks", opener=urlopen, sleep=lambda _: None)


def test_a_jwks_too_large_for_the_lambda_environment_is_refused():
    key = ISSUER.jwks()["keys"][0]
    with pytest.raises(ValueError, match="Lambda environment"):
        jwks_resource.compact({"keys": [dict(key, kid=str(n)) for n in range(40)]})
