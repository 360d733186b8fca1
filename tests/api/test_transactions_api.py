"""POST /transactions through lambda_handler (moto and DynamoDB Local)."""

from __future__ import annotations

import pytest

from functions.device_state import DeviceStateManager


def seed(api, *device_ids, state=None):
    for device_id in device_ids:
        assert api("POST", "/devices", {"deviceId": device_id, "state": state or {"n": 0}}).status == 201


def state_of(api, device_id):
    result = api("GET", f"/devices/{device_id}")
    return result.json["state"] if result.status == 200 else None


def test_a_scene_applies_every_kind_of_operation(api):
    seed(api, "lamp-1", "lamp-2", "old", "thermo")
    result = api("POST", "/transactions", {"operations": [
        {"deviceId": "lamp-1", "mergePatch": {"power": "off"}},
        {"deviceId": "lamp-2", "jsonPatch": [{"op": "increment", "path": "/n", "value": 5}], "ifMatch": '"1"'},
        {"deviceId": "new", "put": {"state": {"fresh": True}}, "ifNoneMatch": "*"},
        {"deviceId": "old", "delete": True},
        {"deviceId": "thermo", "check": True, "ifMatch": '"1"'},
    ]})
    assert result.status == 200, result.text
    devices = result.json["devices"]
    assert [d and d["deviceId"] for d in devices] == ["lamp-1", "lamp-2", "new", None, "thermo"]
    assert devices[0]["state"] == {"n": 0, "power": "off"} and devices[1]["state"] == {"n": 5}
    assert devices[2]["version"] == 1 and devices[4]["version"] == 1
    assert state_of(api, "old") is None and state_of(api, "new") == {"fresh": True}


def test_one_stale_if_match_among_50_is_412_naming_it_and_nothing_changes(api):
    ids = [f"lamp-{index}" for index in range(50)]
    seed(api, *ids)
    api("PATCH", "/devices/lamp-21", {"n": 9}, content_type="application/merge-patch+json")
    result = api("POST", "/transactions", {"operations": [
        {"deviceId": device_id, "mergePatch": {"power": "off"}, "ifMatch": '"1"'} for device_id in ids]})
    assert result.status == 412
    assert result.json["operations"] == [{"index": 21, "deviceId": "lamp-21", "status": 412, "reason": "version",
                                          "detail": result.json["operations"][0]["detail"], "currentVersion": 2}]
    assert all("power" not in state_of(api, device_id) for device_id in ids)


def test_different_failures_are_409_with_each_operation_listed(api):
    seed(api, "exists", "counter")
    result = api("POST", "/transactions", {"operations": [
        {"deviceId": "missing", "mergePatch": {"a": 1}},
        {"deviceId": "exists", "put": {"state": {}}, "ifNoneMatch": "*"},
        {"deviceId": "counter", "jsonPatch": [{"op": "remove", "path": "/nope"}]},
    ]})
    assert result.status == 409
    assert [(o["index"], o["status"]) for o in result.json["operations"]] == [(0, 404), (1, 409), (2, 422)]
    assert state_of(api, "counter") == {"n": 0}


@pytest.mark.parametrize("operations, status", [
    ([{"deviceId": "ghost", "delete": True}], 404),
    ([{"deviceId": "a", "jsonPatch": [{"op": "test", "path": "/n", "value": 7}]}], 409),
    ([{"deviceId": "a", "jsonPatch": [{"op": "increment", "path": "/missing/x", "value": 1}]}], 422),
])
def test_single_failure_statuses(api, operations, status):
    seed(api, "a")
    assert api("POST", "/transactions", {"operations": operations}).status == status
    assert state_of(api, "a") == {"n": 0}


@pytest.mark.parametrize("body", [
    {},
    {"operations": []},
    {"operations": {}},
    {"operations": [{"deviceId": "a"}]},
    {"operations": [{"deviceId": "a", "delete": True, "check": True}]},
    {"operations": [{"deviceId": "a", "delete": False}]},
    {"operations": [{"deviceId": "a b", "delete": True}]},
    {"operations": [{"deviceId": "a", "delete": True, "ifMatch": "3"}]},
    {"operations": [{"deviceId": "a", "delete": True, "ifMatch": 'W/"3"'}]},
    {"operations": [{"deviceId": "a", "put": {"state": {}}, "ifNoneMatch": '"3"'}]},
    {"operations": [{"deviceId": "a", "delete": True, "ifNoneMatch": "*"}]},
    {"operations": [{"deviceId": "a", "jsonPatch": [{"op": "bogus", "path": "/x"}]}]},
    {"operations": [{"deviceId": "a", "mergePatch": [1]}]},
    {"operations": [{"deviceId": "a", "put": {"state": []}}]},
    {"operations": [{"deviceId": "a", "delete": True}, {"deviceId": "a", "check": True}]},
    {"operations": [{"deviceId": f"d{index}", "delete": True} for index in range(101)]},
    {"operations": [{"deviceId": "a", "delete": True}], "extra": 1},
])
def test_malformed_transactions_are_400_and_write_nothing(api, body):
    seed(api, "a")
    assert api("POST", "/transactions", body).status == 400
    assert state_of(api, "a") == {"n": 0}


def test_an_oversized_item_in_a_transaction_is_413(api):
    result = api("POST", "/transactions", {"operations": [
        {"deviceId": "small", "put": {"state": {}}},
        {"deviceId": "big", "put": {"state": {"blob": "x" * 500_000}}}]})
    assert result.status == 413
    assert api("GET", "/devices").json["items"] == []


def test_a_retried_transaction_with_its_key_applies_once(api):
    seed(api, "a", "b")
    body = {"operations": [{"deviceId": "a", "jsonPatch": [{"op": "increment", "path": "/n", "value": -1}]},
                           {"deviceId": "b", "jsonPatch": [{"op": "increment", "path": "/n", "value": 1}]}]}
    first = api("POST", "/transactions", body, headers={"Idempotency-Key": "move-1"})
    again = api("POST", "/transactions", body, headers={"Idempotency-Key": "move-1"})
    assert first.status == again.status == 200 and first.text == again.text
    assert again.header("Idempotent-Replayed") == "true"
    assert (state_of(api, "a"), state_of(api, "b")) == ({"n": -1}, {"n": 1})
    other = api("POST", "/transactions", {"operations": body["operations"][:1]}, headers={"Idempotency-Key": "move-1"})
    assert other.status == 422


def test_endless_contention_is_503_with_retry_after(api, monkeypatch):
    monkeypatch.setenv("MAX_ATTEMPTS", "2")
    seed(api, "a", "b")
    from functions.api import handler

    rival = DeviceStateManager(api.client, api.table)
    client = handler._manager().client

    def rival_first(params, **kwargs):
        rival.replace("a", {"n": 42})

    client.meta.events.register("provide-client-params.dynamodb.TransactWriteItems", rival_first)
    try:
        result = api("POST", "/transactions", {"operations": [{"deviceId": "a", "mergePatch": {"x": 1}},
                                                              {"deviceId": "b", "mergePatch": {"x": 1}}]})
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb.TransactWriteItems", rival_first)
    assert result.status == 503 and result.header("Retry-After") == "1"
    assert state_of(api, "b") == {"n": 0}
