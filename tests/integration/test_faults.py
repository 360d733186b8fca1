"""Every write verb resolves its own outcome when DynamoDB's answer is lost: a forwarder
in front of DynamoDB Local lets the write land and drops its answer, with and without
another writer landing in between. Each scenario applies the change exactly once and
answers truthfully; naive controls (a botocore resend plus a last-writer write-id guard,
as the service did before) fail in the same harness."""

from __future__ import annotations

import time
import uuid

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ReadTimeoutError

from functions.device_state import (
    SECRET,
    CredentialRecord,
    DeviceNotFound,
    DeviceStateManager,
    Enrollment,
    EnrollmentExists,
    IdempotencyKey,
    JsonPatch,
    LeaseLost,
    MergePatch,
    Operation,
    OutcomeUnknown,
    StorageUnavailable,
    VersionConflict,
)
from functions.device_state.client import dynamodb_client
from functions.device_state.model.times import epoch_of
from functions.device_state.item.contention import MARK_AFTER_SECONDS
from functions.device_state import table
from functions.device_state.item.journal import (JOURNAL_KEEP, JOURNAL_KEEP_SECONDS, JOURNAL_MAX, SETTLED_KEEP_SECONDS,
                                                 SIGNED_KEEP_SECONDS, WriteId, journal, trimmed_stamp)
from functions.device_state.write.store import IDEMPOTENT, Store
from functions.push.subscriptions import SUBSCRIPTION_SK_PREFIX, Subscriptions
from localdev.faults import Forwarder
from tests.helpers import Clock

pytestmark = pytest.mark.dynamodb_local

INCREMENT = JsonPatch([{"op": "increment", "path": "/n", "value": 1}])


class Rig:
    def __init__(self, dynamodb_local, client, name):
        self.forwarder = Forwarder(dynamodb_local.port)
        self.client, self.name = client, name
        self.manager = DeviceStateManager(dynamodb_client(self.forwarder.endpoint, "us-east-1"), name,
                                          settle_seconds=2)
        self.other = DeviceStateManager(client, name)  # another client, straight to DynamoDB

    def state(self, device_id):
        return self.other.get(device_id).state

    def version(self, device_id):
        return self.other.get(device_id).version


@pytest.fixture
def rig(dynamodb_local, local_table):
    rig = Rig(dynamodb_local, *local_table)
    yield rig
    rig.forwarder.close()


BETWEEN = pytest.mark.parametrize("between", [False, True], ids=["alone", "another-writer-between"])


def other_patch(rig, device_id, patch=None):
    return lambda: rig.other.update_with_retry(device_id, MergePatch(patch or {"other": True}))


@BETWEEN
def test_a_compiled_increment_applies_once(rig, between):
    rig.other.create("d", {"n": 0})
    rig.forwarder.lose("UpdateItem", then=(lambda: rig.other.update_with_retry("d", INCREMENT)) if between else None)
    device = rig.manager.update_with_retry("d", INCREMENT)
    assert rig.forwarder.lost == ["UpdateItem"]
    assert rig.state("d")["n"] == 1 + between and rig.version("d") == 2 + between
    assert device.state["n"] >= 1


@BETWEEN
def test_a_read_modify_write_append_applies_once(rig, between):
    rig.other.create("d", {"log": []})
    append = JsonPatch([{"op": "add", "path": "/log/-", "value": "once"}])  # does not compile: read-modify-write
    other = JsonPatch([{"op": "add", "path": "/log/-", "value": "other"}])
    rig.forwarder.lose("UpdateItem", then=(lambda: rig.other.update_with_retry("d", other)) if between else None)
    device = rig.manager.update_with_retry("d", append)
    assert device.state == {"log": ["once"]} and device.version == 2
    assert rig.state("d")["log"] == ["once", "other"][: 1 + between]


@BETWEEN
def test_a_read_modify_write_that_marks_the_device_after_a_long_race_applies_once(rig, between):
    rig.other.create("d", {"n": 0})
    calls = []

    def bump(state):
        calls.append(1)
        if len(calls) == 1:  # another writer moves the device on: the race runs past MARK_AFTER_SECONDS
            time.sleep(MARK_AFTER_SECONDS + 0.1)
            rig.other.update_with_retry("d", MergePatch({"other": 1}))
        return {**state, "n": state["n"] + 1}
    rig.forwarder.lose("UpdateItem", when=lambda body: table.RACED_UNTIL.encode() in body,
                       then=other_patch(rig, "d") if between else None)
    device = rig.manager.update_with_retry("d", bump)
    assert rig.forwarder.lost == ["UpdateItem"] and len(calls) == 2
    assert device.state["n"] == 1 and rig.state("d")["n"] == 1 and rig.version("d") == 3 + between
    item = rig.client.get_item(TableName=rig.name, Key=table.state_key("d"), ConsistentRead=True)["Item"]
    assert (table.RACED_UNTIL in item) is not between  # the writer between is a compiled patch: it clears it


