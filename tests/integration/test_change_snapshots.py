"""Change items between snapshots, on DynamoDB Local: a change carries its sections only
every SNAPSHOT_EVERY-th version (and where ``is_snapshot`` says), the others only the patch
and the metadata, and history, the feed, push and events answer as if every one did."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from bench.costs import reference_device
from functions.changes.events import detail
from functions.changes.handler import handle
from functions.device_state import Ack, DesireOptions, DeviceStateManager, JsonPatch, MergePatch, table
from functions.device_state.feed.items import SNAPSHOT_EVERY, change_of, change_sk
from functions.device_state.feed.log import ChangeLog, VersionNotFound
from functions.device_state.model.values import item_size
from functions.push.delivery import Delivery
from functions.push.subscriptions import Subscriptions
from tests.helpers import RecordingClient

pytestmark = pytest.mark.dynamodb_local
SECTION_ATTRIBUTES = (table.STATE, table.DESIRED, table.REPORTED)
START = time.time()


class Written:
    """A device written a minute apart, each write followed by its change as the stream
    processor records it, and the device's documents, feed entry and delta at each version."""

    def __init__(self, client, name: str, device_id: str = "thermostat"):
        self.client, self.name, self.device_id = client, name, device_id
        self.now = START
        self.manager = DeviceStateManager(client, name, clock=lambda: self.now)
        self.log = ChangeLog(client, name, clock=lambda: self.now)
        self.shown: dict[int, dict] = {}  # version -> GET /devices/{id}?include=metadata at that version
        self.entries: dict[int, dict] = {}  # version -> its feed entry, as the full form shows it
        self.deltas: dict[int, dict] = {}

    def state_item(self) -> dict | None:
        return self.client.get_item(TableName=self.name, Key=table.state_key(self.device_id),
                                    ConsistentRead=True).get("Item")

    def write(self, operation) -> dict:
        old = self.state_item()
        self.now += 60
        operation(self.manager)
        new = self.state_item()
        self.log.record(old, new)
        device = self.manager.get(self.device_id)
        shown = device.as_dict(include_metadata=True, now=self.now)
        self.shown[device.version] = {key: value for key, value in shown.items()
                                      if key != "connectivity"}  # a read's, not history's
        self.entries[device.version] = change_of(old, new).as_dict()
        self.deltas[device.version] = device.delta(self.now)
        return new

    def change_item(self, version: int) -> dict:
        return self.client.get_item(TableName=self.name, ConsistentRead=True, Key={
            table.PARTITION_KEY: {"S": self.device_id}, table.SORT_KEY: {"S": change_sk(version)}})["Item"]

    def create(self) -> None:
        state, sections = reference_device(7)
        self.write(lambda manager: manager.create(self.device_id, state, sections=sections))

    def report(self, step: int) -> None:
        reading = {"temperature": Decimal(80 + step % 7) / 4, "humidity": 40 + step % 9}
        self.write(lambda manager: manager.as_device(self.device_id).update_with_retry(
            self.device_id, MergePatch(reading), section="reported"))


def test_a_change_between_snapshots_holds_its_patch_and_metadata_in_one_write_unit(local_table):
    written = Written(*local_table)
    written.create()
    for step in range(SNAPSHOT_EVERY):
        written.report(step)
    slim = written.change_item(2)
    assert not set(SECTION_ATTRIBUTES) & set(slim)
    assert {"patch", table.META_DESIRED, table.META_REPORTED} <= set(slim)
    assert item_size(slim) < 1024 - 200  # the reference device's: one write unit, with room to spare
    for snapshot in (1, SNAPSHOT_EVERY):  # created, and the SNAPSHOT_EVERY-th
        assert set(SECTION_ATTRIBUTES) <= set(written.change_item(snapshot))
    written.write(lambda manager: manager.update_with_retry(
        written.device_id, MergePatch({"setpoint": 20}), section="desired"))
    assert set(SECTION_ATTRIBUTES) <= set(written.change_item(SNAPSHOT_EVERY + 2))  # a change to desired


def test_a_small_device_keeps_its_sections_where_they_cost_no_more_write_units(local_table):
    written = Written(*local_table, device_id="small")
    written.write(lambda manager: manager.create("small", {"n": 0}))
    written.write(lambda manager: manager.update_with_retry("small", MergePatch({"n": 1})))
    assert table.STATE in written.change_item(2)


@pytest.fixture
def history(local_table):
    """Two snapshot periods and more of the reference device: reports, state writes, a
    desire with an expiry and its refusal, a removed leaf and a replace."""
    written = Written(*local_table)
    written.create()
    for step in range(2 * SNAPSHOT_EVERY + 6):
        if step == 5:
            written.write(lambda manager: manager.update_with_retry(
                written.device_id, MergePatch({"setpoint": 23}), section="desired",
                desire=DesireOptions(expires_in=3600)))
        elif step == 8:
            metadata = written.manager.get(written.device_id).as_dict(include_metadata=True)["metadata"]
            refusal = Ack("/setpoint", metadata["desired"]["setpoint"]["version"], 400, "out of range")
            written.write(lambda manager: manager.as_device(written.device_id).acknowledge(
                written.device_id, [refusal]))
        elif step % 5 == 3:
            written.write(lambda manager: manager.update_with_retry(
                written.device_id, JsonPatch([{"op": "remove", "path": "/site"}] if step == 13
                                             else [{"op": "add", "path": f"/room{step}", "value": step}])))
        elif step == 2 * SNAPSHOT_EVERY:
            written.write(lambda manager: manager.replace(written.device_id, {"fresh": True}))
        else:
            written.report(step)
    return written


