"""The stated limits through the real lambda_handler on DynamoDB Local: each is checked
before anything is written and answered 4xx naming it; a write that fits is never
refused (a key or a compiled patch included); errors speak the client's terms."""

from __future__ import annotations

import base64
import json
import functools
import os
import time

import boto3
import pytest

from functions.changes.events import LogPublisher
from functions.changes.handler import process
from functions.device_state.feed.log import ChangeLog
from localdev.stream import StreamPoller

from functions.api import common
from functions.api.common import fits_in_an_answer
from functions.api.transactions import answer, replays_fit
from functions.device_state import MAX_EXPIRY_SECONDS, DeviceStateManager, Operation, dumps
from functions.device_state.model.values import MAX_MEMBER_NAME_BYTES, MAX_PATCH_OPERATIONS
from functions.device_state.item.room import MAX_STATE_ITEM_BYTES

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@pytest.fixture
def engine(local_table):
    """DynamoDB Local only: these limits are the real engine's."""
    return local_table


@pytest.fixture
def stream_processor(local_table, dynamodb_local):
    """The change feed's processor on the table's stream, as `make serve` runs it."""
    client, name = local_table
    streams = boto3.client("dynamodbstreams", endpoint_url=dynamodb_local.endpoint, region_name="us-east-1")
    poller = StreamPoller(streams, client, name,
                          functools.partial(process, log=ChangeLog(client, name), events=LogPublisher())).start()
    yield poller
    poller.stop()


def create(api, state, device_id="lim"):
    result = api("POST", "/devices", {"deviceId": device_id, "state": state})
    assert result.status == 201, result.text
    return result


def incompressible(size: int) -> str:
    """Text of ``size`` characters that zlib cannot shrink much (as real payloads often are)."""
    return base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size]


# ------------------------------------------------------------ member names (row 1)


@pytest.mark.parametrize("size", [MAX_MEMBER_NAME_BYTES + 1, 50_001])
@pytest.mark.parametrize("content_type", [MERGE, JSON_PATCH])
def test_a_member_name_past_the_limit_is_refused_by_a_patch_and_nothing_changes(api, size, content_type):
    create(api, {"n": 1})
    name = "k" * size
    body = {name: 1} if content_type == MERGE else [{"op": "add", "path": f"/{name}", "value": 1}]
    result = api("PATCH", "/devices/lim", body, content_type=content_type)
    assert result.status == 400 and result.json["limit"] == "member-name", result.text
    assert str(MAX_MEMBER_NAME_BYTES) in result.json["detail"]
    after = api("GET", "/devices/lim")
    assert after.status == 200 and after.json["version"] == 1
    assert api("DELETE", "/devices/lim").status == 204


@pytest.mark.parametrize("size", [MAX_MEMBER_NAME_BYTES + 1, 50_001])
def test_a_member_name_past_the_limit_is_refused_by_every_write(api, size):
    state = {"nested": {"k" * size: True}}
    assert api("POST", "/devices", {"deviceId": "p", "state": state}).json["limit"] == "member-name"
    assert api("PUT", "/devices/p", {"state": state}, headers={"Idempotency-Key": "k1"}).json["limit"] == "member-name"
    result = api("POST", "/transactions", {"operations": [{"deviceId": "p", "put": {"state": state}}]},
                 headers={"Idempotency-Key": "k2"})
    assert result.status == 400 and result.json["limit"] == "member-name"
    assert api("GET", "/devices/p").status == 404


def test_a_transaction_refused_for_a_member_name_names_the_operation(api):
    long_name = "k" * (MAX_MEMBER_NAME_BYTES + 1)
    assert api("POST", "/devices", {"deviceId": "t0", "state": {"n": 0}}).status == 201
    for operation in ({"deviceId": "t1", "put": {"state": {long_name: 1}}},
                      {"deviceId": "t1", "jsonPatch": [{"op": "add", "path": "/" + long_name, "value": 1}]}):
        result = api("POST", "/transactions", {"operations": [{"deviceId": "t0", "mergePatch": {"n": 1}}, operation]})
        assert result.status == 400 and result.json["limit"] == "member-name"
        assert "operation" in result.json["detail"] and "1" in result.json["detail"].split(":")[0], result.json
    assert api("GET", "/devices/t0").json["state"] == {"n": 0}