@BETWEEN
def test_a_put_without_if_match_applies_once_and_undoes_no_later_write(rig, between):
    rig.other.create("d", {"a": 0})
    rig.forwarder.lose("UpdateItem", then=other_patch(rig, "d") if between else None)
    device, created = rig.manager.put("d", {"a": "put"})
    assert not created and device.version == 2 and device.state == {"a": "put"}
    assert rig.state("d") == ({"a": "put", "other": True} if between else {"a": "put"})
    assert rig.version("d") == 2 + between


@BETWEEN
def test_a_put_that_creates_applies_once(rig, between):
    rig.forwarder.lose("UpdateItem", then=other_patch(rig, "d") if between else None)
    device, created = rig.manager.put("d", {"a": "put"})
    assert created and device.version == 1
    assert rig.version("d") == 1 + between


def test_a_compiled_increment_whose_answer_is_lost_and_whose_device_is_deleted_since_answers_its_version(rig):
    """Its state at that version is nowhere to read: its own version, an empty state and
    timestamps a client can parse (they were empty strings)."""
    rig.other.create("d", {"n": 0})
    rig.forwarder.lose("UpdateItem", then=lambda: rig.other.delete("d"))
    device = rig.manager.update_with_retry("d", INCREMENT)
    assert device.version == 2 and device.state == {}
    assert epoch_of(device.created_at) == epoch_of(device.updated_at) > 0


def test_a_put_whose_device_is_deleted_before_its_replace_lands_creates_it(rig):
    """PUT is create or replace: it planned a replace of the device it read, another writer
    deleted the device before the replace landed, and the PUT plans again and creates it (it
    answered 404 device-not-found, which a PUT never may)."""
    rig.other.create("d", {"a": 0})
    rig.forwarder.before("UpdateItem", lambda: rig.other.delete("d"))
    device, created = rig.manager.put("d", {"a": "put"})
    assert created and device.state == {"a": "put"}
    assert rig.state("d") == {"a": "put"}


def test_a_transactions_put_whose_device_is_deleted_before_it_lands_creates_it(rig):
    rig.other.create("d", {"a": 0})
    rig.other.create("e", {"n": 0})
    rig.forwarder.before("TransactWriteItems", lambda: rig.other.delete("d"))
    devices = rig.manager.transact([Operation.put("d", {"a": "put"}), Operation.update("e", INCREMENT)])
    assert devices[0].state == {"a": "put"} and rig.state("d") == {"a": "put"} and rig.state("e") == {"n": 1}


def test_control_a_plain_replace_whose_device_is_deleted_before_it_lands_is_404(rig):
    """The same race under a replace without a version, which has no create to fall back on:
    what the PUT answered before it planned again."""
    rig.other.create("d", {"a": 0})
    rig.forwarder.before("UpdateItem", lambda: rig.other.delete("d"))
    with pytest.raises(DeviceNotFound):
        rig.manager.replace("d", {"a": "put"})


@BETWEEN
def test_a_replace_with_if_match_that_landed_is_no_412(rig, between):
    rig.other.create("d", {"a": 0})
    rig.forwarder.lose("UpdateItem", then=other_patch(rig, "d") if between else None)
    device = rig.manager.replace("d", {"a": 1}, expected_version=1)
    assert device.version == 2 and device.state == {"a": 1}
    assert rig.version("d") == 2 + between


@BETWEEN
def test_a_replace_without_a_version_applies_once(rig, between):
    rig.other.create("d", {"a": 0})
    rig.forwarder.lose("UpdateItem", then=other_patch(rig, "d") if between else None)
    assert rig.manager.replace("d", {"a": 1}).version == 2
    assert rig.state("d") == ({"a": 1, "other": True} if between else {"a": 1})


@BETWEEN
def test_an_update_with_if_match_that_landed_is_no_412(rig, between):
    rig.other.create("d", {"n": 0})
    rig.forwarder.lose("UpdateItem", then=other_patch(rig, "d") if between else None)
    device = rig.manager.update("d", MergePatch({"n": 5}), expected_version=1)
    assert device.version == 2 and device.state == {"n": 5}
    assert rig.version("d") == 2 + between