def test_history_and_the_feed_answer_every_version_as_written_across_two_snapshot_periods(history):
    versions = sorted(history.shown)
    assert versions == list(range(1, 2 * SNAPSHOT_EVERY + 8))
    slim = [v for v in versions if table.STATE not in history.change_item(v)]
    assert len(slim) > SNAPSHOT_EVERY  # most versions hold no sections: the test rebuilds them
    for version in versions:
        assert history.log.at_version(history.device_id, version).as_dict(
            include_metadata=True, now=history.now) == history.shown[version], version
    assert [change.as_dict() for change in history.log.read(history.device_id, 0)] == [
        history.entries[v] for v in versions]
    for since in (SNAPSHOT_EVERY - 1, SNAPSHOT_EVERY, SNAPSHOT_EVERY + 3):  # pages from around a snapshot
        assert [change.as_dict() for change in history.log.read(history.device_id, since, 5)] == [
            history.entries[v] for v in range(since + 1, since + 6)]


def test_a_version_whose_snapshot_is_gone_is_not_found(history):
    """Past the retention, a snapshot expires before the versions rebuilt from it."""
    retention = ChangeLog(history.client, history.name).retention_seconds
    snapshot_expired = START + 60 * SNAPSHOT_EVERY + retention + 30
    later = ChangeLog(history.client, history.name, clock=lambda: snapshot_expired)
    with pytest.raises(VersionNotFound, match="is missing or past the retention"):
        later.at_version(history.device_id, SNAPSHOT_EVERY + 1)  # its own change within the retention
    history.client.delete_item(TableName=history.name, Key={
        table.PARTITION_KEY: {"S": history.device_id}, table.SORT_KEY: {"S": change_sk(SNAPSHOT_EVERY)}})
    for version in (SNAPSHOT_EVERY, SNAPSHOT_EVERY + 1):
        with pytest.raises(VersionNotFound):
            history.log.at_version(history.device_id, version)
    assert history.log.at_version(history.device_id, SNAPSHOT_EVERY - 1).as_dict(
        include_metadata=True, now=history.now) == history.shown[SNAPSHOT_EVERY - 1]


def _follower(written: Written, client, sections, since: int) -> tuple[Delivery, list]:
    subscriptions = Subscriptions(client, written.name)
    subscriptions.open(f"conn-{sections[0]}", "test")
    subscriptions.subscribe(f"conn-{sections[0]}", written.device_id, since, sections)
    posted = []
    log = ChangeLog(client, written.name, clock=lambda: written.now)
    return Delivery(subscriptions, log, lambda connection, message: posted.append(message)), posted


def test_push_computes_a_change_to_desired_from_its_item_and_reads_the_state_item_for_another(local_table):
    written = Written(*local_table)
    written.create()
    recording = RecordingClient(written.client)
    desired, to_desired = _follower(written, recording, ("desired",), 1)
    reported, to_reported = _follower(written, recording, ("reported",), 1)
    written.write(lambda manager: manager.update_with_retry(
        written.device_id, MergePatch({"setpoint": 19}), section="desired"))
    recording.calls.clear()
    desired.fan_out(written.device_id, 2)
    assert [message["delta"] for message in to_desired] == [written.deltas[2]] and written.deltas[2]
    assert recording.count("get_item") == 0  # the snapshot holds what the delta needs

    reported.fan_out(written.device_id, 2)  # a change to desired: the reported follower is moved past it
    written.report(1)
    assert table.STATE not in written.change_item(3)
    recording.calls.clear()
    reported.fan_out(written.device_id, 3)
    assert [message["version"] for message in to_reported] == [3]
    assert to_reported[0]["delta"] == written.deltas[3]
    assert recording.count("get_item") == 1  # the state item, still at that version: no rebuild


def test_a_catch_up_through_changes_between_snapshots_rebuilds_once(local_table):
    written = Written(*local_table)
    written.create()
    for step in range(SNAPSHOT_EVERY + 4):
        written.report(step)
    recording = RecordingClient(written.client)
    delivery, posted = _follower(written, recording, ("reported",), 1)
    recording.calls.clear()
    delivery.fan_out(written.device_id, SNAPSHOT_EVERY + 5)
    assert [message["version"] for message in posted] == list(range(2, SNAPSHOT_EVERY + 6))
    assert [message["delta"] for message in posted] == [
        written.deltas[version] for version in range(2, SNAPSHOT_EVERY + 6)]
    # the state item (moved on), then versions 2 and 1 to rebuild version 2; the rest follow by their patches
    assert recording.count("get_item") == 3


class Published:
    def __init__(self):
        self.details = []

    def publish(self, change):
        self.details.append(detail(change))

    def send(self, detail_type, body):
        pass


def test_events_carry_the_state_and_delta_of_a_change_between_snapshots_without_a_read(local_table):
    written = Written(*local_table)
    written.create()
    old = written.state_item()
    written.report(1)
    new = written.state_item()
    recording = RecordingClient(written.client)
    events = Published()
    written.client.delete_item(TableName=written.name, Key={
        table.PARTITION_KEY: {"S": written.device_id}, table.SORT_KEY: {"S": change_sk(2)}})
    handle({"eventName": "MODIFY", "dynamodb": {"Keys": table.state_key(written.device_id), "OldImage": old,
                                                "NewImage": new}}, ChangeLog(recording, written.name), events)
    assert recording.calls == ["put_item"]
    assert table.STATE not in written.change_item(2)
    [body] = events.details
    assert body["delta"] == written.deltas[2] and body["state"] == written.shown[2]["state"]
