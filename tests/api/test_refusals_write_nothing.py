"""A refusal means nothing was written: every request is parsed and checked whole (query,
headers, body) before its first DynamoDB request, on every write route; one rule for
unknown parameters, ``since`` and preconditions on every read (moto and DynamoDB Local)."""

from __future__ import annotations

import time

import pytest

from functions.api.openapi import OPENAPI

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# (method, path, body, content type, status when it applies) of every write route of a device.
WRITES = [
    ("POST", "/devices", {"deviceId": "new-1", "state": {"n": 1}}, "application/json", 201),
    ("PUT", "/devices/lamp-1", {"state": {"n": 5}}, "application/json", 200),
    ("PATCH", "/devices/lamp-1", [{"op": "increment", "path": "/n", "value": 1}], JSON_PATCH, 200),
    ("PATCH", "/devices/lamp-1/desired", {"n": 2}, MERGE, 200),
    ("PATCH", "/devices/lamp-1/reported", {"n": 3}, MERGE, 200),
    ("PUT", "/devices/lamp-1/desired", {"desired": {"n": 4}}, "application/json", 200),
    ("PUT", "/devices/lamp-1/reported", {"reported": {"n": 4}}, "application/json", 200),
    ("DELETE", "/devices/lamp-1", None, "application/json", 204),
    ("POST", "/transactions", {"operations": [{"deviceId": "lamp-1", "mergePatch": {"n": 9}}]},
     "application/json", 200),
]
BAD_QUERIES = ["include=bogus", "inclde=metadata", "expiresIn=0", "include=metadata&include=metadata",
               "include="]


def _setup(api):
    assert api("POST", "/devices", {"deviceId": "lamp-1", "state": {"n": 0}}).status == 201


def _snapshot(api):
    listed = api("GET", "/devices?limit=100").json["items"]
    return sorted((device["deviceId"], device["version"]) for device in listed)


# The request is refused before any DynamoDB request, so one engine shows it; the idempotency
# record a refusal must not leave is the same item on both (the later tests run on both).
@pytest.mark.parametrize("engine", ["moto"], indirect=True)
@pytest.mark.parametrize("bad", BAD_QUERIES)
@pytest.mark.parametrize("method, path, body, content_type, applied", WRITES,
                         ids=[f"{w[0]} {w[1]}" for w in WRITES])
def test_a_bad_query_on_a_write_is_400_and_writes_and_records_nothing(api, method, path, body, content_type,
                                                                      applied, bad):
    _setup(api)
    before = _snapshot(api)
    key = {"Idempotency-Key": f"k-{method}-{path}"}
    refused = api(method, f"{path}?{bad}", body, headers=key, content_type=content_type)
    assert refused.status == 400, refused.text
    assert _snapshot(api) == before
    again = api(method, f"{path}?{bad}", body, headers=key, content_type=content_type)
    assert again.status == 400 and again.header("Idempotent-Replayed") is None
    done = api(method, path, body, headers=key, content_type=content_type)
    assert done.status == applied, done.text
    assert done.header("Idempotent-Replayed") is None  # nothing was recorded under the key by the refusals


@pytest.mark.parametrize("method, path, body, content_type, applied", WRITES,
                         ids=[f"{w[0]} {w[1]}" for w in WRITES])
def test_a_bad_header_or_body_on_a_write_is_400_and_writes_nothing(api, method, path, body, content_type, applied):
    _setup(api)
    before = _snapshot(api)
    for headers in ({"Lease-Token": "not-a-token"}, {"If-Match": "3"}, {"Idempotency-Key": ["a", "b"]}):
        if not set(headers) <= _documented_headers(method, path):
            continue
        refused = api(method, path, body, headers=headers, content_type=content_type)
        assert refused.status == 400, (headers, refused.text)
    if body is not None:
        assert api(method, path, raw='{"x": ', content_type=content_type).status == 400
    assert _snapshot(api) == before