@BETWEEN
def test_a_create_that_landed_is_no_409(rig, between):
    rig.forwarder.lose("UpdateItem", then=other_patch(rig, "d") if between else None)
    device = rig.manager.create("d", {"n": 0})
    assert device.version == 1
    assert rig.version("d") == 1 + between


@BETWEEN
def test_a_delete_that_landed_is_no_404(rig, between):
    rig.other.create("d", {"n": 0})
    rig.forwarder.lose("UpdateItem", then=(lambda: rig.other.create("d", {"again": True})) if between else None)
    deleted = rig.manager.delete("d")
    assert deleted.version == 1 and deleted.state == {"n": 0}
    if between:  # the device created again meanwhile is untouched
        assert rig.other.get("d").state == {"again": True} and rig.version("d") == 3


def test_a_delete_with_if_match_never_deletes_a_device_created_again_before_its_resend(rig):
    rig.other.create("d", {"n": 0})
    rig.forwarder.lose("UpdateItem", then=lambda: rig.other.create("d", {"again": True}))
    assert rig.manager.delete("d", expected_version=1).version == 1  # 204: it did delete version 1
    assert rig.other.get("d").state == {"again": True}  # version 3, never matched by the stale "1"


@BETWEEN
def test_a_transaction_whose_answer_is_lost_applies_once(rig, between):
    rig.other.create("a", {"n": 0})
    rig.other.create("b", {"n": 0})
    rig.forwarder.lose("TransactWriteItems",
                       then=(lambda: rig.other.update_with_retry("a", INCREMENT)) if between else None)
    devices = rig.manager.transact([Operation.update("a", INCREMENT), Operation.update("b", INCREMENT)])
    assert [d.version for d in devices] == [2, 2]
    assert rig.state("a")["n"] == 1 + between and rig.state("b")["n"] == 1


@BETWEEN
def test_a_keyed_write_whose_answer_is_lost_applies_once(rig, between):
    rig.other.create("d", {"n": 0})
    rig.forwarder.lose("TransactWriteItems",
                       then=(lambda: rig.other.update_with_retry("d", INCREMENT)) if between else None)
    key = IdempotencyKey(uuid.uuid4().hex, "PATCH", "f")
    assert rig.manager.update_with_retry("d", INCREMENT, idempotency=key).version == 2
    assert rig.state("d")["n"] == 1 + between


def test_a_keyed_write_whose_every_send_is_lost_is_settled_through_its_journal_entry(rig):
    rig.other.create("d", {"n": 0})
    rig.forwarder.lose("TransactWriteItems", times=3)  # lands, and the answers of all three sends are lost
    key = IdempotencyKey(uuid.uuid4().hex, "PATCH", "f")
    assert rig.manager.update_with_retry("d", INCREMENT, idempotency=key).version == 2
    assert rig.state("d")["n"] == 1 and rig.manager.recorded("d", key)[0].version == 2


def test_a_transaction_whose_every_send_is_lost_is_settled_through_its_journal_entries(rig):
    rig.other.create("a", {"n": 0})
    rig.other.create("b", {"n": 0})
    rig.forwarder.lose("TransactWriteItems", times=3)
    devices = rig.manager.transact([Operation.update("a", INCREMENT), Operation.update("b", INCREMENT)])
    assert [d.version for d in devices] == [2, 2]
    assert rig.state("a")["n"] == 1 and rig.state("b")["n"] == 1


def test_a_transaction_whose_every_send_never_arrived_is_settled_and_applied_once(rig):
    rig.other.create("a", {"n": 0})
    rig.forwarder.lose("TransactWriteItems", land=False, times=3)
    devices = rig.manager.transact([Operation.update("a", INCREMENT)])
    assert [d.version for d in devices] == [2] and rig.state("a")["n"] == 1


@pytest.mark.parametrize("verb", ["increment", "append", "create", "delete"])
def test_a_write_that_never_reached_dynamodb_is_settled_and_applied_once(rig, verb):
    if verb != "create":
        rig.other.create("d", {"n": 0, "log": []})
    rig.forwarder.lose("UpdateItem", land=False)
    if verb == "increment":
        rig.manager.update_with_retry("d", INCREMENT)
        assert rig.state("d")["n"] == 1
    elif verb == "append":
        rig.manager.update_with_retry("d", JsonPatch([{"op": "add", "path": "/log/-", "value": "x"}]))
        assert rig.state("d")["log"] == ["x"]
    elif verb == "create":
        assert rig.manager.create("d", {"n": 0}).version == 1
    else:
        rig.manager.delete("d")
        assert rig.other.live_state("d") is None
    assert rig.forwarder.lost == ["UpdateItem"]


