"""The change feed on DynamoDB Local: the stream processor (run by the local poller, as
`make serve` runs it) turns every new version into exactly one change item, in order."""

from __future__ import annotations

import copy
import json
import functools
import threading
import time

import boto3
import jsonpatch
import pytest

from functions.changes.events import LogPublisher
from functions.changes.handler import process
from functions.device_state import (DEFAULT_TOMBSTONE_SECONDS, SECRET, CredentialRecord, CredentialRevoked,
                                    DeviceNotFound, DeviceStateManager, Holder, IdempotencyKey, JsonPatch, MergePatch,
                                    new_credential_id)
from functions.device_state.feed.items import LEGACY_CHANGE_SK_PREFIX, change_sk
from functions.device_state.feed.log import (CHANGE_SK_PREFIX, LEGACY_READ_UNTIL, RECORDED_WITHIN_SECONDS, ChangeLog,
                                            ChangesExpired, InvalidSince, VersionNotFound, VersionNotRecorded,
                                            change_of)
from functions.device_state.item.schema import TTL_ATTRIBUTE, state_key
from functions.device_state.model.times import timestamp
from functions.device_state.write.store import IDEMPOTENT, ConditionNotMet
from localdev.stream import StreamPoller
from tests.helpers import RecordingClient, run_writers

pytestmark = [pytest.mark.dynamodb_local, pytest.mark.table_stream]  # tables made with their stream


def streams_client(endpoint):
    return boto3.client("dynamodbstreams", endpoint_url=endpoint, region_name="us-east-1")


