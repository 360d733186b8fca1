"""Desired and reported on the one state item: one version for every section, compiled
(read-free) section patches that set their per-leaf metadata in the same request, and
read-modify-write for what cannot compile. On moto and DynamoDB Local."""

from __future__ import annotations

from decimal import Decimal

import pytest

from functions.device_state import DeviceStateManager, ItemTooLarge, JsonPatch, MergePatch, PatchTestFailed
from functions.device_state.write.keyed import IdempotencyKey
from tests.helpers import RecordingClient


@pytest.fixture
def spied(engine):
    client, name = engine
    spy = RecordingClient(client)
    return DeviceStateManager(spy, name), spy


def versions(shown: dict) -> dict:
    """The metadata tree with only the versions (and confirmations)."""
    if "version" in shown and isinstance(shown["version"], int):
        return {key: value for key, value in shown.items() if key != "updatedAt"}
    return {key: versions(value) for key, value in shown.items()}


def test_sections_are_created_beside_the_state_under_one_version(manager):
    device = manager.create("lamp", {"room": "kitchen"}, sections={"desired": {"power": "on"}})
    assert (device.version, device.state, device.desired, device.reported) == (1, {"room": "kitchen"},
                                                                              {"power": "on"}, {})
    assert manager.get("lamp") == device
    shown = manager.get("lamp").as_dict()
    assert shown["delta"] == {"power": "on"} and "metadata" not in shown
    assert versions(manager.get("lamp").as_dict(include_metadata=True)["metadata"]) == {
        "desired": {"power": {"version": 1}}, "reported": {}}


def test_a_flat_section_patch_is_one_write_with_its_metadata(spied):
    manager, spy = spied
    manager.create("lamp", {"room": "kitchen"})
    spy.calls.clear()
    device = manager.update_with_retry("lamp", MergePatch({"power": "on", "brightness": 80}), section="desired")
    assert spy.calls == ["update_item"]
    assert (device.version, device.desired, device.state) == (2, {"power": "on", "brightness": 80},
                                                             {"room": "kitchen"})
    spy.calls.clear()
    device = manager.update_with_retry("lamp", JsonPatch([{"op": "increment", "path": "/uptime", "value": 5},
                                                          {"op": "add", "path": "/power", "value": "on"}]),
                                       section="reported")
    assert spy.calls == ["update_item"]
    assert device.version == 3 and device.reported == {"uptime": 5, "power": "on"}
    assert versions(manager.get("lamp").as_dict(include_metadata=True)["metadata"]) == {
        "desired": {"power": {"version": 2, "confirmedVersion": 3}, "brightness": {"version": 2}},
        "reported": {"uptime": {"version": 3}, "power": {"version": 3}}}
    assert manager.get("lamp").as_dict()["delta"] == {"brightness": 80}


def test_a_nested_merge_compiles_into_an_object_that_exists_and_reads_otherwise(spied):
    manager, spy = spied
    manager.create("lamp", {}, sections={"desired": {"schedule": {"on": "07:00"}}})
    spy.calls.clear()
    device = manager.update_with_retry("lamp", MergePatch({"schedule": {"off": "23:00"}}), section="desired")
    assert spy.calls == ["update_item"]
    assert device.desired == {"schedule": {"on": "07:00", "off": "23:00"}}
    spy.calls.clear()
    device = manager.update_with_retry("lamp", MergePatch({"timer": {"minutes": 5}}), section="desired")
    assert spy.calls == ["update_item", "update_item"]  # no parent: read-modify-write merges
    assert device.desired == {"schedule": {"on": "07:00", "off": "23:00"}, "timer": {"minutes": 5}}
    assert versions(manager.get("lamp").as_dict(include_metadata=True)["metadata"]["desired"]) == {
        "schedule": {"on": {"version": 1}, "off": {"version": 2}}, "timer": {"minutes": {"version": 3}}}


def test_what_cannot_compile_reads_and_is_checked_the_same(spied):
    manager, spy = spied
    manager.create("lamp", {}, sections={"reported": {"list": [1, 2]}})
    spy.calls.clear()
    device = manager.update_with_retry("lamp", JsonPatch([{"op": "add", "path": "/list/0", "value": 0}]),
                                       section="reported")
    assert spy.calls == ["get_item", "update_item"] and device.reported == {"list": [0, 1, 2]}
    with pytest.raises(PatchTestFailed):
        manager.update_with_retry("lamp", JsonPatch([{"op": "test", "path": "/list", "value": []}]),
                                  section="reported")
    assert manager.get("lamp").version == 2


def test_a_section_replace_renews_every_leaf_and_keeps_the_other_sections(manager):
    manager.create("lamp", {"room": "k"}, sections={"desired": {"a": 1}, "reported": {"a": 1}})
    device = manager.replace_section("lamp", "desired", {"a": 1, "b": {"c": 2}}, 1)
    assert (device.version, device.state, device.reported) == (2, {"room": "k"}, {"a": 1})
    assert versions(device.as_dict(include_metadata=True)["metadata"]["desired"]) == {
        "a": {"version": 2}, "b": {"c": {"version": 2}}}  # a is no longer confirmed: desired again since
    assert manager.get("lamp") == device


def test_a_state_write_leaves_the_sections_and_a_replace_keeps_the_sections_not_given(manager):
    manager.create("lamp", {"n": 1}, sections={"desired": {"a": 1}, "reported": {"b": 2}})
    manager.update_with_retry("lamp", MergePatch({"n": 2}))
    manager.update_with_retry("lamp", MergePatch({"o": {"x": 1}}))  # state: read-modify-write
    device = manager.replace("lamp", {"n": 3}, sections={"reported": {"b": 3}})
    assert (device.version, device.state, device.desired, device.reported) == (4, {"n": 3}, {"a": 1}, {"b": 3})
    device, created = manager.put("lamp", {"n": 4}, sections={"desired": {}})
    assert not created and (device.desired, device.reported) == ({}, {"b": 3})
    assert manager.get("lamp") == device


