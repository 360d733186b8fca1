"""Every event in events/ replays through `make invoke`'s path with the status its name
promises, so the examples stay true."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localdev.invoke import invoke

EVENTS = Path(__file__).resolve().parents[2] / "events"
EXPECTED = {
    "bad-device-id": 400, "create-device": 201, "create-existing-device": 409, "delete-device": 204,
    "get-device": 200, "get-device-not-modified": 304, "get-missing-device": 404, "list-devices": 200,
    "patch-device": 200, "patch-device-json-patch": 200, "patch-device-test-fails": 409,
    "patch-device-stale-if-match": 412, "patch-device-not-applicable": 422, "patch-device-bad-json": 400,
    "patch-device-unsupported-type": 415, "patch-device-nan": 400, "put-device": 200,
    "put-device-create-only": 412, "transaction-scene": 200, "transaction-stale-if-match": 412,
    "acquire-lease": 201, "lease-status": 200, "heartbeat-unknown-lease": 404,
    # a token that names no active lease (lamp-1 is not leased in the seeded table)
    "patch-device-wrong-lease-token": 409,
    # the change feed: lamp-1 is at version 1 (caught up: an empty page); no version 7
    "get-changes": 200, "get-changes-bad-limit": 400, "get-device-version-missing": 404,
}


def test_every_event_file_has_an_expectation():
    assert {path.stem for path in EVENTS.glob("*.json")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_event_replays_with_its_status(name, monkeypatch):
    from functions.api import handler
    from functions.config import api_config as load_config
    from functions.device_state.client import dynamodb_client

    monkeypatch.setenv("TABLE_NAME", "devices")
    for variable in ("POWERTOOLS_TRACE_DISABLED", "POWERTOOLS_METRICS_DISABLED"):
        monkeypatch.setenv(variable, "true")  # invoke() would otherwise set them for the whole session
    monkeypatch.delenv("DYNAMODB_ENDPOINT", raising=False)
    for cache in (handler._manager, load_config, dynamodb_client):
        cache.cache_clear()
    event = json.loads((EVENTS / f"{name}.json").read_text())
    response = invoke(event)
    for cache in (handler._manager, load_config, dynamodb_client):
        cache.cache_clear()
    assert response["statusCode"] == EXPECTED[name], response
    if name == "create-device":
        assert response["multiValueHeaders"]["Location"] == ["/devices/lamp-2"]  # the $default stage: no prefix
