"""Every route, status and header of the contract, through the real lambda_handler with
API Gateway events (moto and DynamoDB Local)."""

from __future__ import annotations

import base64
from decimal import Decimal

import pytest

from functions.device_state import DeviceStateManager
from tests.api.conftest import header_of
from tests.auth import with_credentials

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def create(api, device_id="lamp-1", state=None):
    result = api("POST", "/devices", {"deviceId": device_id, "state": state or {"power": "on", "brightness": 50}})
    assert result.status == 201, result.text
    return result


def state_of(api, device_id="lamp-1"):
    result = api("GET", f"/devices/{device_id}")
    return result.json["state"] if result.status == 200 else None


def version_of(api, device_id="lamp-1"):
    return api("GET", f"/devices/{device_id}").json["version"]


# ------------------------------------------------------------------- POST


def test_create_answers_201_with_location_and_etag(api):
    result = create(api)
    assert result.header("Location") == "/devices/lamp-1"
    assert result.header("ETag") == '"1"'
    body = result.json
    assert body["deviceId"] == "lamp-1" and body["version"] == 1
    assert body["state"] == {"power": "on", "brightness": 50}
    assert body["createdAt"] == body["updatedAt"]


def test_create_of_existing_device_is_409_and_changes_nothing(api):
    create(api)
    result = api("POST", "/devices", {"deviceId": "lamp-1", "state": {"power": "off"}})
    assert result.status == 409
    assert result.json["deviceId"] == "lamp-1" and result.json["currentVersion"] == 1
    assert state_of(api) == {"power": "on", "brightness": 50}


@pytest.mark.parametrize(
    "raw, status",
    [
        ('{"deviceId": "a", "state": {', 400),  # malformed JSON
        ('{"deviceId": "a"}', 400),  # no state
        ('{"deviceId": "a", "state": {}, "extra": 1}', 400),
        ('{"deviceId": "a", "state": []}', 400),
        ('{"deviceId": "a", "state": {"x": NaN}}', 400),
        ('{"deviceId": "a", "state": {"x": Infinity}}', 400),
        ('{"deviceId": "a", "state": {"x": 1234567890123456789012345678901234567890}}', 400),
        ('{"deviceId": "a", "state": {"x": 1e200}}', 400),
        ('{"deviceId": "a", "state": {"": 1}}', 400),
        ('{"deviceId": "a b", "state": {}}', 400),
        ('{"deviceId": 5, "state": {}}', 400),
        ('{"deviceId": "' + "x" * 129 + '", "state": {}}', 400),
        ('[]', 400),
        ('"text"', 400),
        ('', 400),
    ],
)
def test_bad_create_bodies_are_4xx_and_write_nothing(api, raw, status):
    result = api("POST", "/devices", raw=raw)
    assert result.status == status
    assert api("GET", "/devices").json["items"] == []


def test_nesting_and_size_limits_name_the_limit(api):
    deep = {}
    cursor = deep
    for _ in range(40):
        cursor["k"] = {}
        cursor = cursor["k"]
    result = api("POST", "/devices", {"deviceId": "a", "state": deep})
    assert result.status == 400 and result.json["limit"] == "nesting-depth"
    big = api("POST", "/devices", {"deviceId": "a", "state": {"blob": "x" * 500_000}})
    assert big.status == 413 and big.json["limit"] == "item-size"
    huge = api("POST", "/devices", {"deviceId": "a", "state": {"blob": "x" * 1_100_000}})
    assert huge.status == 413
    assert api("GET", "/devices").json["items"] == []


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", "application/json; charset=latin-1"])
def test_create_needs_json(api, content_type):
    result = api("POST", "/devices", {"deviceId": "a", "state": {}}, content_type=content_type)
    assert result.status == 415


def test_bodies_that_are_not_utf8_or_bad_base64_are_400(api):
    from functions.api.handler import lambda_handler
    from localdev.apigw import LambdaContext, make_event

    for event in (
        make_event("POST", "/devices", with_credentials({"Content-Type": "application/json"}), b'{"deviceId": "\xff"}'),
        {**make_event("POST", "/devices", with_credentials({"Content-Type": "application/json"}), "not base64!"),
         "isBase64Encoded": True},
    ):
        response = lambda_handler(event, LambdaContext())
        assert response["statusCode"] == 400