def test_when_dynamodb_stays_unreachable_the_outcome_is_unknown_and_applied_at_most_once(rig):
    rig.other.create("d", {"n": 0})
    rig.forwarder.lose("UpdateItem", then=lambda: setattr(rig.forwarder, "unreachable", True))
    with pytest.raises(OutcomeUnknown) as caught:
        rig.manager.update_with_retry("d", JsonPatch([{"op": "add", "path": "/log", "value": 1}]))
    assert "GET the device" in str(caught.value)
    rig.forwarder.unreachable = False
    assert rig.state("d") == {"n": 0, "log": 1} and rig.version("d") == 2



def test_a_write_whose_caller_must_answer_by_a_deadline_is_settled_by_then_where_the_settle_alone_runs_on(rig):
    """The API answers by its function's end (``answer_by``): a request still running then gets
    API Gateway's bare 503, which says nothing was written though the write may have landed.
    DynamoDB unreachable once the write landed: with the deadline 6 s ahead the outcome is
    unknown within it; without one (the control) the settle runs its 10 s. Each applied once."""
    from functions.device_state import answer_by

    patient = DeviceStateManager(dynamodb_client(rig.forwarder.endpoint, "us-east-1"), rig.name, settle_seconds=10)
    rig.other.create("d", {"n": 0})

    def seconds_to_outcome(deadline_seconds):
        rig.forwarder.lose("UpdateItem", then=lambda: setattr(rig.forwarder, "unreachable", True))
        started = time.monotonic()
        try:
            with answer_by(None if deadline_seconds is None else started + deadline_seconds):
                with pytest.raises(OutcomeUnknown):
                    patient.update_with_retry("d", INCREMENT)
        finally:
            rig.forwarder.unreachable = False
        return time.monotonic() - started

    bounded, control = seconds_to_outcome(6.0), seconds_to_outcome(None)
    assert bounded < 6.0 and control >= 10, (bounded, control)
    assert rig.version("d") == 3 and rig.state("d") == {"n": 2}


def test_a_write_no_write_of_which_is_answered_while_reads_are_is_learned_applied_by_a_read(rig):
    """DynamoDB answers no write (each answer held past the client's read timeout) but answers
    reads: the write and its settle marks all land unanswered, and a last consistent read finds
    its journal entry, so it answers applied, where it answered outcome-unknown (a fault probe).
    Unreachable for reads too, it stays unknown (the test above)."""
    rig.other.create("d", {"n": 0})
    rig.forwarder.slow["UpdateItem"] = 4
    try:
        device = rig.manager.update_with_retry("d", INCREMENT)
    finally:
        rig.forwarder.slow.clear()
    assert device.version == 2 and rig.state("d") == {"n": 1} and rig.version("d") == 2

def later_writer(rig):
    """Another writer whose clock runs JOURNAL_KEEP_SECONDS ahead: every entry it sees is
    old to it, so it keeps only the newest JOURNAL_KEEP."""
    return DeviceStateManager(rig.client, rig.name, clock=lambda: time.time() + 2 * JOURNAL_KEEP_SECONDS)


def rmw_writes(manager, device_id, count):
    def write():
        for _ in range(count):
            manager.update_with_retry(device_id, MergePatch({"other": {"v": uuid.uuid4().hex}}))  # read-modify-write
    return write


MINE = {"compiled": INCREMENT, "read-modify-write": JsonPatch([{"op": "add", "path": "/mine", "value": 1}])}


@pytest.mark.parametrize("kind", MINE)
def test_a_write_is_settled_although_more_than_journal_keep_writes_landed_before_it_could_ask(rig, kind):
    """On a hot device more writes than JOURNAL_KEEP land within one settle round trip (8 writers
    in the lost-answers benchmark): their entries are young, so the journal still names ours."""
    rig.other.create("d", {"n": 0})
    rig.forwarder.lose("UpdateItem", then=rmw_writes(rig.other, "d", JOURNAL_KEEP + 2))
    device = rig.manager.update_with_retry("d", MINE[kind])  # answered: no OutcomeUnknown
    assert device.version >= 2
    state = rig.state("d")
    assert (state["n"] == 1) if kind == "compiled" else (state["mine"] == 1)
    assert rig.version("d") == 2 + JOURNAL_KEEP + 2  # applied once


def test_when_the_journal_has_moved_past_a_write_it_is_reported_unknown_never_reapplied(rig):
    rig.other.create("d", {"n": 0})
    rig.forwarder.lose("UpdateItem", then=rmw_writes(later_writer(rig), "d", JOURNAL_KEEP + 2))
    with pytest.raises(OutcomeUnknown):
        rig.manager.update_with_retry("d", JsonPatch([{"op": "add", "path": "/mine", "value": 1}]))
    assert rig.state("d")["mine"] == 1 and rig.version("d") == 2 + JOURNAL_KEEP + 2  # applied once