def test_a_device_stored_without_sections_gains_them_on_its_first_section_write(engine, spied):
    client, name = engine
    manager, spy = spied
    manager.create("old", {"n": 1})
    client.update_item(TableName=name, Key={"deviceId": {"S": "old"}, "sk": {"S": "state"}},
                       UpdateExpression="REMOVE desired, reported, metaDesired, metaReported")
    assert manager.get("old").as_dict()["desired"] == {}
    spy.calls.clear()
    device = manager.update_with_retry("old", MergePatch({"power": "on"}), section="desired")
    assert spy.calls == ["update_item", "update_item"]
    assert (device.version, device.desired, device.reported) == (2, {"power": "on"}, {})
    device = manager.update_with_retry("old", MergePatch({"power": "off"}), section="desired")
    assert device.desired == {"power": "off"} and device.version == 3


def test_a_write_that_reads_sheds_what_an_older_item_keeps_of_leaves_that_are_gone(engine, manager):
    """An item written before read-free removals took their leaves' metadata holds entries of
    removed leaves, and statuses of desires set again read-free: the next write that reads,
    whatever section it writes, leaves one entry per leaf and the statuses that count."""
    client, name = engine
    manager.create("old", {}, sections={"desired": {"power": "on"}, "reported": {"a": 1}})
    stale = int(manager.live_state("old")["metaReported"]["M"]["/a"]["N"])
    client.update_item(TableName=name, Key={"deviceId": {"S": "old"}, "sk": {"S": "state"}},
                       UpdateExpression="SET metaReported.#gone = :stale, metaDesired.#gone = :stale, "
                                        "statusDesired = :statuses",
                       ExpressionAttributeNames={"#gone": "/gone"},
                       ExpressionAttributeValues={":stale": {"N": str(stale)}, ":statuses": {"M": {
                           "/gone": {"M": {"v": {"N": "1"}, "c": {"BOOL": True}}}}}})
    device = manager.replace("old", {"room": "hall"})  # a state write
    assert (device.desired, device.reported) == ({"power": "on"}, {"a": 1})
    item = manager.live_state("old")
    assert set(item["metaReported"]["M"]) == {"/a"} and set(item["metaDesired"]["M"]) == {"/power"}
    assert "statusDesired" not in item and "clearPending" not in item
    assert manager.get("old").as_dict(include_metadata=True)["metadata"]["reported"]["a"]["version"] == 1


def test_delete_clears_every_section_and_the_version_goes_on(manager):
    manager.create("lamp", {}, sections={"desired": {"a": 1}, "reported": {"b": 1}})
    manager.delete("lamp")
    device = manager.create("lamp", {})
    assert (device.version, device.desired, device.reported) == (3, {}, {})
    assert manager.get("lamp").as_dict(include_metadata=True)["metadata"] == {"desired": {}, "reported": {}}


def test_every_section_counts_toward_the_item_size(manager):
    manager.create("lamp", {"big": "x" * 150_000}, sections={"desired": {"big": "y" * 150_000}})
    with pytest.raises(ItemTooLarge):
        manager.replace_section("lamp", "reported", {"big": "z" * 150_000})
    assert manager.get("lamp").version == 1


def test_a_keyed_section_write_replays_with_its_sections(manager):
    manager.create("lamp", {})
    key = IdempotencyKey("k-1", scope="PATCH", fingerprint="f")
    first = manager.update_with_retry("lamp", MergePatch({"power": "on"}), section="desired", idempotency=key)
    again = manager.update_with_retry("lamp", MergePatch({"power": "on"}), section="desired", idempotency=key)
    assert again.replayed and again.desired == first.desired == {"power": "on"} and again.version == 2
    assert again.as_dict(include_metadata=True)["metadata"] == first.as_dict(include_metadata=True)["metadata"]
    assert manager.get("lamp").version == 2


def test_numbers_in_sections_are_exact(manager):
    manager.create("lamp", {}, sections={"desired": {"t": Decimal("21.50")}, "reported": {"t": Decimal("21.5")}})
    assert manager.get("lamp").as_dict()["delta"] == {}


def test_a_transaction_sets_desired_on_many_devices_all_or_nothing(manager):
    from functions.device_state import Operation, TransactionFailed

    manager.create("a", {}, sections={"reported": {"power": "off"}})
    manager.create("b", {})
    devices = manager.transact([Operation.update("a", MergePatch({"power": "on"}), section="desired"),
                                Operation.update("b", MergePatch({"power": "on"}), section="desired"),
                                Operation.put("c", {"room": "hall"}, {"desired": {"power": "on"}})])
    assert [(d.device_id, d.version, d.desired) for d in devices] == [("a", 2, {"power": "on"}),
                                                                     ("b", 2, {"power": "on"}),
                                                                     ("c", 1, {"power": "on"})]
    assert manager.get("a").as_dict()["delta"] == {"power": "on"}
    assert versions(manager.get("a").as_dict(include_metadata=True)["metadata"]["desired"]) == {
        "power": {"version": 2}}
    with pytest.raises(TransactionFailed):
        manager.transact([Operation.update("a", MergePatch({"power": "off"}), section="desired"),
                          Operation.update("b", JsonPatch([{"op": "test", "path": "/power", "value": "x"}]),
                                           section="desired")])
    assert manager.get("a").desired == {"power": "on"} and manager.get("a").version == 2