def test_base64_encoded_json_body_is_accepted(api):
    from functions.api.handler import lambda_handler
    from localdev.apigw import LambdaContext, make_event

    body = '{"deviceId": "b64", "state": {"x": 1}}'.encode()
    event = make_event("POST", "/devices", with_credentials({"Content-Type": "application/json"}), body)
    assert event["isBase64Encoded"] and base64.b64decode(event["body"]) == body
    assert lambda_handler(event, LambdaContext())["statusCode"] == 201


def test_exact_decimals_end_to_end(api):
    create(api, "m", {"x": Decimal("0.1"), "big": Decimal("12345678901234567890.123456789012345678")})
    result = api("PATCH", "/devices/m", [{"op": "increment", "path": "/x", "value": Decimal("0.2")}],
                 content_type=JSON_PATCH)
    assert '"x":0.3' in result.text
    assert '"big":12345678901234567890.123456789012345678' in result.text


# -------------------------------------------------------------------- GET


def test_get_returns_the_device_with_its_etag(api):
    create(api)
    result = api("GET", "/devices/lamp-1")
    assert result.status == 200 and result.header("ETag") == '"1"'
    assert result.header("Content-Type") == "application/json"


@pytest.mark.parametrize("tags, status", [('"1"', 304), ('W/"1"', 304), ('"7", "1"', 304), ("*", 304),
                                          ('"2"', 200), ('"abc"', 200)])
def test_get_if_none_match(api, tags, status):
    create(api)
    result = api("GET", "/devices/lamp-1", headers={"If-None-Match": tags})
    assert result.status == status
    assert result.header("ETag") == '"1"'
    if status == 304:
        assert result.text == ""


def test_get_missing_device_is_404(api):
    result = api("GET", "/devices/ghost")
    assert result.status == 404 and result.json["deviceId"] == "ghost"


@pytest.mark.parametrize("path", ["/devices/a%20b", "/devices/" + "x" * 129, "/devices/a%23b", "/devices/%C3%A9"])
def test_bad_device_id_in_path_is_400(api, path):
    assert api("GET", path).status == 400


def test_percent_encoded_allowed_characters_are_decoded(api):
    create(api, "lamp:1")
    assert api("GET", "/devices/lamp%3A1").json["deviceId"] == "lamp:1"


# -------------------------------------------------------------------- PUT


def test_put_creates_then_replaces(api):
    first = api("PUT", "/devices/cfg", {"state": {"a": 1}})
    assert first.status == 201 and first.header("Location") == "/devices/cfg" and first.header("ETag") == '"1"'
    second = api("PUT", "/devices/cfg", {"state": {"b": 2}})
    assert second.status == 200 and second.header("ETag") == '"2"'
    assert second.json["state"] == {"b": 2}


def test_put_if_none_match_star_is_create_only(api):
    assert api("PUT", "/devices/cfg", {"state": {"a": 1}}, headers={"If-None-Match": "*"}).status == 201
    again = api("PUT", "/devices/cfg", {"state": {"a": 2}}, headers={"If-None-Match": "*"})
    assert again.status == 412 and again.header("ETag") == '"1"'
    assert state_of(api, "cfg") == {"a": 1}


def test_put_if_match(api):
    api("PUT", "/devices/cfg", {"state": {"a": 1}})
    ok = api("PUT", "/devices/cfg", {"state": {"a": 2}}, headers={"If-Match": '"1"'})
    assert ok.status == 200 and ok.header("ETag") == '"2"'
    stale = api("PUT", "/devices/cfg", {"state": {"a": 3}}, headers={"If-Match": '"1"'})
    assert stale.status == 412 and stale.header("ETag") == '"2"' and stale.json["currentVersion"] == 2
    assert state_of(api, "cfg") == {"a": 2}
    missing = api("PUT", "/devices/ghost", {"state": {}}, headers={"If-Match": '"1"'})
    assert missing.status == 412
    assert api("GET", "/devices/ghost").status == 404


def test_put_with_other_precondition_combinations(api):
    api("PUT", "/devices/cfg", {"state": {"a": 1}})
    assert api("PUT", "/devices/cfg", {"state": {"a": 2}}, headers={"If-Match": '"5", "1"'}).status == 200
    assert api("PUT", "/devices/cfg", {"state": {"a": 3}}, headers={"If-Match": "*"}).status == 200
    assert api("PUT", "/devices/cfg", {"state": {"a": 4}}, headers={"If-None-Match": '"3"'}).status == 412
    assert api("PUT", "/devices/cfg", {"state": {"a": 4}}, headers={"If-None-Match": '"2"'}).status == 200
    assert api("PUT", "/devices/new", {"state": {}}, headers={"If-None-Match": '"2"'}).status == 201
    assert api("PUT", "/devices/new2", {"state": {}}, headers={"If-Match": "*"}).status == 412