class FlakyLog(ChangeLog):
    """Fails the first ``times`` tries of writing the change of ``version``."""

    def __init__(self, *args, version: int, times: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.version, self.left, self.failures = version, times, 0

    def record(self, old_image, new_image, **options):
        change = change_of(old_image, new_image)
        if change is not None and change.version == self.version and self.left > 0:
            self.left -= 1
            self.failures += 1
            raise RuntimeError("injected processor failure")
        return super().record(old_image, new_image, **options)


@pytest.fixture
def feed(local_table, dynamodb_local):
    """(manager, change log, start) where start(log=None) runs the local poller."""
    client, name = local_table
    pollers = []

    def start(log: ChangeLog | None = None) -> StreamPoller:
        log = log or ChangeLog(client, name)
        poller = StreamPoller(streams_client(dynamodb_local.endpoint), client, name,
                              functools.partial(process, log=log, events=LogPublisher()))
        pollers.append(poller.start())
        return poller

    yield DeviceStateManager(client, name), ChangeLog(client, name), start
    for poller in pollers:
        poller.stop()


def follow(log: ChangeLog, device_id: str, until: int, timeout: float = 60.0) -> list:
    """Every change from since=0 up to version ``until``, page by page."""
    changes, since, deadline = [], 0, time.monotonic() + timeout
    while since < until:
        assert time.monotonic() < deadline, f"the feed stopped at {since} of {until}"
        page = log.wait(device_id, since, 100, wait_seconds=1)
        changes.extend(page)
        since = page[-1].version if page else since
    return changes


def change_items(client, name, device_id):
    return client.query(TableName=name, ConsistentRead=True,
                        KeyConditionExpression="deviceId = :d AND begins_with(sk, :p)",
                        ExpressionAttributeValues={":d": {"S": device_id}, ":p": {"S": CHANGE_SK_PREFIX}})["Items"]


@pytest.mark.concurrency
def test_16_writers_x_20_patches_give_versions_1_to_321_in_order_and_the_patches_rebuild_the_state(feed):
    manager, log, start = feed
    start()
    manager.create("hot", {"n": 0})
    writers, per_writer = 16, 20

    def write(index, step):
        patch = (JsonPatch([{"op": "increment", "path": "/n", "value": 1}]) if step % 2
                 else MergePatch({f"w{index}": step, "last": index}))
        manager.update_with_retry("hot", patch, budget_seconds=60)

    errors = run_writers(writers, per_writer, write)
    assert errors == []
    final = manager.get("hot")
    assert final.version == 1 + writers * per_writer == 321

    changes = follow(log, "hot", final.version)
    assert [change.version for change in changes] == list(range(1, 322))
    assert [change.previous_version for change in changes] == list(range(0, 321))
    assert changes[0].kind == "created" and {change.kind for change in changes[1:]} == {"updated"}
    document = {}
    for change in changes:
        document = jsonpatch.apply_patch(document, copy.deepcopy(change.patch))
    assert document == {"state": final.state, "desired": {}, "reported": {}}
    assert log.read("hot", 321) == []


def test_a_batch_delivered_twice_changes_nothing(feed, local_table, dynamodb_local):
    client, name = local_table
    manager, log, _ = feed
    manager.create("twice", {"a": 1})
    manager.update("twice", MergePatch({"b": 2}), 1)
    streams = streams_client(dynamodb_local.endpoint)
    poller = StreamPoller(streams, client, name, lambda event, context: {"batchItemFailures": []})
    shard = streams.describe_stream(StreamArn=poller.stream_arn)["StreamDescription"]["Shards"][0]["ShardId"]
    iterator = streams.get_shard_iterator(StreamArn=poller.stream_arn, ShardId=shard,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    from localdev.stream import lambda_record

    event = {"Records": [lambda_record(r, poller.stream_arn)
                         for r in streams.get_records(ShardIterator=iterator)["Records"]]}
    assert process(event, None, log, LogPublisher()) == {"batchItemFailures": []}
    first = change_items(client, name, "twice")
    assert [item["version"]["N"] for item in first] == ["1", "2"]
    manager.update("twice", MergePatch({"c": 3}), 2)  # a later write must not be disturbed either
    time.sleep(1.1)  # a rewrite would show a new expiresAt/updatedAt only if it were recomputed from the clock
    assert process(event, None, log, LogPublisher()) == {"batchItemFailures": []}
    assert change_items(client, name, "twice") == first


def test_a_failure_mid_batch_retries_from_the_failed_record_and_the_feed_stays_gap_free(feed, local_table):
    client, name = local_table
    manager, log, start = feed
    flaky = FlakyLog(client, name, version=4, times=3)
    manager.create("flaky", {"n": 0})
    for version in range(1, 8):
        manager.update("flaky", MergePatch({"n": version}), version)
    start(flaky)
    changes = follow(log, "flaky", 8)
    assert flaky.failures == 3  # it did fail, three times, and was retried
    assert [change.version for change in changes] == list(range(1, 9))
    assert [change.patch for change in changes[1:]] == [[{"op": "replace", "path": "/state/n", "value": v}]
                                                        for v in range(1, 8)]


def test_a_failure_reports_the_failed_record_and_every_later_one(local_table):
    client, name = local_table
    log = FlakyLog(client, name, version=2, times=1)
    images = [({}, 1), ({"version": {"N": "1"}}, 2), ({"version": {"N": "2"}}, 3)]
    records = []
    for sequence, (old, version) in enumerate(images, start=100):
        stamp = {"S": timestamp(time.time())}  # within the retention: a fixed date expires, and TTL takes it
        new = {"deviceId": {"S": "d"}, "sk": {"S": "state"}, "version": {"N": str(version)},
               "state": {"M": {}}, "createdAt": stamp, "updatedAt": stamp}
        old = {**new, **old} if old else None
        records.append({"eventID": str(sequence), "eventName": "MODIFY" if old else "INSERT",
                        "eventSource": "aws:dynamodb", "eventSourceARN": "arn",
                        "dynamodb": {"Keys": {"deviceId": {"S": "d"}, "sk": {"S": "state"}}, "NewImage": new,
                                     **({"OldImage": old} if old else {}), "SequenceNumber": str(sequence)}})
    response = process({"Records": records}, None, log, LogPublisher())
    assert response == {"batchItemFailures": [{"itemIdentifier": "101"}, {"itemIdentifier": "102"}]}
    assert [item["version"]["N"] for item in change_items(client, name, "d")] == ["1"]


def test_a_long_poll_returns_once_a_change_is_written(feed):
    manager, log, start = feed
    start()
    manager.create("poll", {"on": False})
    assert [c.version for c in log.wait("poll", 0, wait_seconds=10)] == [1]
    result = {}

    def poll():
        started = time.monotonic()
        result["changes"] = log.wait("poll", 1, wait_seconds=20)
        result["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()  # it waits while nothing is newer
    manager.update("poll", MergePatch({"on": True}), 1)
    thread.join(timeout=30)
    assert [c.version for c in result["changes"]] == [2]
    assert result["seconds"] < 15  # generous: it returned on the change, not at the 20 s deadline


def test_an_empty_long_poll_returns_at_its_deadline(feed):
    manager, log, start = feed
    start()
    manager.create("quiet", {})
    log.wait("quiet", 0, wait_seconds=10)
    started = time.monotonic()
    assert log.wait("quiet", 1, wait_seconds=1) == []
    assert 0.9 <= time.monotonic() - started < 5


def test_since_older_than_the_retention_is_expired_with_the_current_version(feed, local_table):
    client, name = local_table
    manager, log, start = feed
    start()
    manager.create("old", {"n": 0})
    manager.update("old", MergePatch({"n": 1}), 1)
    assert len(follow(log, "old", 2)) == 2
    later = ChangeLog(client, name, clock=lambda: time.time() + 8 * 24 * 3600)  # the default 7 days have passed
    with pytest.raises(ChangesExpired) as expired:
        later.read("old", 0)
    assert expired.value.current_version == 2
    assert later.read("old", 2) == []  # caught up is not expired
    with pytest.raises(VersionNotFound):
        later.at_version("old", 1)


def test_history_returns_past_states_exactly_even_near_the_item_size_limit(feed):
    manager, log, start = feed
    start()
    big = {"blob": "x" * 380_000, "n": 1}
    manager.create("big", big)
    manager.update("big", MergePatch({"n": 2}), 1)
    manager.replace("big", {"blob": "y" * 380_000, "n": 3}, 2)
    changes = follow(log, "big", 3)
    assert [c.kind for c in changes] == ["created", "updated", "replaced"]
    assert changes[1].patch == [{"op": "replace", "path": "/state/n", "value": 2}]
    document = {}
    for change in changes:  # patches too large to store beside the state come back as one replace
        document = jsonpatch.apply_patch(document, copy.deepcopy(change.patch))
        assert document["state"] == log.at_version("big", change.version).state
    assert log.at_version("big", 1).state == big
    assert log.at_version("big", 2).state == {**big, "n": 2}
    assert log.at_version("big", 3).state == manager.get("big").state
    with pytest.raises(VersionNotFound):
        log.at_version("big", 4)


def test_a_lease_produces_no_change_and_a_delete_produces_one_with_the_tombstone_version(feed, local_table):
    client, name = local_table
    manager, log, start = feed
    start()
    manager.create("leased", {"n": 0})
    with manager.lease("leased", 5) as lease:
        manager.fenced({"leased": lease}).update("leased", MergePatch({"n": 1}), 1)
    manager.update("leased", MergePatch({"n": 2}), 2, idempotency=IdempotencyKey("key-1", scope="PATCH"))
    manager.delete("leased")
    changes = follow(log, "leased", 4)
    time.sleep(1)  # anything late would show now
    assert [(c.version, c.kind) for c in log.read("leased", 0)] == [(1, "created"), (2, "updated"),
                                                                   (3, "updated"), (4, "deleted")]
    assert changes[-1].patch is None
    assert [item["sk"]["S"] for item in change_items(client, name, "leased")] == [
        f"{CHANGE_SK_PREFIX}{v:020d}" for v in (1, 2, 3, 4)]
    with pytest.raises(VersionNotFound):
        log.at_version("leased", 4)  # deleted at that version
    assert log.at_version("leased", 3).state == {"n": 2}  # the tombstone's history stays readable
    manager.create("leased", {"again": True})
    assert [(c.version, c.kind) for c in log.wait("leased", 4, wait_seconds=10)] == [(5, "created")]


class _KeepingWhateverHoldsTheKey(ChangeLog):
    """The control: a recorder that takes any item under a change's key for the change, expired or not."""

    def _put_once(self, item: dict) -> None:
        try:
            self.store.send("put_item", IDEMPOTENT, Item=item, ConditionExpression="attribute_not_exists(sk)")
        except ConditionNotMet:
            pass


def _created_again_once_its_tombstone_expired(client, name, log: ChangeLog) -> None:
    """``lamp`` written twice and deleted a tombstone's life ago, created again once TTL deleted its
    tombstone, and written once more: each change recorded by ``log`` as the processor would."""
    lived = time.time() - DEFAULT_TOMBSTONE_SECONDS - 60
    former, manager = DeviceStateManager(client, name, clock=lambda: lived), DeviceStateManager(client, name)
    # The former device's changes are written past their expiry: DynamoDB Local's TTL deletes such
    # items within a second, and did once between them and the new device's (under the full suite),
    # so its control lost nothing. With TTL off they stay, as on AWS, where TTL deletes late.
    client.update_time_to_live(TableName=name, TimeToLiveSpecification={"Enabled": False,
                                                                        "AttributeName": TTL_ATTRIBUTE})

    def written(write):
        def raw():
            return client.get_item(TableName=name, Key=state_key("lamp"), ConsistentRead=True).get("Item")
        old = raw()
        write()
        log.record(old, raw())

    written(lambda: former.create("lamp", {"life": "former"}))
    written(lambda: former.update_with_retry("lamp", MergePatch({"n": 1})))
    written(lambda: former.delete("lamp"))
    client.delete_item(TableName=name, Key=state_key("lamp"))  # the expired tombstone, as TTL deletes it
    written(lambda: manager.create("lamp", {"life": "new"}))
    written(lambda: manager.update_with_retry("lamp", MergePatch({"n": 2})))


def test_an_id_created_again_once_its_tombstone_expired_has_a_feed_of_its_own(local_table):
    """A tombstone outlives the changes before it (TOMBSTONE_SECONDS is at least the change
    retention), so once it has expired and the id is created again at version 1, the former
    device's change items TTL has not deleted yet are all past their expiry: the new device's
    changes replace them."""
    client, name = local_table
    log = ChangeLog(client, name)
    _created_again_once_its_tombstone_expired(client, name, log)
    assert [(c.version, c.kind) for c in log.read("lamp", 0)] == [(1, "created"), (2, "updated")]
    assert log.at_version("lamp", 1).state == {"life": "new"}
    assert log.at_version("lamp", 2).state == {"life": "new", "n": 2}


def test_control_a_recorder_taking_an_expired_item_for_the_change_loses_the_new_devices_changes(local_table):
    client, name = local_table
    log = _KeepingWhateverHoldsTheKey(client, name)
    _created_again_once_its_tombstone_expired(client, name, log)
    with pytest.raises(ChangesExpired):
        log.read("lamp", 0)


def test_non_state_items_and_unversioned_changes_are_no_change():
    state = {"deviceId": {"S": "d"}, "sk": {"S": "state"}, "version": {"N": "3"}, "state": {"M": {}},
             "updatedAt": {"S": "2026-11-22T00:00:00.000Z"}}
    assert change_of(state, {**state, "leaseToken": {"N": "7"}}) is None
    assert change_of(state, {**state, "w:000abc": {"N": "3"}}) is None
    assert change_of(None, {"deviceId": {"S": "d"}, "sk": {"S": "state"}, "w:1": {"N": "0"}}) is None
    for sk in ("idem#PATCH#k", "lease#0001", "lease-counter", change_sk(3), change_sk(3, LEGACY_CHANGE_SK_PREFIX)):
        assert change_of(None, {**state, "sk": {"S": sk}}) is None
    assert change_of({**state, "version": {"N": "2"}}, state).kind == "updated"


def _recorded_writes(manager, log):
    """``written(device_id, write)``: makes the write and records its change as the processor would."""
    def written(device_id, write):
        old = manager.live_state(device_id)
        write()
        log.record(old, manager.live_state(device_id))
    return written


def _lamp_at_version_3(manager, log):
    """A device ``lamp`` written 3 times ({"n": 0} to {"n": 2}), each change recorded; ``written``."""
    written = _recorded_writes(manager, log)
    written("lamp", lambda: manager.create("lamp", {"n": 0}))
    for n in (1, 2):
        written("lamp", lambda: manager.update_with_retry("lamp", MergePatch({"n": n})))
    return written


def _as_legacy(client, name, device_id, versions):
    """Moves the change items of ``versions`` to the legacy key, as an older release's processor stored them."""
    for version in versions:
        key = {"deviceId": {"S": device_id}, "sk": {"S": change_sk(version)}}
        item = client.get_item(TableName=name, Key=key, ConsistentRead=True)["Item"]
        client.put_item(TableName=name, Item={**item, "sk": {"S": change_sk(version, LEGACY_CHANGE_SK_PREFIX)}})
        client.delete_item(TableName=name, Key=key)


def _holder(manager, device_id):
    return Holder(manager.add_credential(device_id, CredentialRecord(new_credential_id(), SECRET,
                                                                     secret=b"x")).credential_id)


def test_changes_an_older_release_stored_under_the_legacy_key_are_read_where_todays_key_has_none(feed, local_table):
    """Change items were keyed ``change#<version>`` before they sorted right before the state
    item: those an upgrade finds are read where today's key holds none (a page, and a page of
    the device's own with its credential, a version), and the feed goes on under today's."""
    manager, log, _ = feed
    client, name = local_table
    written = _lamp_at_version_3(manager, log)
    _as_legacy(client, name, "lamp", (1, 2, 3))
    for n in (3, 4):
        written("lamp", lambda: manager.update_with_retry("lamp", MergePatch({"n": n})))
    holder = _holder(manager, "lamp")
    for who in (None, holder):
        assert [c.version for c in log.read("lamp", 0, holder=who)] == [1, 2, 3]
        assert [c.version for c in log.read("lamp", 1, holder=who)] == [2, 3]
        assert [c.version for c in log.read("lamp", 3, holder=who)] == [4, 5]
        assert log.at_version("lamp", 2, holder=who).state == {"n": 1}
    assert [item["sk"]["S"] for item in change_items(client, name, "lamp")] == [change_sk(4), change_sk(5)]


def test_legacy_changes_of_a_device_not_written_since_the_upgrade_are_read_once_recording_would_be_done(
        feed, local_table):
    """Every change of the device under the legacy key, its last write a moment before the
    upgrade: its feed and history wait as while a change is being recorded, then read them once
    RECORDED_WITHIN_SECONDS have passed. A fan-out of the stream's record of the last one (the
    old processor wrote it the moment before the upgrade) sends it at once, from the record."""
    from functions.device_state.feed.items import change_from_item
    from functions.push.delivery import Delivery
    from functions.push.subscriptions import Subscriptions

    manager, log, _ = feed
    client, name = local_table
    _lamp_at_version_3(manager, log)
    _as_legacy(client, name, "lamp", (1, 2, 3))
    holder = _holder(manager, "lamp")
    now = [time.time()]
    clocked = ChangeLog(client, name, clock=lambda: now[0])
    posted = []
    subscriptions = Subscriptions(client, name)
    delivery = Delivery(subscriptions, clocked, lambda connection, message: posted.append(message.get("version")))
    subscriptions.open("c1", "test")
    subscriptions.subscribe("c1", "lamp", 2, ("state", "desired", "reported"))
    for who in (None, holder):
        assert clocked.read("lamp", 1, holder=who) == []
        with pytest.raises(VersionNotRecorded):
            clocked.at_version("lamp", 2, holder=who)
    delivery.fan_out("lamp", 3)
    assert posted == []  # the feed has nothing under today's key yet
    record = client.get_item(TableName=name, ConsistentRead=True, Key={
        "deviceId": {"S": "lamp"}, "sk": {"S": change_sk(3, LEGACY_CHANGE_SK_PREFIX)}})["Item"]
    delivery.fan_out("lamp", 3, streamed=[change_from_item(record)])
    assert posted == [3]
    now[0] += RECORDED_WITHIN_SECONDS + 1
    for who in (None, holder):
        assert [c.version for c in clocked.read("lamp", 1, holder=who)] == [2, 3]
        assert clocked.at_version("lamp", 2, holder=who).state == {"n": 1}
    # the legacy items expired (here: deleted) while the device stays: history is not found, not "not yet"
    client.delete_item(TableName=name, Key={"deviceId": {"S": "lamp"},
                                            "sk": {"S": change_sk(2, LEGACY_CHANGE_SK_PREFIX)}})
    with pytest.raises(VersionNotFound):
        clocked.at_version("lamp", 2)
    spy = RecordingClient(client)
    late = ChangeLog(spy, name, clock=lambda: LEGACY_READ_UNTIL)
    with pytest.raises(ChangesExpired):  # past the date the legacy key is read until: not looked at
        late.read("lamp", 1)
    assert not any(args.get("KeyConditionExpression", "") and LEGACY_CHANGE_SK_PREFIX in json.dumps(args)
                   for _, args in spy.requests)


def test_a_lost_marker_under_the_legacy_key_is_410_and_never_sent_from_the_stream(feed, local_table):
    """An older release marked a version lost just before the upgrade: the feed answers 410
    for it once the recording time has passed, and a fan-out of its stream record sends
    nothing (a subscriber must never pass a lost version silently)."""
    from functions.device_state.feed.items import change_from_item
    from functions.push.delivery import Delivery
    from functions.push.subscriptions import Subscriptions

    manager, log, _ = feed
    client, name = local_table
    _lamp_at_version_3(manager, log)
    client.delete_item(TableName=name, Key={"deviceId": {"S": "lamp"}, "sk": {"S": change_sk(3)}})
    log.record_lost(manager.live_state("lamp"))  # version 3: its change could not be recorded
    _as_legacy(client, name, "lamp", (1, 2, 3))
    marker = client.get_item(TableName=name, ConsistentRead=True, Key={
        "deviceId": {"S": "lamp"}, "sk": {"S": change_sk(3, LEGACY_CHANGE_SK_PREFIX)}})["Item"]
    assert change_from_item(marker).lost
    now = [time.time()]
    clocked = ChangeLog(client, name, clock=lambda: now[0])
    posted = []
    subscriptions = Subscriptions(client, name)
    subscriptions.open("c1", "test")
    subscriptions.subscribe("c1", "lamp", 2, ("state", "desired", "reported"))
    Delivery(subscriptions, clocked, lambda connection, message: posted.append(message)).fan_out(
        "lamp", 3, streamed=[change_from_item(marker)])
    assert posted == []
    now[0] += RECORDED_WITHIN_SECONDS + 1
    with pytest.raises(ChangesExpired):
        clocked.read("lamp", 2)


def test_a_devices_own_page_that_a_megabyte_stops_short_of_its_state_item_still_checks_its_credential(
        feed, local_table):
    """A Query stops at 1 MB read as well as at its limit: a device's own page of big changes
    that stops there has not read the state item, and reads it on its own to check the
    credential, answering the page a device holding none gets."""
    manager, log, _ = feed
    client, name = local_table
    written = _recorded_writes(manager, log)
    written("big", lambda: manager.create("big", {"blob": "a" * 150_000}))
    for letter in "bcdefgh":
        written("big", lambda: manager.update_with_retry("big", MergePatch({"blob": letter * 150_000})))
    holder = _holder(manager, "big")
    plain = [change.version for change in log.read("big", 0)]
    assert 1 <= len(plain) < 8  # the megabyte cut the page
    assert [change.version for change in log.read("big", 0, holder=holder)] == plain
    manager.revoke_credential("big", holder.credential_id)
    with pytest.raises(CredentialRevoked):
        log.read("big", 0, holder=holder)


def test_the_feed_refuses_unknown_devices_and_impossible_versions(feed):
    manager, log, start = feed
    with pytest.raises(DeviceNotFound):
        log.read("never-was", 0)
    manager.create("one", {})
    with pytest.raises(InvalidSince):
        log.read("one", 5)


def test_a_record_that_keeps_failing_is_given_up_after_bounded_retries_and_the_feed_never_skips_it(
        feed, local_table, dynamodb_local):
    client, name = local_table
    manager, log, _ = feed
    flaky = FlakyLog(client, name, version=3, times=10 ** 6)
    manager.create("poison", {"n": 0})
    for version in range(1, 5):
        manager.update("poison", MergePatch({"n": version}), version)
    poller = StreamPoller(streams_client(dynamodb_local.endpoint), client, name,
                          functools.partial(process, log=flaky, events=LogPublisher()), max_retry_attempts=2).start()
    try:
        deadline = time.monotonic() + 30
        while len(change_items(client, name, "poison")) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        poller.stop()
    assert flaky.failures == 3  # the first try and two retries, then given up
    assert [r["dynamodb"]["NewImage"]["version"]["N"] for r in poller.discarded] == ["3"]
    assert [c.version for c in log.read("poison", 0)] == [1, 2]  # never past the missing version 3
    with pytest.raises(ChangesExpired) as gone:
        log.read("poison", 2)
    assert gone.value.current_version == 5
    assert [c.version for c in log.read("poison", 3)] == [4, 5]


def test_a_version_recorded_between_its_miss_and_the_check_is_shown_not_404(local_table):
    """Found by a hostile review: history read a version's change item, missed it, the feed
    recorded it at that moment, and the check that tells "not recorded yet" from "never
    written" then saw it recorded and answered 404. A miss is read once more."""
    client, name = local_table
    manager, log = DeviceStateManager(client, name), ChangeLog(client, name)
    images = [None]
    manager.create("race", {"n": 0})
    for value in (1, 2):
        images.append(client.get_item(TableName=name, Key={"deviceId": {"S": "race"}, "sk": {"S": "state"}},
                                      ConsistentRead=True)["Item"])
        manager.update("race", MergePatch({"n": value}), value)
    log.record(images[0], images[1])  # version 1 recorded; version 2 not yet, version 3 is the device's

    class RecordedRightAfterTheMiss:
        def __init__(self, store):
            self.store, self.missed = store, False

        def get(self, key):
            item = self.store.get(key)
            if item is None and not self.missed:
                self.missed = True
                log_writer.record(images[1], images[2])  # the feed lands version 2 now
            return item

        def __getattr__(self, name):
            return getattr(self.store, name)

    log_writer = ChangeLog(client, name)
    log.store = RecordedRightAfterTheMiss(log.store)
    assert log.at_version("race", 2).state == {"n": 1}