def containers_trimming_from_one_view(rig, device_id, count):
    """``count`` containers whose last view of the device is the same item each apply a
    compiled increment, which drops the entries that view shows beyond the journal's keep
    (their clocks run ahead, so every entry is old to them). Returns (view, item after)."""
    rig.other.create(device_id, {"n": 0})
    for _ in range(JOURNAL_MAX + 4):  # a new container each time: it has seen nothing, so it trims nothing
        DeviceStateManager(rig.client, rig.name).update_with_retry(device_id, INCREMENT)
    view = rig.client.get_item(TableName=rig.name, Key=table.state_key(device_id), ConsistentRead=True)["Item"]
    for _ in range(count):
        container = DeviceStateManager(rig.client, rig.name, clock=lambda: time.time() + 2 * JOURNAL_KEEP_SECONDS)
        with pytest.raises(VersionConflict):  # reads the item (its view of the journal) and writes nothing
            container.update(device_id, INCREMENT, expected_version=0)
        container.update_with_retry(device_id, INCREMENT)
    return view, rig.client.get_item(TableName=rig.name, Key=table.state_key(device_id), ConsistentRead=True)["Item"]


@pytest.mark.parametrize("kind", MINE)
def test_containers_trimming_at_once_leave_the_exact_watermark_and_a_lost_answer_is_settled(rig, kind):
    view, after = containers_trimming_from_one_view(rig, "d", 3)
    dropped = [write.stamp_ms for write, _ in journal(view) if write.attribute not in after]
    assert dropped and trimmed_stamp(after) == max(dropped)  # not the sum of three raises
    # A write lost before it reached DynamoDB: its entry is absent, so only the watermark
    # can tell "never applied" from "dropped from the journal"; it is settled and sent again.
    rig.forwarder.lose("UpdateItem", land=False)
    device = rig.manager.update_with_retry("d", MINE[kind])  # answered: no OutcomeUnknown
    assert rig.forwarder.lost == ["UpdateItem"] and device.version >= 2
    state = rig.state("d")
    assert (state["n"] == JOURNAL_MAX + 4 + 3 + 1) if kind == "compiled" else (state["mine"] == 1)


def journal_entries(rig, device_id):
    item = rig.client.get_item(TableName=rig.name, Key=table.state_key(device_id))["Item"]
    return [name for name in item if name.startswith(table.JOURNAL_PREFIX)]


def test_the_journal_stays_bounded(rig):
    rig.other.create("d", {"n": 0})
    for _ in range(3 * JOURNAL_MAX):
        rig.other.update_with_retry("d", INCREMENT)  # compiled: no read; trims what it saw last time
    assert len(journal_entries(rig, "d")) <= JOURNAL_MAX + 1
    for _ in range(3):
        later_writer(rig).update_with_retry("d", MergePatch({"m": {"x": 1}}))  # read-modify-write: the newest
    # every increment's entry is old to the later writers, and goes beyond the newest JOURNAL_KEEP;
    # the three later writes are young to one another, and stay
    assert len(journal_entries(rig, "d")) == max(JOURNAL_KEEP, 3)


# ------------------------------------------------------------------ naive controls