def test_a_member_name_at_the_limit_is_stored_read_and_patched(api):
    name = "é" * (MAX_MEMBER_NAME_BYTES // 2)  # 2 bytes each: exactly the limit
    create(api, {name: 1})
    patched = api("PATCH", "/devices/lim", [{"op": "increment", "path": f"/{name}", "value": 1}],
                  content_type=JSON_PATCH)
    assert patched.status == 200 and patched.json["state"] == {name: 2}
    assert api("GET", "/devices/lim").json["state"] == {name: 2}


def test_a_patch_with_more_members_than_the_limit_is_refused(api):
    create(api, {})
    too_many = {f"m{index}": index for index in range(MAX_PATCH_OPERATIONS + 1)}
    result = api("PATCH", "/devices/lim", too_many, content_type=MERGE)
    assert result.status == 400 and result.json["limit"] == "patch-members"
    operations = [{"op": "add", "path": f"/m{index}", "value": index} for index in range(MAX_PATCH_OPERATIONS + 1)]
    result = api("PATCH", "/devices/lim", operations, content_type=JSON_PATCH)
    assert result.status == 400 and result.json["limit"] == "patch-members"
    assert api("GET", "/devices/lim").json["version"] == 1


# -------------------------------------------- compiled patches that DynamoDB refuses (row 4)


@pytest.mark.parametrize("body, content_type", [
    ([{"op": "increment", "path": f"/c{index}", "value": 1, "min": 0, "max": 1000} for index in range(20)], JSON_PATCH),
    ([{"op": "increment", "path": f"/c{index}", "value": 1} for index in range(40)], JSON_PATCH),
    ({f"member{index}": index for index in range(200)}, MERGE),
    ({f"member{index}": index for index in range(MAX_PATCH_OPERATIONS)}, MERGE),
])
def test_a_patch_whose_compiled_form_dynamodb_refuses_is_applied_by_read_modify_write(api, body, content_type):
    create(api, {})
    result = api("PATCH", "/devices/lim", body, content_type=content_type)
    assert result.status == 200, result.text
    assert result.json["version"] == 2 and len(result.json["state"]) == len(body)


# ------------------------------------------------- the item size, change record included (row 3)


@pytest.mark.table_stream
def test_a_state_write_that_leaves_no_room_is_413_and_one_that_fits_is_not(api, stream_processor):
    state = {"blob": incompressible(MAX_STATE_ITEM_BYTES - 600)}
    create(api, state)
    grown = api("PATCH", "/devices/lim", {"more": "m" * 2000}, content_type=MERGE)
    assert grown.status == 413 and grown.json["limit"] == "item-size", grown.text
    assert str(MAX_STATE_ITEM_BYTES) in grown.json["detail"] and "exceeded" not in grown.json["detail"]
    assert api("GET", "/devices/lim").json["version"] == 1
    lease = api("POST", "/devices/lim/leases", {"ttlSeconds": 5})
    assert lease.status == 201, lease.text
    token = lease.json["leaseToken"]
    # Writes of the same size fit, however they are sent.
    same = {"blob": incompressible(len(state["blob"]))}
    headers = {"Lease-Token": token}
    assert api("PUT", "/devices/lim", {"state": same}, headers={**headers, "If-Match": '"1"'}).status == 200
    assert api("PUT", "/devices/lim", {"state": same}, headers={**headers, "Idempotency-Key": "same-1"}).status == 200
    result = api("POST", "/transactions", {"operations": [{"deviceId": "lim", "put": {"state": same},
                                                           "leaseToken": token}]},
                 headers={"Idempotency-Key": "same-2"})
    assert result.status == 200, result.text
    assert api("PATCH", "/devices/lim", {"n": 1}, content_type=MERGE, headers=headers).status == 200
    assert api("GET", "/devices/lim").json["version"] == 5
    # Every version the device reached is in the feed and in history, the largest too.
    for version in range(1, 6):
        page = api("GET", f"/devices/lim/changes?since={version - 1}&limit=1&waitSeconds=15")
        assert [change["version"] for change in page.json["changes"]] == [version]
    assert api("GET", "/devices/lim/versions/4").json["state"] == same
    assert api("GET", "/devices/lim/versions/5").json["state"] == {**same, "n": 1}


@pytest.mark.parametrize("section", ["desired", "reported"])
@pytest.mark.parametrize("how", ["merge", "json-patch", "put"])
def test_a_member_name_past_the_limit_is_refused_by_a_section_write_and_nothing_changes(api, section, how):
    create(api, {"n": 1})
    assert api("PATCH", f"/devices/lim/{section}", {"kept": 1}, content_type=MERGE).status == 200
    name = "k" * (MAX_MEMBER_NAME_BYTES + 1)
    if how == "merge":
        result = api("PATCH", f"/devices/lim/{section}", {"a": {name: 1}}, content_type=MERGE)
    elif how == "json-patch":
        result = api("PATCH", f"/devices/lim/{section}", [{"op": "add", "path": f"/{name}", "value": 1}],
                     content_type=JSON_PATCH)
    else:
        result = api("PUT", f"/devices/lim/{section}", {section: {"a": {name: 1}}})
    assert result.status == 400 and result.json["limit"] == "member-name", result.text
    after = api("GET", "/devices/lim")
    assert after.json["version"] == 2 and after.json[section] == {"kept": 1}


@pytest.mark.table_stream
def test_a_section_write_that_leaves_no_room_is_413_and_one_that_fits_is_not(api, stream_processor):
    state = {"blob": incompressible(MAX_STATE_ITEM_BYTES - 600)}
    create(api, state)
    refused = [
        api("PATCH", "/devices/lim/desired", {"more": "m" * 2000}, content_type=MERGE),  # compiled, read-free
        api("PATCH", "/devices/lim/reported", [{"op": "add", "path": "/more", "value": "m" * 2000}],
            content_type=JSON_PATCH),
        api("PUT", "/devices/lim/reported", {"reported": {"more": "m" * 2000}}, headers={"If-Match": '"1"'}),
        api("POST", "/transactions", {"operations": [{"deviceId": "lim", "section": "desired",
                                                      "mergePatch": {"more": "m" * 2000}}]}),
    ]
    for result in refused:
        assert result.status == 413 and result.json["limit"] == "item-size", result.text
    assert api("GET", "/devices/lim").json["version"] == 1
    # A small report fits beside the large state, metadata included, and its change is recorded.
    fits = api("PATCH", "/devices/lim/reported", {"power": "on"}, content_type=MERGE)
    assert fits.status == 200 and fits.json["version"] == 2, fits.text
    page = api("GET", "/devices/lim/changes?since=1&waitSeconds=15")
    assert [change["sections"] for change in page.json["changes"]] == [["reported"]]
    assert api("GET", "/devices/lim/versions/2").json["reported"] == {"power": "on"}


# ------------------------------------------------ keys never turn a fitting write into 413 (row 5)


def test_a_keyed_transaction_of_seven_large_devices_applies_and_replays_the_same_answer(api):
    for index in range(7):
        create(api, {"blob": incompressible(350_000)}, device_id=f"big{index}")
    # odd devices get a desired patch: the replay (read back at the recorded versions) shows it too
    body = {"operations": [{"deviceId": f"big{index}", "mergePatch": {"n": index},
                            **({"section": "desired"} if index % 2 else {})} for index in range(7)]}
    first = api("POST", "/transactions", body, headers={"Idempotency-Key": "seven"})
    assert first.status == 200, first.text
    again = api("POST", "/transactions", body, headers={"Idempotency-Key": "seven"})
    assert again.status == 200 and again.header("Idempotent-Replayed") == "true"
    assert again.json == first.json
    assert [device["version"] for device in first.json["devices"]] == [2] * 7
    assert [device["desired"] for device in again.json["devices"]] == [{} if index % 2 == 0 else {"n": index}
                                                                        for index in range(7)]
    assert again.json["devices"][1]["delta"] == {"n": 1}


@pytest.mark.table_stream
def test_a_keyed_transaction_of_99_checks_applies_and_replays(api, stream_processor):
    """The replay reads c00's state at the checked version back from the feed's history."""
    ids = [f"c{index:02d}" for index in range(99)]
    states = {}
    for device_id in ids:
        states[device_id] = {"blob": incompressible(5_000)}
        create(api, states[device_id], device_id=device_id)
    body = {"operations": [{"deviceId": device_id, "check": True} for device_id in ids]}
    first = api("POST", "/transactions", body, headers={"Idempotency-Key": "checks"})
    assert first.status == 200, first.text
    api("PATCH", "/devices/c00", {"moved": True}, content_type=MERGE)  # the replay shows the answer, not now
    again = api("POST", "/transactions", body, headers={"Idempotency-Key": "checks"})
    assert again.status == 200 and again.json == first.json
    assert again.json["devices"][0]["state"] == states["c00"]


# ------------------------------------------------- a transaction's answer fits in Lambda's 6 MB


def large_devices(api, count: int) -> list[str]:
    ids = [f"large{index:02d}" for index in range(count)]
    for device_id in ids:
        create(api, {"blob": incompressible(340_000)}, device_id=device_id)
    return ids


def test_a_transaction_whose_answer_would_pass_lambdas_limit_is_413_before_anything_is_written(api):
    """A patch beside 19 checks of 340 KB devices: the answer would be 6.8 MB, past what a Lambda
    may answer (the invocation would fail, the HTTP API answer 500, the patch applied)."""
    ids = large_devices(api, 20)
    body = {"operations": [{"deviceId": ids[0], "mergePatch": {"n": 1}},
                           *({"deviceId": device_id, "check": True} for device_id in ids[1:])]}
    refused = api("POST", "/transactions", body, headers={"Idempotency-Key": "too-large"})
    assert refused.status == 413 and refused.json["limit"] == "answer-size", refused.text
    assert api("GET", f"/devices/{ids[0]}").json["version"] == 1  # nothing written
    # fewer checks fit: the same patch applies, its answer within the limit, metadata and all
    fewer = {"operations": body["operations"][:10]}
    applied = api("POST", "/transactions?include=metadata", fewer, headers={"Idempotency-Key": "fits"})
    assert applied.status == 200 and applied.json["devices"][0]["version"] == 2
    assert fits_in_an_answer(applied.json)


def test_enrollments_at_their_largest_list_a_page_at_a_time_each_within_lambdas_answer(api):
    """49 enrollments whose initial documents are 32,700 quotes each (64 KB as JSON, the most
    taken) made GET /enrollments answer 13 MB: past Lambda's 6 MB, a 500 for good. Pages hold them."""
    quotes = {"state": {"note": '"' * 32_700}}
    for number in range(49):
        created = api("POST", "/enrollments", {"enrollmentId": f"e{number:02d}", "idPattern": "m-[0-9]+",
                                               "maxDevices": 1, "initial": quotes})
        assert created.status == 201, created.text
    seen, cursor, pages = [], None, 0
    while True:
        page = api("GET", "/enrollments" + (f"?cursor={cursor}" if cursor else ""))
        assert page.status == 200 and fits_in_an_answer(page.json), page.status
        seen += [enrollment["enrollmentId"] for enrollment in page.json["items"]]
        pages, cursor = pages + 1, page.json["nextCursor"]
        if cursor is None:
            break
    assert seen == [f"e{number:02d}" for number in range(49)] and pages > 1
    assert not fits_in_an_answer({"items": [page.json["items"][0]] * 49, "nextCursor": None})  # the control
    small = api("GET", "/enrollments?limit=3")
    assert [enrollment["enrollmentId"] for enrollment in small.json["items"]] == ["e00", "e01", "e02"]
    assert api("GET", "/enrollments?cursor=forged").json["type"].endswith(":invalid-cursor")


def test_a_transaction_is_held_to_its_answer_at_its_largest_whenever_a_replay_shows_it(api, monkeypatch):
    """As a desire expires, its leaf's metadata says so while the delta loses it: 200 small leaves
    expiring in 100 s grow the answer, a large leaf expiring in 1,000 s shrinks it. Between the
    two the answer is larger than at either end, and a replay under the key may come then (a limit
    cut to the larger end's size stands for Lambda's 6 MB)."""
    assert api("POST", "/devices", {"deviceId": "e", "state": {}}).status == 201
    small = {f"a{number:03d}": 0 for number in range(200)}
    assert api("PUT", "/devices/e/desired?expiresIn=100", {"desired": small}).status == 200
    assert api("PATCH", "/devices/e/desired?expiresIn=1000", {"large": "x" * 2000}, content_type=MERGE).status == 200
    operations = [Operation.check("e")]
    devices = [DeviceStateManager(api.client, api.table).get("e")]
    now = time.time()

    def escaped(at: float) -> int:
        return len(json.dumps(dumps(answer(operations, devices, True, at)), ensure_ascii=False).encode())

    ends = max(escaped(now), escaped(now + MAX_EXPIRY_SECONDS + 1))
    assert escaped(now + 500) > ends  # small ones expired, the large one not yet
    monkeypatch.setattr(common, "LAMBDA_ANSWER_BYTES", ends + common.ANSWER_ENVELOPE_BYTES)
    assert fits_in_an_answer(answer(operations, devices, True, now))  # as it applies: it fits
    assert not replays_fit(operations, devices)  # at its largest it would not: refused before it is written


def test_control_the_same_transaction_unbounded_applies_with_an_answer_past_lambdas_limit(api):
    """What the bound prevents: the library unbounded applies the patch, and its answer is past
    what the route could send, so the caller would be told 500 of a write that applied."""
    ids = large_devices(api, 20)
    operations = [Operation.update(ids[0], lambda state: {**state, "n": 1}),
                  *(Operation.check(device_id) for device_id in ids[1:])]
    devices = DeviceStateManager(api.client, api.table).transact(operations)
    assert devices[0].version == 2
    assert not fits_in_an_answer(answer(operations, devices, metadata=False))


# ------------------------------------------------------------------ clean errors (row 7)


def test_add_under_a_number_says_where_in_the_clients_terms(api):
    create(api, {"n": 5})
    result = api("PATCH", "/devices/lim", [{"op": "add", "path": "/n/x", "value": 1}], content_type=JSON_PATCH)
    assert result.status == 422
    assert result.json["detail"] == "operation 0 (add /n/x): /n holds a number, not an object or array"


def test_a_failed_test_says_expected_and_found_as_json(api):
    create(api, {"n": 5, "cfg": {"mode": "eco"}})
    result = api("PATCH", "/devices/lim", [{"op": "test", "path": "/cfg/mode", "value": "on"},
                                           {"op": "replace", "path": "/n", "value": 6}], content_type=JSON_PATCH)
    assert result.status == 409
    assert result.json["detail"] == 'operation 0 (test /cfg/mode): expected "on", found "eco"'
    result = api("PATCH", "/devices/lim", [{"op": "test", "path": "", "value": {}}], content_type=JSON_PATCH)
    assert "Decimal" not in result.json["detail"] and "'" not in result.json["detail"]


def test_a_repeated_idempotency_key_header_is_400(api):
    create(api, {"n": 1})
    result = api("PATCH", "/devices/lim", {"n": 2}, content_type=MERGE, headers={"Idempotency-Key": ["a", "b"]})
    assert result.status == 400 and "Idempotency-Key" in result.json["detail"]
    assert api("GET", "/devices/lim").json["version"] == 1


def test_a_repeated_content_type_header_is_400_not_the_last_copy_silently(api):
    create(api, {"n": 1})
    result = api("PATCH", "/devices/lim", [{"op": "replace", "path": "/n", "value": 2}],
                 headers={"Content-Type": [MERGE, JSON_PATCH]})
    assert result.status == 400 and "Content-Type" in result.json["detail"], result.text
    assert api("GET", "/devices/lim").json["version"] == 1


def test_versions_and_since_take_percent_encoded_digits_and_leading_zeros(api):
    create(api, {"n": 1})
    item = api.client.get_item(TableName=api.table, Key={"deviceId": {"S": "lim"}, "sk": {"S": "state"}})["Item"]
    ChangeLog(api.client, api.table).record(None, item)  # version 1's change, as the processor writes it
    assert api("GET", "/devices/lim/versions/%31").json["version"] == 1
    assert api("GET", "/devices/lim/versions/0001").json["version"] == 1
    page = api("GET", "/devices/lim/changes?since=00000000000000000000")
    assert page.status == 200 and [change["version"] for change in page.json["changes"]] == [1]
    assert api("GET", "/devices/lim/changes?since=00000000000000000001").json == {"changes": [], "nextSince": 1}


def test_the_openapi_document_states_every_limit(api):
    document = api("GET", "/openapi.json").json
    assert document["info"]["x-limits"] == {
        "memberNameBytes": MAX_MEMBER_NAME_BYTES, "stateDepth": 31, "patchMembers": MAX_PATCH_OPERATIONS,
        "stateItemBytes": MAX_STATE_ITEM_BYTES, "bodyBytes": 1024 * 1024, "transactionOperations": 100,
        "leafPointerBytes": 4096, "metadataEntryBytes": 19, "statusEntryBytes": 53, "confirmationEntryBytes": 30,
        "keptConfirmations": 100, "keptConfirmationBytes": 8192}
    for limit in ("member-name", "nesting-depth", "patch-members", "item-size", "leaf-pointer"):
        assert limit in document["info"]["description"]


# ----------------------------------------- the largest accepted state, written again (issue 27, row 8)


def largest_accepted_blob() -> int:
    """The longest string ``{"blob": ...}`` a create is planned with (the planner is pure)."""
    from functions.device_state.errors import ItemTooLarge
    from functions.device_state.item.fencing import Fence
    from functions.device_state.write.planner import Planner

    low, high = 1, MAX_STATE_ITEM_BYTES
    while low < high:
        middle = (low + high + 1) // 2
        try:
            Planner("t", Fence(), 1_800_000_000.0).create("lim", {"blob": "x" * middle}, None)
            low = middle
        except ItemTooLarge:
            high = middle - 1
    return low


def test_a_device_created_at_the_largest_accepted_state_takes_an_equal_size_state_again(api):
    size = largest_accepted_blob()
    assert api("POST", "/devices", {"deviceId": "lim", "state": {"blob": "x" * (size + 1)}}).status == 413
    create(api, {"blob": "x" * size})
    for version, letter in enumerate("yzw", start=2):
        replaced = api("PUT", "/devices/lim", {"state": {"blob": letter * size}}, headers={"If-Match": f'"{version - 1}"'})
        assert replaced.status == 200 and replaced.json["version"] == version, replaced.text
    patched = api("PATCH", "/devices/lim", {"blob": "v" * size}, content_type=MERGE)
    assert patched.status == 200 and patched.json["version"] == 5, patched.text
    reported = api("PATCH", "/devices/lim/reported", {"power": "on"}, content_type=MERGE)
    assert reported.status == 413 and reported.json["limit"] == "item-size"  # the item is full


# ------------------------------------ a leaf pointer longer than its metadata key may be (issue 27, row 5)


def slashes_document(levels: int) -> dict:
    """``levels`` nested members, each named by 1,024 slashes (2,048 bytes escaped in a pointer)."""
    document = {"/" * 1024: 1}
    for _ in range(levels - 1):
        document = {"/" * 1024: document}
    return document


@pytest.mark.parametrize("section", ["desired", "reported"])
def test_a_leaf_whose_pointer_cannot_key_its_metadata_is_400_at_once_and_nothing_changes(api, section):
    from functions.device_state.model.sections import MAX_POINTER_BYTES

    create(api, {"n": 1})
    deep = slashes_document(25)  # a ~51 KB pointer: DynamoDB Local fails such a map key (InternalFailure)
    started = time.monotonic()
    for result in (api("PUT", f"/devices/lim/{section}", {section: deep}),
                   api("PATCH", f"/devices/lim/{section}", deep, content_type=MERGE),
                   api("PATCH", f"/devices/lim/{section}", slashes_document(3), content_type=MERGE),
                   api("POST", "/transactions", {"operations": [{"deviceId": "lim", "section": section,
                                                                 "mergePatch": deep}]})):
        assert result.status == 400 and result.json["limit"] == "leaf-pointer", result.text
        assert str(MAX_POINTER_BYTES) in result.json["detail"]
    assert time.monotonic() - started < 5  # no settle-and-retry rounds
    assert api("GET", "/devices/lim").json["version"] == 1
    assert api("PATCH", f"/devices/lim/{section}", slashes_document(1), content_type=MERGE).status == 200
    assert api("PUT", "/devices/lim", {"state": deep}).status == 200  # state keeps no metadata


@pytest.mark.parametrize("section", ["desired", "reported"])
def test_an_object_added_at_a_member_counts_its_leaves_full_pointers_on_every_path(api, section):
    """Found by a hostile review: a read-free JSON Patch add checked only its own path, so an
    object whose leaves' full pointers pass the limit was stored and could never be written again."""
    name = "a" * 1023
    create(api, {"n": 1})
    assert api("PUT", f"/devices/lim/{section}", {section: {"o": {}}}).status == 200
    patch = [{"op": "add", "path": f"/o/{name}", "value": {name: {name: {name: 1}}}}]  # a 4,098-byte leaf pointer
    version = api("GET", "/devices/lim").json["version"]
    for result in (api("PATCH", f"/devices/lim/{section}", patch, content_type="application/json-patch+json"),
                   api("POST", "/transactions", {"operations": [{"deviceId": "lim", "section": section,
                                                                 "jsonPatch": patch}]})):
        assert result.status == 400 and result.json["limit"] == "leaf-pointer", result.text
    assert api("GET", "/devices/lim").json["version"] == version
    fits = [{"op": "add", "path": f"/o/{name}", "value": {name: {name: {"b": 1}}}}]
    assert api("PATCH", f"/devices/lim/{section}", fits, content_type="application/json-patch+json").status == 200
    stored = api("GET", "/devices/lim").json[section]
    assert api("PUT", f"/devices/lim/{section}", {section: stored}).status == 200  # accepted, so writable again


# -------------------------------------------- metadata's share of the item, as stated (issue 27, row 3)


def test_reported_leaves_fit_exactly_as_the_stated_metadata_cost_says(api):
    from functions.device_state.model.sections import METADATA_ENTRY_BYTES

    def document(leaves):  # one-level leaves: "/k00000" pointers, each value a 1-digit number
        return {f"k{index:05d}": 1 for index in range(leaves)}

    create(api, {})
    empty = int(api.client.get_item(TableName=api.table, Key={"deviceId": {"S": "lim"}, "sk": {"S": "state"}},
                                    ConsistentRead=True)["Item"]["itemBytes"]["N"])
    per_leaf = (1 + len("k00000") + 4) + (len("/k00000") + METADATA_ENTRY_BYTES)  # member + metadata entry
    most = (MAX_STATE_ITEM_BYTES - empty) // per_leaf
    for device_id, leaves, status in (("fit", most, 201), ("big", most + 1, 413)):  # ids as long as "lim"
        result = api("POST", "/devices", {"deviceId": device_id, "state": {}, "reported": document(leaves)})
        assert result.status == status, (leaves, result.text)
    assert api("POST", "/devices", {"deviceId": "as-state", "state": document(most + 1)}).status == 201
