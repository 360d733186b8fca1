"""The metric names the handler emits are the library's constants; the OpenAPI
document and the registered routes agree; configuration is checked."""

from __future__ import annotations

import json

import pytest

from functions.api.config import Config, ConfigError
from functions.api.handler import app
from functions.api.openapi import OPENAPI
from functions.device_state import DeviceStateManager
from functions.device_state import metrics as names


def emitted_metrics(output: str) -> list[tuple[str, str]]:
    """(namespace, metric name) of every EMF line in the captured output."""
    found = []
    for line in output.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            document = json.loads(line)
            for directive in document["_aws"]["CloudWatchMetrics"]:
                found += [(directive["Namespace"], metric["Name"]) for metric in directive["Metrics"]]
    return found


def test_metric_names_are_the_library_constants(api, monkeypatch, capsys):
    monkeypatch.setenv("MAX_ATTEMPTS", "2")
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    api("POST", "/devices", {"deviceId": "m-1", "state": {"n": 0}})
    api("PATCH", "/devices/m-1", [{"op": "increment", "path": "/n", "value": 1}],
        content_type="application/json-patch+json")
    from functions.api import handler as handler_module

    rival = DeviceStateManager(api.client, api.table)
    client = handler_module._manager().client

    def rival_first(params, **kwargs):
        rival.replace("m-1", {"n": -1})

    client.meta.events.register("provide-client-params.dynamodb.UpdateItem", rival_first)
    try:
        exhausted = api("PATCH", "/devices/m-1", {"x": {"nested": 1}}, content_type="application/merge-patch+json")
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb.UpdateItem", rival_first)
    assert exhausted.status == 503
    for _ in range(2):
        api("PATCH", "/devices/m-1", {"y": 1}, content_type="application/merge-patch+json",
            headers={"Idempotency-Key": "once"})
    emitted = emitted_metrics(capsys.readouterr().out)
    assert {namespace for namespace, _ in emitted} == {names.NAMESPACE}
    metric_names = {name for _, name in emitted}
    assert metric_names <= set(names.ALL_METRICS)
    assert {names.UPDATES, names.UPDATE_ATTEMPTS, names.VERSION_CONFLICTS, names.RETRIES_EXHAUSTED,
            names.PATCH_LATENCY, names.IDEMPOTENT_REPLAYS} <= metric_names


def test_openapi_paths_are_exactly_the_routes():
    routes = {(route.method, route.path) for route in app._static_routes + app._dynamic_routes}
    documented = {
        (method.upper(), path.replace("{deviceId}", "<device_id>").replace("{leaseId}", "<lease_id>"))
        for path, item in OPENAPI["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert routes == documented


def test_every_documented_reference_resolves():
    text = json.dumps(OPENAPI)
    for schema in ("Device", "DevicePage", "JsonPatch", "Problem"):
        assert schema in OPENAPI["components"]["schemas"]
    for reference in {part.split('"')[0] for part in text.split('"$ref": "#/components/schemas/')[1:]}:
        assert reference in OPENAPI["components"]["schemas"]


def test_config_from_environment():
    config = Config.from_environment({"TABLE_NAME": "t", "MAX_ATTEMPTS": "7", "RETRY_BUDGET_SECONDS": "2.5",
                                      "REQUIRE_IF_MATCH": "TRUE", "DYNAMODB_ENDPOINT": "http://127.0.0.1:1"})
    assert config == Config("t", "http://127.0.0.1:1", 7, 2.5, True)
    assert Config.from_environment({"TABLE_NAME": "t"}).require_if_match is False


@pytest.mark.parametrize("environ", [
    {},
    {"TABLE_NAME": " "},
    {"TABLE_NAME": "t", "MAX_ATTEMPTS": "0"},
    {"TABLE_NAME": "t", "MAX_ATTEMPTS": "many"},
    {"TABLE_NAME": "t", "RETRY_BUDGET_SECONDS": "30"},
    {"TABLE_NAME": "t", "RETRY_BUDGET_SECONDS": "nan"},
    {"TABLE_NAME": "t", "REQUIRE_IF_MATCH": "maybe"},
])
def test_bad_configuration_is_refused(environ):
    with pytest.raises(ConfigError):
        Config.from_environment(environ)