def test_put_body_rules(api):
    assert api("PUT", "/devices/cfg", {"deviceId": "other", "state": {}}).status == 400
    assert api("PUT", "/devices/cfg", {"deviceId": "cfg", "state": {}}).status == 201
    assert api("PUT", "/devices/cfg", {"state": {}, "version": 3}).status == 400
    assert api("PUT", "/devices/cfg", {"power": "on"}).status == 400


@pytest.mark.parametrize("header", ['3', '"1', 'W/', '"1" "2"', ""])
def test_malformed_entity_tags_are_400(api, header):
    create(api)
    assert api("PUT", "/devices/lamp-1", {"state": {}}, headers={"If-Match": header}).status == 400
    assert version_of(api) == 1


# ------------------------------------------------------------------ PATCH


@pytest.mark.parametrize("content_type", [MERGE, "application/json", "application/merge-patch+json; charset=utf-8"])
def test_merge_patch(api, content_type):
    create(api)
    result = api("PATCH", "/devices/lamp-1", {"brightness": 75, "power": None, "scene": {"name": "eve"}},
                 content_type=content_type)
    assert result.status == 200 and result.header("ETag") == '"2"'
    assert result.json["state"] == {"brightness": 75, "scene": {"name": "eve"}}
    assert result.json["version"] == 2


def test_json_patch_all_operations_and_increment(api):
    create(api, state={"brightness": 50, "tags": ["a"], "meta": {"x": 1}})
    result = api("PATCH", "/devices/lamp-1", [
        {"op": "test", "path": "/brightness", "value": 50},
        {"op": "increment", "path": "/brightness", "value": 80, "min": 0, "max": 100},
        {"op": "add", "path": "/tags/-", "value": "b"},
        {"op": "remove", "path": "/tags/0"},
        {"op": "replace", "path": "/meta/x", "value": 2},
        {"op": "copy", "from": "/meta", "path": "/meta2"},
        {"op": "move", "from": "/meta2", "path": "/moved"},
        {"op": "increment", "path": "/count", "value": -2},
    ], content_type=JSON_PATCH)
    assert result.status == 200, result.text
    assert result.json["state"] == {"brightness": 100, "tags": ["b"], "meta": {"x": 2}, "moved": {"x": 2},
                                    "count": -2}


def test_failed_json_patch_test_is_409_and_writes_nothing(api):
    create(api)
    result = api("PATCH", "/devices/lamp-1", [{"op": "test", "path": "/power", "value": "off"},
                                              {"op": "replace", "path": "/power", "value": "x"}],
                 content_type=JSON_PATCH)
    assert result.status == 409
    assert version_of(api) == 1


@pytest.mark.parametrize("patch", [
    [{"op": "remove", "path": "/missing"}],
    [{"op": "replace", "path": "/missing", "value": 1}],
    [{"op": "increment", "path": "/power", "value": 1}],
    [{"op": "add", "path": "/a/b", "value": 1}],
    [{"op": "replace", "path": "", "value": 5}],
])
def test_patch_that_cannot_apply_is_422(api, patch):
    create(api)
    assert api("PATCH", "/devices/lamp-1", patch, content_type=JSON_PATCH).status == 422
    assert version_of(api) == 1


@pytest.mark.parametrize("raw, content_type", [
    ('{"op": "add"}', JSON_PATCH),
    ('[{"op": "frobnicate", "path": "/a"}]', JSON_PATCH),
    ('[{"op": "add", "path": "a", "value": 1}]', JSON_PATCH),
    ('[{"op": "increment", "path": "/a", "value": "1"}]', JSON_PATCH),
    ('[1, 2]', MERGE),
    ('{"a": ', MERGE),
    ('{"a": NaN}', MERGE),
])
def test_invalid_patch_documents_are_400(api, raw, content_type):
    create(api)
    assert api("PATCH", "/devices/lamp-1", raw=raw, content_type=content_type).status == 400
    assert version_of(api) == 1


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", None])
def test_patch_with_unsupported_content_type_is_415(api, content_type):
    create(api)
    headers = {"Content-Type": content_type} if content_type else {}
    from functions.api.handler import lambda_handler
    from localdev.apigw import LambdaContext, make_event

    response = lambda_handler(make_event("PATCH", "/devices/lamp-1", with_credentials(headers), '{"a": 1}'), LambdaContext())
    assert response["statusCode"] == 415
    assert "application/merge-patch+json" in header_of(response, "Accept-Patch")


