"""Every section write verb under a lost DynamoDB answer (the forwarder lets the write land
and drops its answer), with and without another writer landing in between: each applies
exactly once and answers truthfully. A naive compiled report (a botocore resend with no
journal) applies twice in the same harness."""

from __future__ import annotations

import boto3
import pytest
from botocore.config import Config

from functions.device_state import Ack, DesireOptions, IdempotencyKey, JsonPatch, MergePatch, table
from functions.device_state.item.room import MAX_STATE_ITEM_BYTES
from tests.integration.test_faults import Rig

pytestmark = pytest.mark.dynamodb_local

BETWEEN = pytest.mark.parametrize("between", [False, True], ids=["alone", "another-writer-between"])
REPORT_TICK = JsonPatch([{"op": "increment", "path": "/ticks", "value": 1}])


@pytest.fixture
def rig(dynamodb_local, local_table):
    rig = Rig(dynamodb_local, *local_table)
    yield rig
    rig.forwarder.close()


def other_report(rig, device_id):
    return lambda: rig.other.update_with_retry(device_id, MergePatch({"other": True}), section="reported")


def naive_client(rig):
    """A client through the forwarder that sends a write again when its answer is lost, as
    botocore does, with no journal to tell the second copy from a new write."""
    return boto3.session.Session().client(
        "dynamodb", endpoint_url=rig.forwarder.endpoint, region_name="us-east-1",
        config=Config(retries={"mode": "standard", "max_attempts": 3}, read_timeout=3))


def sections(rig, device_id):
    device = rig.other.get(device_id)
    return device.version, device.desired, device.reported


@BETWEEN
def test_a_compiled_report_applies_once_with_its_metadata(rig, between):
    rig.other.create("d", {}, sections={"reported": {"ticks": 0}})
    rig.forwarder.lose("UpdateItem", then=other_report(rig, "d") if between else None)
    device = rig.manager.update_with_retry("d", REPORT_TICK, section="reported")
    assert rig.forwarder.lost == ["UpdateItem"] and device.reported["ticks"] == 1
    version, _, reported = sections(rig, "d")
    assert reported["ticks"] == 1 and version == 2 + between
    metadata = rig.other.get("d").as_dict(include_metadata=True)["metadata"]["reported"]
    assert metadata["ticks"]["version"] == 2


@BETWEEN
def test_a_read_modify_write_desired_patch_applies_once(rig, between):
    rig.other.create("d", {}, sections={"desired": {"log": []}})
    append = JsonPatch([{"op": "add", "path": "/log/-", "value": "once"}])
    rig.forwarder.lose("UpdateItem", then=other_report(rig, "d") if between else None)
    device = rig.manager.update_with_retry("d", append, section="desired")
    assert device.desired == {"log": ["once"]}
    version, desired, _ = sections(rig, "d")
    assert desired == {"log": ["once"]} and version == 2 + between


@BETWEEN
def test_a_section_patch_with_if_match_that_landed_is_no_412(rig, between):
    rig.other.create("d", {})
    rig.forwarder.lose("UpdateItem", then=other_report(rig, "d") if between else None)
    device = rig.manager.update("d", MergePatch({"power": "on"}), expected_version=1, section="desired")
    assert device.version == 2 and device.desired == {"power": "on"}
    assert sections(rig, "d")[0] == 2 + between


@BETWEEN
@pytest.mark.parametrize("expected", [None, 1], ids=["no-version", "if-match"])
def test_a_section_replace_applies_once(rig, between, expected):
    rig.other.create("d", {}, sections={"desired": {"a": 0}})
    rig.forwarder.lose("UpdateItem", then=other_report(rig, "d") if between else None)
    device = rig.manager.replace_section("d", "desired", {"a": 1}, expected)
    assert device.version == 2 and device.desired == {"a": 1}
    version, desired, reported = sections(rig, "d")
    assert (version, desired, reported) == (2 + between, {"a": 1}, {"other": True} if between else {})


