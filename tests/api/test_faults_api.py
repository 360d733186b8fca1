"""The fault table of the issue "Faults never double-apply or misreport a write", row by
row over the real handler: DynamoDB's answer to the write is lost after it landed (a
forwarder in front of DynamoDB Local drops it), sometimes with another client's write
in between. Every answer is the truth and every change applies once."""

from __future__ import annotations

import pytest

from functions.device_state import DeviceStateManager, JsonPatch, MergePatch
from localdev.faults import Forwarder

pytestmark = pytest.mark.dynamodb_local

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


@pytest.fixture
def engine(local_table):
    return local_table


@pytest.fixture
def forwarder(dynamodb_local):
    forwarder = Forwarder(dynamodb_local.port)
    yield forwarder
    forwarder.close()


@pytest.fixture
def dynamodb_local_endpoint_for(forwarder, monkeypatch):
    monkeypatch.setenv("SETTLE_SECONDS", "2")
    return lambda client: forwarder.endpoint  # the handler talks to DynamoDB through the forwarder


@pytest.fixture
def other(local_table):
    return DeviceStateManager(*local_table)  # another client, straight to DynamoDB


def create(api, state):
    assert api("POST", "/devices", {"deviceId": "d", "state": state}).status == 201


def test_increment_with_another_write_before_the_resend_applies_once(api, forwarder, other):
    create(api, {"n": 0})
    forwarder.lose("UpdateItem", then=lambda: other.update_with_retry(
        "d", JsonPatch([{"op": "increment", "path": "/n", "value": 1}])))
    result = api("PATCH", "/devices/d", [{"op": "increment", "path": "/n", "value": 1}], content_type=JSON_PATCH)
    assert result.status == 200 and forwarder.lost == ["UpdateItem"]
    assert other.get("d").state == {"n": 2} and other.get("d").version == 3


def test_an_append_with_another_writer_between_is_stored_once(api, forwarder, other):
    create(api, {"log": []})
    forwarder.lose("UpdateItem", then=lambda: other.update_with_retry(
        "d", JsonPatch([{"op": "add", "path": "/log/-", "value": "other"}])))
    result = api("PATCH", "/devices/d", [{"op": "add", "path": "/log/-", "value": "once"}], content_type=JSON_PATCH)
    assert result.status == 200 and result.json["state"] == {"log": ["once"]}
    assert other.get("d").state == {"log": ["once", "other"]}


def test_a_put_without_if_match_never_undoes_a_later_acknowledged_patch(api, forwarder, other):
    create(api, {"a": 0})
    forwarder.lose("UpdateItem", then=lambda: other.update_with_retry("d", MergePatch({"b": 1})))
    result = api("PUT", "/devices/d", {"state": {"a": "put"}})
    assert result.status == 200 and result.json["version"] == 2
    assert other.get("d").state == {"a": "put", "b": 1} and other.get("d").version == 3


def test_a_delete_with_if_match_never_deletes_a_device_created_again(api, forwarder, other):
    create(api, {"n": 0})
    forwarder.lose("UpdateItem", then=lambda: other.create("d", {"again": True}))
    assert api("DELETE", "/devices/d", headers={"If-Match": '"1"'}).status == 204
    again = api("GET", "/devices/d")
    assert again.status == 200 and again.json["state"] == {"again": True} and again.json["version"] == 3


def test_a_put_with_if_match_that_landed_is_200_not_412(api, forwarder):
    create(api, {"a": 0})
    forwarder.lose("UpdateItem")
    result = api("PUT", "/devices/d", {"state": {"a": 1}}, headers={"If-Match": '"1"'})
    assert result.status == 200 and result.header("ETag") == '"2"'


def test_a_patch_with_if_match_that_landed_is_200_not_412(api, forwarder, other):
    create(api, {"a": 0})
    forwarder.lose("UpdateItem", then=lambda: other.update_with_retry("d", MergePatch({"b": 1})))
    result = api("PATCH", "/devices/d", {"a": 1}, headers={"If-Match": '"1"'}, content_type=MERGE_PATCH)
    assert result.status == 200 and result.json["version"] == 2
    assert other.get("d").state == {"a": 1, "b": 1}


def test_a_create_that_landed_is_201_not_409(api, forwarder):
    forwarder.lose("UpdateItem")
    result = api("POST", "/devices", {"deviceId": "d", "state": {"n": 0}})
    assert result.status == 201 and result.json["version"] == 1


def test_a_delete_that_landed_is_204_not_404(api, forwarder):
    create(api, {"n": 0})
    forwarder.lose("UpdateItem")
    assert api("DELETE", "/devices/d").status == 204
    assert api("GET", "/devices/d").status == 404


def test_an_outcome_that_cannot_be_settled_is_504_outcome_unknown(api, forwarder, other):
    create(api, {"n": 0})
    forwarder.lose("UpdateItem", then=lambda: setattr(forwarder, "unreachable", True))
    result = api("PATCH", "/devices/d", {"n": 1}, content_type=MERGE_PATCH)
    assert result.status == 504
    assert result.json["type"].endswith(":outcome-unknown") and "Idempotency-Key" in result.json["detail"]
    assert "127.0.0.1" not in result.text  # no internal addresses
    forwarder.unreachable = False
    assert other.get("d").state == {"n": 1} and other.get("d").version == 2  # it did apply, once
