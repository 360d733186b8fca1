"""The Idempotency-Key header through lambda_handler (moto and DynamoDB Local)."""

from __future__ import annotations

import pytest

from functions.device_state import table
from tests.auth import bearer, with_credentials

JSON_PATCH = "application/json-patch+json"
PLUS_ONE = [{"op": "increment", "path": "/n", "value": 1}]


def patch(api, key, body=PLUS_ONE, headers=None):
    return api("PATCH", "/devices/c", body, content_type=JSON_PATCH,
               headers={"Idempotency-Key": key, **(headers or {})})


@pytest.fixture
def device(api):
    assert api("POST", "/devices", {"deviceId": "c", "state": {"n": 0}}).status == 201


def n_and_version(api):
    body = api("GET", "/devices/c").json
    return body["state"]["n"], body["version"]


def test_a_retried_patch_replays_the_first_answer(api, device):
    first = patch(api, "k1")
    again = patch(api, "k1")
    assert first.status == again.status == 200
    assert first.header("Idempotent-Replayed") is None
    assert again.header("Idempotent-Replayed") == "true"
    assert again.text == first.text and again.header("ETag") == first.header("ETag")
    assert n_and_version(api) == (1, 2)


def test_replay_even_after_the_device_changed_and_despite_a_now_stale_if_match(api, device):
    first = patch(api, "k1", headers={"If-Match": '"1"'})
    api("PATCH", "/devices/c", {"n": 50}, content_type="application/merge-patch+json")
    again = patch(api, "k1", headers={"If-Match": '"1"'})
    assert again.status == 200 and again.text == first.text
    assert again.header("Idempotent-Replayed") == "true"
    assert n_and_version(api) == (50, 3)


def test_same_key_with_another_request_is_422(api, device):
    patch(api, "k1")
    other = patch(api, "k1", body=[{"op": "increment", "path": "/n", "value": 5}])
    assert other.status == 422 and "idempotency-key-reused" in other.json["type"]
    assert n_and_version(api) == (1, 2)


@pytest.mark.parametrize("bad", ["", "x" * 256, "\u00e9t\u00e9"])
def test_malformed_keys_are_400(api, device, bad):
    assert patch(api, bad).status == 400
    assert n_and_version(api) == (0, 1)


def test_create_put_and_delete_replay_with_their_status(api):
    created = api("POST", "/devices", {"deviceId": "d", "state": {}}, headers={"Idempotency-Key": "c1"})
    again = api("POST", "/devices", {"deviceId": "d", "state": {}}, headers={"Idempotency-Key": "c1"})
    assert (created.status, again.status) == (201, 201)
    assert again.header("Location") == "/devices/d" and again.header("Idempotent-Replayed") == "true"
    put = api("PUT", "/devices/p", {"state": {"a": 1}}, headers={"Idempotency-Key": "p1"})
    put_again = api("PUT", "/devices/p", {"state": {"a": 1}}, headers={"Idempotency-Key": "p1"})
    assert (put.status, put_again.status) == (201, 201) and put_again.text == put.text
    deleted = api("DELETE", "/devices/d", headers={"Idempotency-Key": "d1"})
    deleted_again = api("DELETE", "/devices/d", headers={"Idempotency-Key": "d1"})
    assert (deleted.status, deleted_again.status) == (204, 204)
    assert deleted_again.header("Idempotent-Replayed") == "true"
    assert api("DELETE", "/devices/d").status == 404  # without the key it is a new request


def test_a_failed_request_records_nothing(api, device):
    guarded = [{"op": "test", "path": "/mode", "value": "on"}, *PLUS_ONE]
    assert patch(api, "k1", body=guarded).status == 409
    api("PATCH", "/devices/c", {"mode": "on"}, content_type="application/merge-patch+json")
    retried = patch(api, "k1", body=guarded)
    assert retried.status == 200 and retried.header("Idempotent-Replayed") is None
    assert n_and_version(api) == (1, 3)


def test_an_expired_record_is_treated_as_new(api, device):
    patch(api, "k1")
    [record] = api.client.query(
        TableName=api.table, KeyConditionExpression="#pk = :device AND begins_with(#sk, :prefix)",
        ExpressionAttributeNames={"#pk": table.PARTITION_KEY, "#sk": table.SORT_KEY},
        ExpressionAttributeValues={":device": {"S": "c"}, ":prefix": {"S": f"{table.IDEMPOTENCY_SK_PREFIX}PATCH."}},
    )["Items"]
    api.client.update_item(
        TableName=api.table,
        Key={table.PARTITION_KEY: {"S": "c"}, table.SORT_KEY: record[table.SORT_KEY]},
        UpdateExpression="SET expiresAt = :past", ExpressionAttributeValues={":past": {"N": "1000"}})
    again = patch(api, "k1")
    assert again.status == 200 and again.header("Idempotent-Replayed") is None
    assert n_and_version(api) == (2, 3)