def test_patch_if_match(api):
    create(api)
    ok = api("PATCH", "/devices/lamp-1", {"brightness": 60}, headers={"If-Match": '"1"'})
    assert ok.status == 200 and ok.header("ETag") == '"2"'
    stale = api("PATCH", "/devices/lamp-1", {"brightness": 10}, headers={"If-Match": '"1"'})
    assert stale.status == 412 and stale.header("ETag") == '"2"'
    assert stale.json["currentVersion"] == 2
    assert state_of(api)["brightness"] == 60
    weak = api("PATCH", "/devices/lamp-1", {"brightness": 10}, headers={"If-Match": 'W/"2"'})
    assert weak.status == 412  # If-Match compares strongly
    assert api("PATCH", "/devices/lamp-1", {"brightness": 11}, headers={"If-Match": "*"}).status == 200
    assert api("PATCH", "/devices/lamp-1", {"brightness": 12}, headers={"If-None-Match": '"3"'}).status == 412
    assert api("PATCH", "/devices/lamp-1", {"brightness": 12}, headers={"If-None-Match": '"1"'}).status == 200


def test_patch_missing_device_is_404(api):
    assert api("PATCH", "/devices/ghost", {"a": 1}).status == 404
    assert api("PATCH", "/devices/ghost", {"a": 1}, headers={"If-Match": '"1"'}).status == 404


def test_patch_that_makes_the_item_too_large_is_413(api):
    create(api, state={"blob": "x" * 300_000})
    result = api("PATCH", "/devices/lamp-1", {"blob2": "y" * 200_000})
    assert result.status == 413
    assert version_of(api) == 1


def test_patch_result_with_number_out_of_range_is_4xx(api):
    create(api, state={"n": Decimal("9E+125")})
    result = api("PATCH", "/devices/lamp-1", [{"op": "increment", "path": "/n", "value": Decimal("9E+125")}],
                 content_type=JSON_PATCH)
    assert result.status == 400 and result.json["limit"] == "number-range"


def test_contention_exhaustion_is_503_with_retry_after_and_writes_nothing(api, monkeypatch):
    """A rival writes before every attempt of ours, so every attempt meets a new version."""
    monkeypatch.setenv("MAX_ATTEMPTS", "3")
    create(api, state={"n": 0, "by": "creator"})
    rival = DeviceStateManager(api.client, api.table)
    from functions.api import handler as handler_module

    manager = handler_module._manager()
    client = manager.client

    def rival_writes_first(**kwargs):
        params = kwargs.get("params", {})
        version = next((placeholder for placeholder, name in params.get("ExpressionAttributeNames", {}).items()
                        if name == "version"), None)
        # before each version-checked attempt (its condition names the version it expects)
        if params.get("Key", {}).get("deviceId", {}).get("S") == "lamp-1" and version and \
                f"{version} = " in params.get("ConditionExpression", ""):
            rival.replace("lamp-1", {"n": Decimal(-1), "by": "rival"})

    client.meta.events.register("provide-client-params.dynamodb.UpdateItem", rival_writes_first)
    try:
        # copy keeps it read-modify-write (an increment alone compiles to one unconditional-version write)
        result = api("PATCH", "/devices/lamp-1", [{"op": "increment", "path": "/n", "value": 1},
                                                  {"op": "copy", "from": "/n", "path": "/m"}],
                     content_type=JSON_PATCH)
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb.UpdateItem", rival_writes_first)
    assert result.status == 503
    assert result.header("Retry-After") == "1"
    assert state_of(api) == {"n": -1, "by": "rival"}
    assert version_of(api) == 1 + 3  # the rival's three writes only


# ----------------------------------------------------------------- DELETE


def test_delete(api):
    create(api)
    assert api("DELETE", "/devices/lamp-1").status == 204
    assert api("GET", "/devices/lamp-1").status == 404
    assert api("DELETE", "/devices/lamp-1").status == 404


def test_delete_if_match(api):
    create(api)
    api("PATCH", "/devices/lamp-1", {"a": 1})
    stale = api("DELETE", "/devices/lamp-1", headers={"If-Match": '"1"'})
    assert stale.status == 412 and stale.header("ETag") == '"2"'
    assert api("GET", "/devices/lamp-1").status == 200
    assert api("DELETE", "/devices/lamp-1", headers={"If-Match": '"2"'}).status == 204
    assert api("DELETE", "/devices/lamp-1", headers={"If-Match": '"2"'}).status == 404