class NaiveWriter:
    """The service's write path before the journal: botocore resends a request whose answer
    was lost, and a failed version check counts as ours only if the single ``writeId``
    attribute still names this attempt (another writer overwrites it)."""

    def __init__(self, endpoint, name):
        self.client = boto3.session.Session().client(
            "dynamodb", endpoint_url=endpoint, region_name="us-east-1",
            config=Config(retries={"mode": "standard", "max_attempts": 3}, read_timeout=3))
        self.name = name

    def _item(self, device_id):
        return self.client.get_item(TableName=self.name, Key=table.state_key(device_id), ConsistentRead=True)["Item"]

    def read_modify_write(self, device_id, change):
        for _ in range(10):
            item = self._item(device_id)
            version, write_id = int(item["version"]["N"]), uuid.uuid4().hex
            state = rig_state(item)
            try:
                self.client.update_item(
                    TableName=self.name, Key=table.state_key(device_id),
                    UpdateExpression="SET #s = :s, #v = :next, writeId = :w",
                    ConditionExpression="#v = :expected",
                    ExpressionAttributeNames={"#s": "state", "#v": "version"},
                    ExpressionAttributeValues={":s": to_attr(change(state)), ":next": {"N": str(version + 1)},
                                               ":expected": {"N": str(version)}, ":w": {"S": write_id}},
                    ReturnValuesOnConditionCheckFailure="ALL_OLD")
                return
            except self.client.exceptions.ConditionalCheckFailedException as error:
                if error.response.get("Item", {}).get("writeId", {}).get("S") == write_id:
                    return  # "our own landed write" -- only while nobody else wrote
        raise AssertionError("naive writer gave up")

    def end_lease(self, device_id, ticket):
        """End a lease: delete its queue row, then clear the holder, whoever it is by then."""
        self.client.delete_item(TableName=self.name, Key={
            table.PARTITION_KEY: {"S": device_id}, table.SORT_KEY: {"S": f"{table.LEASE_SK_PREFIX}{ticket:038d}"}})
        self.client.update_item(TableName=self.name, Key=table.state_key(device_id),
                                UpdateExpression="REMOVE #t, #k, #u",
                                ExpressionAttributeNames={"#t": table.LEASE_TOKEN, "#k": table.LEASE_KEY,
                                                          "#u": table.LEASE_UNTIL})

    def delete(self, device_id, expected_version):
        self.client.delete_item(TableName=self.name, Key=table.state_key(device_id),
                                ConditionExpression="#v = :expected", ExpressionAttributeNames={"#v": "version"},
                                ExpressionAttributeValues={":expected": {"N": str(expected_version)}})


def rig_state(item):
    from functions.device_state.model.values import from_attribute
    return from_attribute(item["state"])


def to_attr(value):
    from functions.device_state.model.values import to_attribute
    return to_attribute(value)


def test_control_the_naive_read_modify_write_applies_twice_in_the_same_harness(rig):
    rig.other.create("d", {"n": 0})
    naive = NaiveWriter(rig.forwarder.endpoint, rig.name)
    other = NaiveWriter(f"http://{rig.forwarder.upstream[0]}:{rig.forwarder.upstream[1]}", rig.name)
    plus_one = lambda state: {**state, "n": state["n"] + 1}  # noqa: E731
    rig.forwarder.lose("UpdateItem", then=lambda: other.read_modify_write("d", plus_one))
    naive.read_modify_write("d", plus_one)
    assert rig.state("d")["n"] == 3  # one naive increment applied twice, plus the other writer's


def test_control_a_naive_delete_resend_deletes_the_device_created_again(rig):
    # Before tombstones, a re-created device started again at version 1, so a resent
    # "delete at version 1" matched the new incarnation.
    rig.client.put_item(TableName=rig.name, Item={**table.state_key("d"), "version": {"N": "1"}})
    naive = NaiveWriter(rig.forwarder.endpoint, rig.name)
    recreate = lambda: rig.client.put_item(TableName=rig.name, Item={  # noqa: E731
        **table.state_key("d"), "version": {"N": "1"}, "again": {"BOOL": True}})
    rig.forwarder.lose("DeleteItem", then=recreate)
    naive.delete("d", expected_version=1)
    assert "Item" not in rig.client.get_item(TableName=rig.name, Key=table.state_key("d"))


def test_a_lease_take_whose_answer_never_comes_leaves_the_device_free(rig):
    rig.other.create("d", {"n": 0})
    # the take (the holder's update beside the row) lands; its answer and resends are lost
    rig.forwarder.lose("TransactWriteItems", times=3, when=lambda body: b'"Update"' in body)
    with pytest.raises(OutcomeUnknown):
        rig.manager.lease_queue().acquire("d", 600)
    assert rig.other.lease_queue().status("d").holder_token is None
    rig.other.update_with_retry("d", INCREMENT)  # not locked for the lease's 600 s
    assert rig.other.lease_queue().acquire("d", 30).fencing_token > 0


# ---- Ending a lease by its fencing token (issue 27 row 4) is a write verb of its own.

@BETWEEN
def test_ending_a_lease_whose_answer_is_lost_ends_it_once_and_never_a_lease_taken_after_it(rig, between):
    rig.other.create("d", {"n": 0})
    device_lease = rig.other.lease_queue().acquire("d", 60)
    newcomer = []
    take_after = lambda: newcomer.append(rig.other.lease_queue().acquire("d", 30))  # noqa: E731
    rig.forwarder.lose("TransactWriteItems", then=take_after if between else None)
    rig.manager.lease_queue().end("d", device_lease.fencing_token)  # answered, though its answer was lost
    assert rig.forwarder.lost == ["TransactWriteItems"]
    status = rig.other.lease_queue().status("d")
    if between:  # the lease taken after the end landed is still held, and its token still writes
        assert status.holder_token == newcomer[0].fencing_token > device_lease.fencing_token
        rig.other.fenced({"d": newcomer[0].lease_token}).update_with_retry("d", INCREMENT)
    else:
        assert status.holder_token is None and status.queue == ()
        rig.other.update_with_retry("d", INCREMENT)
    assert rig.state("d") == {"n": 1}