@BETWEEN
def test_a_create_with_sections_that_landed_is_no_409(rig, between):
    rig.forwarder.lose("UpdateItem", then=other_report(rig, "d") if between else None)
    device = rig.manager.create("d", {}, sections={"desired": {"a": 1}})
    assert device.version == 1 and device.desired == {"a": 1}
    assert sections(rig, "d")[:2] == (1 + between, {"a": 1})


@BETWEEN
def test_a_keyed_section_write_applies_once(rig, between):
    rig.other.create("d", {}, sections={"reported": {"ticks": 0}})
    key = IdempotencyKey("k", scope="PATCH", fingerprint="f")
    rig.forwarder.lose("TransactWriteItems", then=other_report(rig, "d") if between else None)
    device = rig.manager.update_with_retry("d", REPORT_TICK, section="reported", idempotency=key)
    assert device.reported["ticks"] == 1
    assert sections(rig, "d")[2]["ticks"] == 1


@BETWEEN
def test_a_compiled_report_that_removes_a_leaf_applies_once_and_takes_its_entry(rig, between):
    rig.other.create("d", {}, sections={"reported": {"gone": 1, "kept": 2}})
    rig.forwarder.lose("UpdateItem", then=other_report(rig, "d") if between else None)
    device = rig.manager.update_with_retry("d", MergePatch({"gone": None}), section="reported")
    assert rig.forwarder.lost == ["UpdateItem"] and "gone" not in device.reported
    version, _, reported = sections(rig, "d")
    assert version == 2 + between and reported == {"kept": 2, **({"other": True} if between else {})}
    assert set(rig.other.get("d").entries["reported"]) == {"/kept", *(["/other"] if between else [])}


def test_control_a_naive_compiled_removal_applies_twice_in_the_same_harness(rig):
    rig.other.create("d", {}, sections={"reported": {"gone": 1, "kept": 2}})
    naive = naive_client(rig)
    rig.forwarder.lose("UpdateItem")
    naive.update_item(TableName=rig.name, Key=table.state_key("d"),
                      UpdateExpression="REMOVE reported.gone, metaReported.#gone SET version = version + :one",
                      ExpressionAttributeNames={"#gone": "/gone"}, ExpressionAttributeValues={":one": {"N": "1"}})
    assert sections(rig, "d")[0] == 3  # one removal, two versions


def test_control_a_naive_compiled_report_applies_twice_in_the_same_harness(rig):
    rig.other.create("d", {}, sections={"reported": {"ticks": 0}})
    naive = naive_client(rig)
    rig.forwarder.lose("UpdateItem")
    naive.update_item(TableName=rig.name, Key=table.state_key("d"),
                      UpdateExpression="SET reported.ticks = reported.ticks + :one, version = version + :one",
                      ExpressionAttributeValues={":one": {"N": "1"}})
    assert sections(rig, "d")[2]["ticks"] == 2  # one report, applied twice


# ----------------------------------------------------- the desire lifecycle (desires.py)


@BETWEEN
def test_an_ack_applies_once_and_answers_success(rig, between):
    rig.other.create("d", {}, sections={"desired": {"brightness": 150}})
    rig.forwarder.lose("UpdateItem", then=other_report(rig, "d") if between else None)
    device = rig.manager.acknowledge("d", [Ack("/brightness", 1, 400, "out of range")])
    assert rig.forwarder.lost == ["UpdateItem"] and device.version == 2 and device.delta() == {}
    shown = rig.other.get("d")
    assert shown.version == 2 + between and shown.delta() == {}
    assert shown.as_dict(include_metadata=True)["metadata"]["desired"]["brightness"]["ack"]["code"] == 400


@BETWEEN
def test_a_desire_with_options_applies_once(rig, between):
    rig.other.create("d", {})
    rig.forwarder.lose("UpdateItem", then=other_report(rig, "d") if between else None)
    device = rig.manager.update_with_retry("d", MergePatch({"power": "on"}), section="desired",
                                           desire=DesireOptions(expires_in=60, clear_on_confirm=True))
    assert device.version == 2
    shown = rig.other.get("d").as_dict(include_metadata=True)
    assert shown["version"] == 2 + between
    assert {"expiresAt", "clearOnConfirm"} <= set(shown["metadata"]["desired"]["power"])