# ------------------------------------------------------ REQUIRE_IF_MATCH


def test_require_if_match(api, monkeypatch):
    monkeypatch.setenv("REQUIRE_IF_MATCH", "true")
    create(api)
    assert api("PATCH", "/devices/lamp-1", {"a": 1}).status == 428
    assert api("DELETE", "/devices/lamp-1").status == 428
    assert api("PUT", "/devices/lamp-1", {"state": {}}).status == 428
    assert api("PATCH", "/devices/lamp-1", {"a": 1}, headers={"If-None-Match": '"9"'}).status == 428
    assert version_of(api) == 1
    assert api("PUT", "/devices/new", {"state": {}}).status == 201  # creating needs no If-Match
    assert api("PATCH", "/devices/lamp-1", {"a": 1}, headers={"If-Match": '"1"'}).status == 200
    assert api("PUT", "/devices/lamp-1", {"state": {}}, headers={"If-Match": '"2"'}).status == 200
    assert api("DELETE", "/devices/lamp-1", headers={"If-Match": '"3"'}).status == 204


# ------------------------------------------------------------------- list


def test_list_pages_with_an_opaque_cursor(api):
    for index in range(5):
        create(api, f"dev-{index}")
    seen, cursor = [], None
    for _ in range(10):
        path = "/devices?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = api("GET", path)
        assert page.status == 200
        assert len(page.json["items"]) <= 2
        seen += [item["deviceId"] for item in page.json["items"]]
        cursor = page.json["nextCursor"]
        if cursor is None:
            break
    assert sorted(seen) == [f"dev-{i}" for i in range(5)]


@pytest.mark.parametrize("query", ["limit=0", "limit=101", "limit=abc", "limit=-1", "limit=1.5", "limit=",
                                   "cursor=%21%21", "cursor=", "other=1", "limit=1&limit=2", "limit=%D9%A3"])
def test_bad_list_parameters_are_400(api, query):
    assert api("GET", f"/devices?{query}").status == 400


# ------------------------------------------------------------ other routes


def test_unknown_route_is_404_and_wrong_method_is_405(api):
    assert api("GET", "/nothing").status == 404
    assert api("GET", "/devices/a/b").status == 404
    wrong = api("POST", "/devices/lamp-1", {"x": 1})
    assert wrong.status == 405 and wrong.header("Allow") == "DELETE, GET, HEAD, PATCH, PUT"
    assert api("DELETE", "/devices").header("Allow") == "GET, HEAD, POST"


def test_a_fault_is_a_logged_500_problem(api, monkeypatch):
    import io

    from functions.api.observability import logger

    log = io.StringIO()
    monkeypatch.setattr(logger.registered_handler, "stream", log)
    monkeypatch.setenv("TABLE_NAME", "no-such-table")
    from functions.api import handler as handler_module
    from functions.config import api_config as load_config
    from functions.api.handler import lambda_handler
    from localdev.apigw import LambdaContext, make_event

    handler_module._manager.cache_clear()
    load_config.cache_clear()
    response = lambda_handler(make_event("GET", "/devices/x", with_credentials({})), LambdaContext())
    assert response["statusCode"] == 500
    assert header_of(response, "Content-Type") == "application/problem+json"
    assert "ResourceNotFoundException" in log.getvalue()  # the cause is in the log



def test_the_handler_answers_by_the_functions_end_and_leaves_no_deadline_behind(monkeypatch):
    """The handler sets ``answer_by`` from the Lambda's remaining time (less 1 s to answer), under
    which no resend or settle step starts that could still be unanswered then (the library's own
    test: tests/integration/test_faults.py); nothing is left set after the request."""
    import time

    from functions.api import handler
    from functions.device_state.client import LONGEST_SEND_SECONDS
    from functions.device_state.runtime import last_send_start
    from localdev.apigw import LambdaContext, make_event

    seen = []
    monkeypatch.setattr(handler.app, "resolve", lambda event, context: seen.append(last_send_start()) or {})
    handler.lambda_handler(make_event("GET", "/devices/lamp-1", with_credentials({})),
                           LambdaContext(timeout_seconds=10))
    assert seen[0] == pytest.approx(time.monotonic() + 10 - 1 - LONGEST_SEND_SECONDS, abs=1)
    assert last_send_start() is None