def _documented_headers(method: str, path: str) -> set[str]:
    template = path.replace("lamp-1", "{deviceId}")
    item = OPENAPI["paths"][template]
    parameters = item.get("parameters", []) + item[method.lower()].get("parameters", [])
    return {parameter["name"] for parameter in parameters if parameter["in"] == "header"}


# (method, path, body, headers) that a route does not take: each a 400 that changes nothing.
NOT_TAKEN = [
    ("POST", "/devices", {"deviceId": "pd1", "state": {}}, {"Lease-Token": "0" * 32}),
    ("POST", "/devices", {"deviceId": "pd1", "state": {}}, {"If-Match": '"1"'}),
    ("POST", "/transactions", {"operations": [{"deviceId": "lamp-1", "mergePatch": {"n": 9}}]}, {"If-Match": '"1"'}),
    ("POST", "/transactions", {"operations": [{"deviceId": "lamp-1", "mergePatch": {"n": 9}}]},
     {"Lease-Token": "0" * 32}),
    ("POST", "/devices/lamp-1/leases", {"ttlSeconds": 30}, {"Idempotency-Key": "k"}),
    ("DELETE", "/devices/lamp-1", {"x": 1}, {}),
    ("DELETE", "/devices/lamp-1", None, {"Content-Type": ["application/json", "text/plain"]}),
]


@pytest.mark.parametrize("method, path, body, headers", NOT_TAKEN)
def test_a_header_or_body_a_route_does_not_take_is_400_and_changes_nothing(api, method, path, body, headers):
    _setup(api)
    before = _snapshot(api)
    refused = api(method, path, body, headers=headers)
    assert refused.status == 400, refused.text
    assert _snapshot(api) == before
    assert api("GET", "/devices/lamp-1/leases").json["holder"] is None


def test_repeated_if_match_lines_are_one_list_as_rfc_9110_combines_them(api):
    _setup(api)
    for lines in (['"1"', '"2"'], ['"2"', '"1"']):  # either order: the list holds "1"
        assert api("GET", "/devices/lamp-1", headers={"If-Match": lines}).status == 200
    assert api("GET", "/devices/lamp-1", headers={"If-Match": ["garbage", '"1"']}).status == 400
    written = api("PATCH", "/devices/lamp-1", {"n": 1}, headers={"If-Match": ['"7"', '"1"']}, content_type=MERGE)
    assert written.status == 200 and written.json["version"] == 2


# ------------------------------------------------------------ row 13: op not a string


@pytest.mark.parametrize("op", [{}, [], 1, None, True])
def test_a_json_patch_op_that_is_not_a_string_is_400(api, op):
    operations = [{"op": op, "path": "/0", "value": 0}]
    for device in ("lamp-1", "missing"):
        result = api("PATCH", f"/devices/{device}", operations, content_type=JSON_PATCH)
        assert result.status == 400 and "'op' must be one of" in result.json["detail"]
    result = api("POST", "/transactions", {"operations": [{"deviceId": "lamp-1", "jsonPatch": operations}]})
    assert result.status == 400 and "'op' must be one of" in result.json["detail"]


# ------------------------------------------------------------ row 10: one rule for since and If-Match


def test_delta_since_past_the_current_version_is_400_as_the_feed_is(api):
    _setup(api)
    delta = api("GET", "/devices/lamp-1/delta?since=7&waitSeconds=1")
    changes = api("GET", "/devices/lamp-1/changes?since=7")
    assert changes.status == 400
    assert delta.status == 400 and "past the device's current version" in delta.json["detail"]
    assert api("GET", "/devices/lamp-1/delta?since=1").status == 200


