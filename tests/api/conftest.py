"""Calling the real ``lambda_handler`` with API Gateway HTTP API proxy events (payload format 1.0)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from functions.api import handler as handler_module
from functions.config import api_config as load_config
from functions.auth.credentials import load_auth_config
from functions.device_state.client import dynamodb_client
from functions.device_state.model.values import dumps, loads
from localdev.apigw import LambdaContext, make_event
from localdev.faults import Forwarder
from tests.auth import with_credentials


@dataclass
class Result:
    status: int
    headers: dict
    text: str

    @property
    def json(self):
        return loads(self.text)

    def header(self, name):
        lowered = {key.lower(): value for key, value in self.headers.items()}
        return lowered.get(name.lower())


def _reset_caches():
    load_auth_config.cache_clear()
    handler_module._manager.cache_clear()
    load_config.cache_clear()
    dynamodb_client.cache_clear()


@pytest.fixture
def api(engine, monkeypatch, dynamodb_local_endpoint_for):
    """``api(method, path, body=None, headers=None)`` -> Result, against a fresh table."""
    client, name = engine
    monkeypatch.setenv("TABLE_NAME", name)
    endpoint = dynamodb_local_endpoint_for(client)
    if endpoint:
        monkeypatch.setenv("DYNAMODB_ENDPOINT", endpoint)
    else:
        monkeypatch.delenv("DYNAMODB_ENDPOINT", raising=False)
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    _reset_caches()

    def call(method, path, body=None, headers=None, content_type="application/json", raw=None):
        headers = with_credentials(headers)
        if body is not None or raw is not None:
            headers.setdefault("Content-Type", content_type)
        payload = raw if raw is not None else (None if body is None else dumps(body))
        event = make_event(method, path, headers, payload)
        response = handler_module.lambda_handler(event, LambdaContext())
        merged = dict(response.get("headers") or {})
        for key, values in (response.get("multiValueHeaders") or {}).items():
            merged[key] = ", ".join(values)
        result = Result(response["statusCode"], merged, response.get("body") or "")
        if result.status >= 400:
            assert_problem(result)
        assert result.status < 500 or result.status in (503, 504), result.text
        return result

    call.client = client
    call.table = name
    yield call
    _reset_caches()


@pytest.fixture
def dynamodb_local_endpoint_for(request):
    def endpoint(client):
        url = client.meta.endpoint_url
        return url if url.startswith("http://127.0.0.1") else None

    return endpoint


def header_of(response: dict, name: str):
    """A header of a raw handler response (REST events get multiValueHeaders)."""
    for key, value in (response.get("headers") or {}).items():
        if key.lower() == name.lower():
            return value
    for key, values in (response.get("multiValueHeaders") or {}).items():
        if key.lower() == name.lower():
            return ", ".join(values)
    return None


def assert_problem(result: Result) -> None:
    """Every error is RFC 9457 problem details."""
    assert result.header("Content-Type") == "application/problem+json", result.headers
    problem = json.loads(result.text)
    assert {"type", "title", "status", "detail"} <= set(problem), problem
    assert problem["status"] == result.status
    assert isinstance(problem["detail"], str) and problem["detail"]


@pytest.fixture(scope="module")
def forwarder(dynamodb_local):
    """The fault forwarder (localdev/faults.py) in front of the worker's DynamoDB Local, for a
    module's server to reach DynamoDB through; each test sets what it loses or holds."""
    forwarder = Forwarder(dynamodb_local.port)
    yield forwarder
    forwarder.close()