def test_control_a_naive_end_resent_by_botocore_ends_the_lease_taken_after_it(rig):
    rig.other.create("d", {"n": 0})
    device_lease = rig.other.lease_queue().acquire("d", 60)
    naive = NaiveWriter(rig.forwarder.endpoint, rig.name)
    newcomer = []
    rig.forwarder.lose("UpdateItem", then=lambda: newcomer.append(rig.other.lease_queue().acquire("d", 30)))
    naive.end_lease("d", device_lease.fencing_token)  # its "clear the holder" is resent after its answer was lost
    assert newcomer and newcomer[0].fencing_token > device_lease.fencing_token
    assert rig.other.lease_queue().status("d").holder_token is None  # the newcomer lost a lease it believes held


# ---- A queue row's first put, and an enrollment's create: items another caller may change or end
# between a first copy that landed and the store's resend of it.

def lease_counter(rig, device_id) -> int:
    key = {**table.state_key(device_id), "sk": {"S": table.LEASE_COUNTER_SK}}
    return int(rig.client.get_item(TableName=rig.name, Key=key, ConsistentRead=True)["Item"]["ticket"]["N"])


def first_row_put(body: bytes) -> bool:
    """A waiting row's first put: the only request on a row (``lease#``) with no condition."""
    return b'"lease#' in body and b"ConditionExpression" not in body


@BETWEEN
def test_a_ticket_a_back_end_ends_while_its_rows_first_answer_is_lost_stays_ended(rig, between):
    rig.other.create("d", {"n": 0})
    ended = []
    end_it = lambda: ended.append(rig.other.lease_queue().end("d", lease_counter(rig, "d")))  # noqa: E731
    for target in ("TransactWriteItems", "PutItem"):  # the first put as sent, and as a plain put would be
        rig.forwarder.lose(target, when=first_row_put, then=end_it if between else None)
    if between:
        with pytest.raises(LeaseLost):  # 410: the end the back-end was answered stands
            rig.manager.lease_queue().acquire("d", 60)
        assert ended == [True] and rig.other.lease_queue().status("d").holder_token is None
    else:
        grant = rig.manager.lease_queue().acquire("d", 60)
        assert rig.other.lease_queue().status("d").holder_token == grant.fencing_token == 1
    assert len(rig.forwarder.lost) == 1


def test_control_a_plain_put_resent_after_its_answer_was_lost_brings_back_a_row_ended_between(rig):
    rig.other.create("d", {"n": 0})
    row = {**table.state_key("d"), "sk": {"S": "lease#0000000001"}, "ticket": {"N": "1"}}
    deleted = lambda: rig.client.delete_item(TableName=rig.name, Key={k: row[k] for k in ("deviceId", "sk")})  # noqa: E731
    rig.forwarder.lose("PutItem", then=deleted)
    Store(dynamodb_client(rig.forwarder.endpoint, "us-east-1"), rig.name).send("put_item", IDEMPOTENT, Item=row)
    assert "Item" in rig.client.get_item(TableName=rig.name, Key={k: row[k] for k in ("deviceId", "sk")})


def an_enrollment(enrollment_id: str) -> Enrollment:
    return Enrollment(enrollment_id, r"lamp-[0-9]+", 1, {"state": {}}, group_key=uuid.uuid4().bytes)


@pytest.mark.parametrize("between", ["provisioned", "deleted"])
def test_an_enrollment_whose_creates_answer_is_lost_keeps_what_was_written_after_it(rig, between):
    def other_writer():
        if between == "deleted":
            rig.other.delete_enrollment("line")
        else:
            rig.other.provision("lamp-1", rig.other.enrollment("line"),
                                lambda credential_id: CredentialRecord(credential_id, SECRET, secret=b"derived"),
                                "jti-1", int(time.time()) + 600)
    rig.forwarder.lose("PutItem", when=lambda body: b"enrollment#line" in body, then=other_writer)
    created = rig.manager.create_enrollment(an_enrollment("line"))  # its own first copy: created, not "exists"
    assert rig.forwarder.lost == ["PutItem"] and created.enrollment_id == "line"
    stored = rig.other.enrollment("line")
    assert (stored.provisioned, stored.deleted) == ((1, False) if between == "provisioned" else (0, True))
    with pytest.raises(EnrollmentExists):  # another create of the id, after it: refused as before
        rig.manager.create_enrollment(an_enrollment("line"))