def test_delta_honours_if_match_as_the_device_read_does(api):
    _setup(api)
    assert api("GET", "/devices/lamp-1", headers={"If-Match": '"9"'}).status == 412
    refused = api("GET", "/devices/lamp-1/delta", headers={"If-Match": '"9"'})
    assert refused.status == 412 and refused.json["currentVersion"] == 1
    assert api("GET", "/devices/lamp-1/delta", headers={"If-Match": '"1"'}).status == 200
    for query in ("waitSeconds=3", "since=1&waitSeconds=3"):  # known false at once: answered before any wait
        started = time.monotonic()
        assert api("GET", f"/devices/lamp-1/delta?{query}", headers={"If-Match": '"9"'}).status == 412
        assert time.monotonic() - started < 2


# ------------------------------------------------------------ row 11: transactions


def test_a_transaction_includes_metadata_when_asked(api):
    _setup(api)
    body = {"operations": [{"deviceId": "lamp-1", "mergePatch": {"n": 1}, "section": "desired"}]}
    plain = api("POST", "/transactions", body)
    assert plain.status == 200 and "metadata" not in plain.json["devices"][0]
    shown = api("POST", "/transactions?include=metadata", body).json["devices"][0]
    assert shown["metadata"]["desired"]["n"]["version"] == 3


def test_a_failed_transaction_says_each_thing_once_with_the_current_version(api):
    _setup(api)
    body = {"operations": [{"deviceId": "lamp-1", "jsonPatch": [{"op": "test", "path": "/n", "value": 5}]}]}
    result = api("POST", "/transactions", body)
    assert result.status == 409
    operation = result.json["operations"][0]
    assert operation["currentVersion"] == 1
    for text in (result.json["detail"], operation["detail"]):
        assert text.count("operation 0") <= 1 and text.count("lamp-1") <= 1, text
    assert "expected 5, found 0" in operation["detail"]
    missing = api("POST", "/transactions", {"operations": [{"deviceId": "lamp-1", "mergePatch": {"n": 1}},
                                                           {"deviceId": "gone", "check": True}]})
    assert missing.status == 404 and missing.json["operations"][0]["currentVersion"] is None


# ------------------------------------------------------------ row 7: a version just written


def test_a_version_is_shown_right_after_the_write_that_made_it(api):
    _setup(api)
    for expected in range(2, 7):
        written = api("PATCH", "/devices/lamp-1", {"n": expected}, content_type=MERGE)
        assert written.status == 200 and written.json["version"] == expected
        shown = api("GET", f"/devices/lamp-1/versions/{expected}?include=metadata")
        assert shown.status == 200, shown.text
        assert shown.json["version"] == expected and shown.json["state"] == {"n": expected}
        assert shown.json == written.json | {"metadata": shown.json["metadata"]}
    assert api("GET", "/devices/lamp-1/versions/7").status == 404


def test_an_older_version_the_history_has_not_recorded_yet_is_503_with_retry_after(api, monkeypatch):
    """No stream processor runs behind this fixture, so the history trails every write."""
    _setup(api)
    api("PATCH", "/devices/lamp-1", {"n": 1}, content_type=MERGE)
    behind = api("GET", "/devices/lamp-1/versions/1")
    assert behind.status == 503 and behind.json["type"].endswith("not-yet-recorded")
    assert behind.header("Retry-After") == "1"
    assert api("GET", "/devices/lamp-1/versions/3").status == 404  # never written


@pytest.mark.parametrize("entry", [{"ifNoneMatch": "*", "put": {"state": {}}}, {"put": {"state": {}}}])
def test_a_transaction_creating_a_device_under_a_lease_token_no_lease_backs_is_409_at_once(api, entry):
    """Found by the OpenAPI fuzzer: the fence's refusal of a create was retried as contention (503 after 5 s)."""
    body = {"operations": [{"deviceId": "unleased", "leaseToken": "0" * 32, **entry}]}
    refused = api("POST", "/transactions", body)
    assert refused.status == 409, refused.text
    assert refused.json["operations"][0]["reason"] == "lease-not-held"
    assert api("GET", "/devices/unleased").status == 404