@BETWEEN
def test_a_report_that_clears_a_desire_applies_once(rig, between):
    rig.other.create("d", {})
    rig.other.update_with_retry("d", MergePatch({"power": "on"}), section="desired",
                                desire=DesireOptions(clear_on_confirm=True))
    # the compiled report is refused (a desire may be cleared): the read-modify-write that follows loses its answer
    rig.forwarder.lose("UpdateItem", when=lambda body: b"statusDesired" in body,
                       then=other_report(rig, "d") if between else None)
    device = rig.manager.update_with_retry("d", MergePatch({"power": "on"}), section="reported")
    assert rig.forwarder.lost == ["UpdateItem"] and device.desired == {} and device.version == 3
    shown = rig.other.get("d")
    assert (shown.version, shown.desired, shown.reported["power"]) == (3 + between, {}, "on")


def test_control_a_naive_ack_that_landed_is_answered_as_refused(rig):
    """A naive ack (read, then write at the version read, resent by botocore on a lost answer)
    applies and then reports a conflict: its second copy finds the version it moved itself."""
    rig.other.create("d", {}, sections={"desired": {"brightness": 150}})
    naive = naive_client(rig)
    rig.forwarder.lose("UpdateItem")
    with pytest.raises(naive.exceptions.ConditionalCheckFailedException):
        naive.update_item(TableName=rig.name, Key=table.state_key("d"),
                          UpdateExpression="SET statusDesired = :status, version = version + :one",
                          ConditionExpression="version = :read",
                          ExpressionAttributeValues={":one": {"N": "1"}, ":read": {"N": "1"}, ":status": {"M": {
                              "/brightness": {"M": {"v": {"N": "1"}, "a": {"N": "400"}, "t": {"N": "1"}}}}}})
    assert rig.other.get("d").delta() == {}  # refused, says the client; applied, says the device


NAMES = ("a" * 1023, "b" * 1023, "c" * 1023, "d" * 1023)
LONG = {NAMES[0]: {NAMES[1]: {NAMES[2]: {NAMES[3]: 1}}}}  # a leaf of the longest pointer, 4,096 bytes


def item_bytes(rig, device_id) -> int:
    item = rig.client.get_item(TableName=rig.name, Key=table.state_key(device_id), ConsistentRead=True)["Item"]
    return int(item[table.ITEM_BYTES]["N"])


@BETWEEN
def test_a_desire_that_takes_the_room_of_a_kept_confirmation_applies_once(rig, between):
    rig.other.create("d", {})
    rig.other.update_with_retry("d", MergePatch(LONG), section="desired", desire=DesireOptions(clear_on_confirm=True))
    rig.other.update_with_retry("d", MergePatch(LONG), section="reported")  # clears it: its confirmation is kept
    rig.other.replace("d", {"blob": ""})
    rig.other.replace("d", {"blob": "z" * (MAX_STATE_ITEM_BYTES - item_bytes(rig, "d") - 1024)})
    before = rig.other.get("d")
    assert before.desired == {} and set(before.entries["status"]) == {"/" + "/".join(NAMES)}
    # 2 KB more: it fits only in the confirmation's room, which it takes in the write that loses its answer
    rig.forwarder.lose("UpdateItem", then=other_report(rig, "d") if between else None)
    device = rig.manager.update_with_retry("d", MergePatch({"w": "w" * 2048}), section="desired",
                                           desire=DesireOptions(expires_in=60))
    assert rig.forwarder.lost == ["UpdateItem"] and device.desired == {"w": "w" * 2048}
    after = rig.other.get("d")
    assert after.version == before.version + 1 + between and after.desired == {"w": "w" * 2048}
    assert set(after.entries["status"]) == {"/w"}