def test_a_subscribe_whose_answer_is_lost_keeps_what_the_fan_out_delivered_meanwhile(rig):
    """The fan-out may send a version and record it between a subscription's put that landed and
    the store's resend of it; the resend must not move ``delivered`` back (sent again)."""
    rig.other.create("lamp", {"n": 0})
    Subscriptions(rig.client, rig.name).open("c1", "app")
    key = {**table.state_key("lamp"), "sk": {"S": SUBSCRIPTION_SK_PREFIX + "c1"}}
    delivered = lambda: rig.client.update_item(  # noqa: E731  (the fan-out's advance, as it records a version sent)
        TableName=rig.name, Key=key, UpdateExpression="SET delivered = :v", ExpressionAttributeValues={":v": {"N": "7"}})
    rig.forwarder.lose("PutItem", when=lambda body: SUBSCRIPTION_SK_PREFIX.encode() in body, then=delivered)
    Subscriptions(dynamodb_client(rig.forwarder.endpoint, "us-east-1"), rig.name).subscribe("c1", "lamp", 5, ["desired"])
    assert rig.forwarder.lost == ["PutItem"]
    assert rig.client.get_item(TableName=rig.name, Key=key, ConsistentRead=True)["Item"]["delivered"] == {"N": "7"}
    Subscriptions(rig.client, rig.name).subscribe("c1", "lamp", 9, ["desired"])  # subscribing again replaces it
    assert rig.client.get_item(TableName=rig.name, Key=key, ConsistentRead=True)["Item"]["delivered"] == {"N": "9"}


def test_a_transaction_that_only_checks_answers_nothing_written_when_every_answer_is_lost(rig):
    """It writes nothing, whether or not a copy landed: 503 (retry), not 504 outcome-unknown. One
    that also writes, in the same faults, is settled by its journal entry: applied once."""
    rig.other.create("a", {"n": 0})
    rig.other.create("b", {"n": 0})
    rig.forwarder.lose("TransactWriteItems", times=3)
    with pytest.raises(StorageUnavailable, match="only checks"):
        rig.manager.transact([Operation.check("a", 1), Operation.check("b")])
    assert rig.forwarder.lost == ["TransactWriteItems"] * 3
    rig.forwarder.lose("TransactWriteItems", times=3)
    rig.manager.transact([Operation.check("a", 1), Operation.update("b", INCREMENT)])
    assert rig.state("b") == {"n": 1}


class HoldingFirstUpdate:
    """A client that keeps the first UpdateItem unsent (``held``, to send later: a copy held
    up in the network) and raises the timeout its caller would see."""

    def __init__(self, client):
        self.client, self.held = client, None

    def __getattr__(self, name):
        attribute = getattr(self.client, name)
        if name != "update_item":
            return attribute

        def update_item(**request):
            if self.held is None:
                self.held = request
                raise ReadTimeoutError(endpoint_url="http://held-up")
            return attribute(**request)

        return update_item


def test_a_read_free_copy_held_up_past_a_minute_is_refused_by_its_never_applied_marker(local_table):
    """A compiled write's first copy is held up; its settle marks it never applied and the write
    applies by read-modify-write. The marker stays as long as DynamoDB would take the copy
    (signed at most 15 minutes earlier), so the copy arriving a minute later, after other
    writes, is refused; a marker kept only a minute would have let it apply a second time."""
    client, name = local_table
    clock = Clock()
    other, holding = DeviceStateManager(client, name, clock=clock), HoldingFirstUpdate(client)
    other.create("d", {"n": 0})
    assert DeviceStateManager(holding, name, clock=clock).update_with_retry("d", INCREMENT).state["n"] == 1
    write = WriteId.parse(next(name for name in holding.held["ExpressionAttributeNames"].values()
                               if name.startswith("w:")))
    assert dict(journal(other.live_state("d")))[write] == 0  # settled: never applied
    for seconds, kept in ((SETTLED_KEEP_SECONDS + 1, True), (SIGNED_KEEP_SECONDS, False)):
        clock.now += seconds
        other.update_with_retry("d", JsonPatch([{"op": "test", "path": "/n", "value": 1},
                                                {"op": "add", "path": "/x", "value": seconds}]))  # reads and trims
        assert (write in dict(journal(other.live_state("d")))) is kept
        if kept:
            with pytest.raises(ClientError) as refused:
                client.update_item(**holding.held)
            assert refused.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    assert other.get("d").state["n"] == 1