def test_a_crash_after_the_write_is_answered_by_a_replay(api, device, monkeypatch):
    from functions.api import devices

    real = devices.write_response
    calls = []

    def crash_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the function died after the library returned")
        return real(*args)

    monkeypatch.setattr(devices, "write_response", crash_once)
    from functions.api.handler import lambda_handler
    from localdev.apigw import LambdaContext, make_event
    from functions.device_state.model.values import dumps

    event = make_event("PATCH", "/devices/c", with_credentials({"Content-Type": JSON_PATCH, "Idempotency-Key": "k1"}), dumps(PLUS_ONE))
    assert lambda_handler(event, LambdaContext())["statusCode"] == 500
    retried = patch(api, "k1")
    assert retried.status == 200 and retried.header("Idempotent-Replayed") == "true"
    assert n_and_version(api) == (1, 2)


def test_a_key_changes_no_outcome_for_large_devices_and_transactions(api):
    if not api.client.meta.endpoint_url.startswith("http://127.0.0.1"):
        pytest.skip("moto sizes items larger than DynamoDB does; AWS's sizing is the DynamoDB Local run")
    import base64
    import os

    def blob(size):
        return base64.b64encode(os.urandom(size)).decode()[:size]

    big = {"blob": blob(400 * 1024 - 2048)}
    assert api("POST", "/devices", {"deviceId": "big", "state": {}}).status == 201
    first = api("PUT", "/devices/big", {"state": big}, headers={"Idempotency-Key": "put-big"})
    again = api("PUT", "/devices/big", {"state": big}, headers={"Idempotency-Key": "put-big"})
    assert first.status == again.status == 200, first.text
    assert again.text == first.text and again.header("Idempotent-Replayed") == "true"
    scene = []
    for name in ("t1", "t2", "t3"):
        assert api("POST", "/devices", {"deviceId": name, "state": {}}).status == 201
        scene.append({"deviceId": name, "put": {"state": {"blob": blob(150 * 1024)}}})
    done = api("POST", "/transactions", {"operations": scene}, headers={"Idempotency-Key": "scene"})
    replayed = api("POST", "/transactions", {"operations": scene}, headers={"Idempotency-Key": "scene"})
    assert done.status == replayed.status == 200, done.text
    assert replayed.text == done.text


def test_a_key_is_the_callers_own_and_never_replays_another_callers_answer(api):
    api("POST", "/devices", {"deviceId": "shared", "state": {}})
    body, headers = {"n": 1}, {"Idempotency-Key": "same-key"}

    def report(credentials):
        return api("PATCH", "/devices/shared/reported", body, {**headers, **credentials},
                   content_type="application/merge-patch+json")

    first = report(bearer(device="shared"))
    assert first.status == 200 and first.header("ETag") == '"2"'
    other = report(bearer(["devices.report"]))  # the same key, body and route from another caller
    assert other.status == 200 and other.header("Idempotent-Replayed") is None and other.header("ETag") == '"3"'
    again = report(bearer(device="shared"))  # the control: the first caller's retry is replayed
    assert again.header("Idempotent-Replayed") == "true" and again.header("ETag") == '"2"'


# The same request sent twice with one key, the first landing right after the second first
# looked for the key's record (here: the second's first look is answered as it was just before
# the first landed): refusals the route makes itself (its preconditions checked against the
# device it reads, before the library writes) are answered from the record too.
MERGE = "application/merge-patch+json"
RACED = {
    "PUT with If-Match": ("PUT", "/devices/c", {"state": {"n": 5}}, "application/json", '"1"'),
    "PATCH with two ETags": ("PATCH", "/devices/c", {"n": 5}, MERGE, '"1", "77"'),
    "PUT reported with two ETags": ("PUT", "/devices/c/reported", {"reported": {"n": 5}}, "application/json",
                                    '"1", "50"'),
    "DELETE with two ETags": ("DELETE", "/devices/c", None, "application/json", '"1", "9"'),
}


@pytest.mark.parametrize("case", RACED)
def test_a_request_whose_key_lands_after_it_first_looked_is_answered_from_the_record(api, device, monkeypatch,
                                                                                     case):
    from functions.device_state.write.keyed import RecordedAnswers

    method, path, body, content_type, if_match = RACED[case]

    def send():
        return api(method, path, body, content_type=content_type,
                   headers={"Idempotency-Key": f"raced-{case}", "If-Match": if_match})

    first = send()
    assert first.status in (200, 204) and first.header("Idempotent-Replayed") is None
    original, looks = RecordedAnswers.results, []

    def results(self, partition, key):
        looks.append(original(self, partition, key))
        return None if len(looks) == 1 else looks[-1]

    monkeypatch.setattr(RecordedAnswers, "results", results)
    second = send()
    assert (second.status, second.text) == (first.status, first.text), second.text
    assert second.header("Idempotent-Replayed") == "true"
