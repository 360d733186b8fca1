"""The metric names the handler emits are the library's constants; the OpenAPI
document and the registered routes agree; configuration is checked."""

from __future__ import annotations

import json

import pytest

from functions.config import ApiConfig as Config, ConfigError
from functions.api.openapi import OPENAPI
from functions.device_state.model.values import dumps
from functions.device_state import DeviceStateManager, leases
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
            names.PATCH_LATENCY, names.IDEMPOTENT_REPLAYS, names.READ_UNITS, names.WRITE_UNITS} <= metric_names


def test_openapi_paths_are_exactly_the_routes():
    from functions.api.common import REGISTERED

    routes = set(REGISTERED)
    documented = {
        (method.upper(), path.replace("{deviceId}", "<device_id>").replace("{leaseId}", "<lease_id>")
         .replace("{version}", "<version>").replace("{credentialId}", "<credential_id>")
         .replace("{enrollmentId}", "<enrollment_id>").replace("{jobId}", "<job_id>"))
        for path, item in OPENAPI["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert routes == documented


def test_the_document_is_valid_openapi():
    from openapi_spec_validator import validate

    validate(json.loads(dumps(OPENAPI)))


def test_the_documents_limits_are_the_services_constants():
    from functions.api import routes
    from functions.device_state.write.keyed import KEY_PATTERN
    from functions.device_state.leases.queue import MAX_TTL_SECONDS
    from functions.device_state import MAX_FILTER_CHARS, MAX_QUERY_LIMIT
    from functions.device_state import MAX_LIST_LIMIT
    from functions.device_state import MAX_OPERATIONS
    from functions.device_state.model.values import DEVICE_ID_PATTERN

    paths, schemas = OPENAPI["paths"], OPENAPI["components"]["schemas"]
    device_id = paths["/devices/{deviceId}"]["parameters"][0]["schema"]["pattern"]
    assert device_id == f"^{DEVICE_ID_PATTERN.pattern}$"
    limit, cursor, filter_, *_ = paths["/devices"]["get"]["parameters"]  # then sort, include
    assert limit["schema"]["maximum"] == MAX_LIST_LIMIT == MAX_QUERY_LIMIT
    assert cursor["schema"]["pattern"] == routes.LISTING_CURSOR_PATTERN
    assert filter_["schema"]["maxLength"] == MAX_FILTER_CHARS
    assert paths["/devices/count"]["get"]["parameters"][0]["schema"]["maxLength"] == MAX_FILTER_CHARS
    assert schemas["Transaction"]["properties"]["operations"]["maxItems"] == MAX_OPERATIONS
    lease_body = paths["/devices/{deviceId}/leases"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert lease_body["properties"]["ttlSeconds"]["maximum"] == MAX_TTL_SECONDS
    assert lease_body["properties"]["waitSeconds"]["maximum"] == routes.MAX_LEASE_WAIT_SECONDS
    assert lease_body["properties"]["owner"]["maxLength"] == leases.MAX_OWNER_CHARS
    key = next(p for p in paths["/devices"]["post"]["parameters"] if p["name"] == "Idempotency-Key")
    assert key["schema"]["pattern"] == f"^{KEY_PATTERN.pattern}$"


@pytest.mark.parametrize("text", ["\ufffd", "1.\ufffd", "lamp\udc80"])
def test_no_path_or_query_parameter_of_the_document_admits_what_stands_in_for_bytes_not_utf8(text):
    """Every route refuses a path or query holding U+FFFD or a lone surrogate (400: a byte that
    was no UTF-8), so no parameter's schema may admit one (schemathesis found a leaseId that did)."""
    import jsonschema

    document = json.loads(dumps(OPENAPI))
    admitted = [(path, parameter["name"]) for path, item in document["paths"].items()
                for operation in [item, *(item[method] for method in item if method != "parameters")]
                for parameter in operation.get("parameters", []) if parameter["in"] in ("path", "query")
                if jsonschema.Draft202012Validator(parameter["schema"]).is_valid(text)]
    assert admitted == []


def test_every_get_has_a_head_and_get_of_a_device_documents_if_match_and_412():
    for path, item in OPENAPI["paths"].items():
        assert ("get" in item) == ("head" in item), path
    get = OPENAPI["paths"]["/devices/{deviceId}"]["get"]
    assert "If-Match" in {parameter["name"] for parameter in get["parameters"]}
    assert "412" in get["responses"] and "412" in OPENAPI["paths"]["/devices/{deviceId}"]["head"]["responses"]
    if_match = next(p for p in get["parameters"] if p["name"] == "If-Match")
    assert if_match["schema"]["minLength"] == 1


def test_every_documented_reference_resolves():
    text = dumps(OPENAPI)
    for schema in ("Device", "DevicePage", "JsonPatch", "Problem"):
        assert schema in OPENAPI["components"]["schemas"]
    for reference in {part.split('"')[0] for part in text.split('"$ref": "#/components/schemas/')[1:]}:
        assert reference in OPENAPI["components"]["schemas"]


KEY = "k" * 32  # the shortest CURSOR_KEY taken


def test_config_from_environment():
    config = Config.from_environment({"TABLE_NAME": "t", "MAX_ATTEMPTS": "7", "RETRY_BUDGET_SECONDS": "2.5",
                                      "REQUIRE_IF_MATCH": "TRUE", "DYNAMODB_ENDPOINT": "http://127.0.0.1:1",
                                      "CURSOR_KEY": KEY})
    assert config == Config("t", "http://127.0.0.1:1", max_attempts=7, retry_budget_seconds=2.5,
                            require_if_match=True, cursor_key=KEY.encode())
    assert Config.from_environment({"TABLE_NAME": "t", "CURSOR_KEY": KEY}).require_if_match is False
    assert KEY not in repr(config)  # a key never reaches a log through the configuration


@pytest.mark.parametrize("environ", [
    {"CURSOR_KEY": KEY},
    {"TABLE_NAME": " ", "CURSOR_KEY": KEY},
    {"TABLE_NAME": "t", "MAX_ATTEMPTS": "0", "CURSOR_KEY": KEY},
    {"TABLE_NAME": "t", "MAX_ATTEMPTS": "many", "CURSOR_KEY": KEY},
    {"TABLE_NAME": "t", "RETRY_BUDGET_SECONDS": "30", "CURSOR_KEY": KEY},
    {"TABLE_NAME": "t", "RETRY_BUDGET_SECONDS": "nan", "CURSOR_KEY": KEY},
    {"TABLE_NAME": "t", "REQUIRE_IF_MATCH": "maybe", "CURSOR_KEY": KEY},
    {"TABLE_NAME": "t"},  # no cursor key: each instance would refuse the others' cursors
    {"TABLE_NAME": "t", "CURSOR_KEY": KEY[1:]},
    {"TABLE_NAME": "t", "CURSOR_KEY": KEY, "CHANGE_RETENTION_SECONDS": "7200"},  # a connection's life: too short
    {"TABLE_NAME": "t", "CURSOR_KEY": KEY, "TOMBSTONE_SECONDS": "60"},  # shorter than the changes it outlives
    {"TABLE_NAME": "t", "CURSOR_KEY": KEY, "CHANGE_RETENTION_SECONDS": "864000", "TOMBSTONE_SECONDS": "863999"},
    {"TABLE_NAME": "t", "CURSOR_KEY": KEY, "TOMBSTONE_SECONDS": "a month"},
    {"TABLE_NAME": "t", "CURSOR_KEY": KEY, "TOMBSTONE_SECONDS": str(367 * 24 * 3600)},
])
def test_bad_configuration_is_refused(environ):
    with pytest.raises(ConfigError):
        Config.from_environment(environ)


def test_a_tombstone_outlives_the_changes_before_it():
    """A device created again once its tombstone expired starts over at version 1: the former
    device's changes must have expired by then (tests/integration/test_changes.py)."""
    def tombstone(**environ) -> int:
        return Config.from_environment({"TABLE_NAME": "t", "CURSOR_KEY": KEY, **environ}).tombstone_seconds

    assert tombstone() == 30 * 24 * 3600
    assert tombstone(CHANGE_RETENTION_SECONDS="7776000") == 7776000  # unset: at least the retention
    assert tombstone(CHANGE_RETENTION_SECONDS="864000", TOMBSTONE_SECONDS="864000") == 864000
    assert tombstone(TOMBSTONE_SECONDS="604800") == 604800  # the default retention, 7 days


def test_the_feed_outlives_any_connection_that_follows_it():
    from functions.config import MIN_RETENTION_SECONDS
    from functions.push.subscriptions import CONNECTION_LIFETIME_SECONDS

    assert MIN_RETENTION_SECONDS > CONNECTION_LIFETIME_SECONDS
    assert Config.from_environment({"TABLE_NAME": "t", "CURSOR_KEY": KEY, "CHANGE_RETENTION_SECONDS": "10800"})


@pytest.mark.parametrize("request_path, server", [("/openapi.json", "/"), ("/prod/openapi.json", "/prod")])
def test_the_served_document_names_its_server(request_path, server):
    from functions.api.handler import lambda_handler
    from localdev.apigw import LambdaContext, make_event

    event = make_event("GET", "/openapi.json")
    event["requestContext"]["path"] = request_path  # behind API Gateway the stage comes first
    response = lambda_handler(event, LambdaContext())
    assert response["statusCode"] == 200
    assert [entry["url"] for entry in json.loads(response["body"])["servers"]] == [server]
    assert OPENAPI["servers"][0]["url"] == "/"
