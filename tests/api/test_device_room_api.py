"""What a device's item holds beside its sections, over the real dev server (issue 39, row 4):
the confirmations of cleared desires and the metadata of removed leaves are bounded, counted,
and go with the section or leaf they belong to, so a desire that fits on a fresh device fits
on one whose sections equal a fresh one's, however it is written. The raw item is read from
DynamoDB Local beside the server."""

from __future__ import annotations

import json
import uuid
from types import SimpleNamespace

import pytest

from functions.device_state import table
from functions.device_state.client import dynamodb_client
from functions.device_state.item.room import MAX_STATE_ITEM_BYTES
from functions.device_state.model.values import from_attribute
from tests.api.test_http import launch
from tests.auth import bearer

pytestmark = pytest.mark.dynamodb_local
MERGE = {"Content-Type": "application/merge-patch+json"}
APP = bearer()  # a back-end with every right (reported's included)
NAME = 1023  # bytes of each member name: four levels make a 4,096-byte leaf pointer, the longest


@pytest.fixture(scope="module")
def server(dynamodb_local):
    name = f"room-{uuid.uuid4().hex[:8]}"
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=name, WORKERS="2",
                                STREAM_PROCESSOR="off")
    yield SimpleNamespace(request=candidate.request, client=dynamodb_client(dynamodb_local.endpoint, "us-east-1"),
                          table=name)
    process.terminate()
    process.wait(timeout=30)


def call(server, method, path, body=None, headers=None):
    status, _, payload = server.request(method, path, body, {**APP, **(headers or {})})
    return status, json.loads(payload) if payload else None


def stored(server, device: str) -> dict:
    """The device's state item as DynamoDB holds it, in plain values."""
    item = server.client.get_item(TableName=server.table, Key=table.state_key(device), ConsistentRead=True)["Item"]
    return {name: from_attribute(value) for name, value in item.items()}


def long_leaves(tag: str, count: int = 20) -> dict:
    """``count`` leaves, each under four members of 1,023 bytes (a 4,096-byte pointer)."""
    return {f"{tag}{index:02d}".ljust(NAME, "a"): {"b" * NAME: {"c" * NAME: {"d" * NAME: index}}}
            for index in range(count)}


def new_device(server, **sections) -> str:
    device = f"room-{uuid.uuid4().hex[:8]}"  # every id as long: the items compare byte for byte
    status, body = call(server, "POST", "/devices", {"deviceId": device, "state": {}, **sections})
    assert status == 201, body
    return device


def used_device(server) -> str:
    """The issue's device: 20 leaves of 4 KB pointers desired with clearOnConfirm, confirmed by
    the device (they leave desired), then removed from reported by a merge patch: both
    sections are {} again, as a fresh device's."""
    device = new_device(server)
    me = bearer(device=device)
    wanted = long_leaves("x")
    status, body = call(server, "PATCH", f"/devices/{device}/desired?clearOnConfirm=true", wanted, MERGE)
    assert status == 200, body
    status, body = call(server, "PATCH", f"/devices/{device}/reported", wanted, {**me, **MERGE})
    assert status == 200 and body["desired"] == {}, body
    status, body = call(server, "PATCH", f"/devices/{device}/reported", dict.fromkeys(wanted), {**me, **MERGE})
    assert status == 200 and (body["desired"], body["reported"]) == ({}, {}), body
    return device


WAYS = {  # a desired write as each route sends it: method, path, body, headers
    "read-modify-write": lambda device, desire: (
        "PATCH", f"/devices/{device}/desired?clearOnConfirm=true", desire, MERGE),
    "read-free first": lambda device, desire: ("PATCH", f"/devices/{device}/desired", desire, MERGE),
    "keyed": lambda device, desire: (
        "PATCH", f"/devices/{device}/desired", desire, {**MERGE, "Idempotency-Key": uuid.uuid4().hex}),
    "transaction": lambda device, desire: (
        "POST", "/transactions", {"operations": [{"deviceId": device, "section": "desired", "mergePatch": desire}]},
        {}),
}


def write_desire(server, way: str, device: str, desire: dict) -> tuple[int, dict]:
    method, path, body, headers = WAYS[way](device, desire)
    return call(server, method, path, body, headers)


def filling_desire(server, way: str) -> dict:
    """20 leaves of 4 KB pointers and a blob: a desire that, written ``way``, leaves a fresh
    device 2 KB short of the limit (less than one kept confirmation of a 4 KB pointer takes)."""
    probe, wanted = new_device(server), long_leaves("y")
    assert write_desire(server, way, probe, wanted)[0] == 200
    room = MAX_STATE_ITEM_BYTES - int(stored(server, probe)[table.ITEM_BYTES])
    return {**wanted, "blob": "z" * (room - 2048)}


@pytest.mark.parametrize("way", WAYS)
def test_a_desire_that_fits_a_fresh_device_fits_one_whose_sections_are_a_fresh_ones(server, way):
    desire = filling_desire(server, way)
    fresh, used = new_device(server), used_device(server)
    for device in (fresh, used):
        status, answer = write_desire(server, way, device, desire)
        assert status == 200, (device, answer)
    # the used device now holds what the fresh one holds, byte for byte by the size formula
    assert stored(server, used)[table.ITEM_BYTES] == stored(server, fresh)[table.ITEM_BYTES]
    status, device = call(server, "GET", f"/devices/{used}?include=metadata")
    assert device["desired"] == desire and set(device["metadata"]["reported"]) == set()


def test_a_merge_patch_null_removes_the_leafs_metadata_entry_in_the_same_request(server):
    device = new_device(server, reported={"a": 1, "b": 2, "o": {"x": 1, "y": 2}})
    for patch in ({"a": None}, {"o": {"x": None}}):  # read-free: each leaves its object a member
        status, body = call(server, "PATCH", f"/devices/{device}/reported", patch, MERGE)
        assert status == 200, body
    item = stored(server, device)
    assert item["reported"] == {"b": 2, "o": {"y": 2}}
    assert set(item[table.META_REPORTED]) == {"/b", "/o/y"}
    # a removal that leaves an object empty dates the empty object (now a leaf) by its own version
    status, emptied = call(server, "PATCH", f"/devices/{device}/reported", {"o": {"y": None}}, MERGE)
    assert status == 200 and emptied["reported"] == {"b": 2, "o": {}}
    status, shown = call(server, "GET", f"/devices/{device}?include=metadata")
    assert shown["metadata"]["reported"]["o"]["version"] == emptied["version"]
    assert set(stored(server, device)[table.META_REPORTED]) == {"/b", "/o"}
    # an object removed or replaced whole takes the entries of its leaves with it
    call(server, "PATCH", f"/devices/{device}/reported", {"p": {"q": {"r": 1}}, "s": {"t": 1}}, MERGE)
    status, body = call(server, "PATCH", f"/devices/{device}/reported", {"p": None, "s": 5}, MERGE)
    assert status == 200 and body["reported"] == {"b": 2, "o": {}, "s": 5}, body
    assert set(stored(server, device)[table.META_REPORTED]) == {"/b", "/o", "/s"}


def confirmed_and_cleared(server, device: str, desire: dict) -> dict:
    status, _ = call(server, "PATCH", f"/devices/{device}/desired?clearOnConfirm=true", desire, MERGE)
    assert status == 200
    status, body = call(server, "PATCH", f"/devices/{device}/reported", desire, {**bearer(device=device), **MERGE})
    assert status == 200, body
    return body


def test_kept_confirmations_are_bounded_in_bytes_the_newest_kept(server):
    """8 KB of them (docs/api.md): one of a 4 KB pointer, where the count (100) would keep five."""
    device = new_device(server)
    confirmed_and_cleared(server, device, long_leaves("x", 4))
    last = confirmed_and_cleared(server, device, long_leaves("w", 1))
    kept = stored(server, device)[table.STATUS_DESIRED]
    newest = next(iter(long_leaves("w", 1)))
    assert [leaf.split("/")[1] for leaf in kept] == [newest]
    status, shown = call(server, "GET", f"/devices/{device}?include=metadata")
    cleared = [name for name, below in shown["metadata"]["desired"].items() if "version" not in below]
    assert cleared == [newest]
    leaf = shown["metadata"]["desired"][newest]["b" * NAME]["c" * NAME]["d" * NAME]
    assert leaf["cleared"] is True and leaf["confirmedVersion"] == last["version"]


def test_kept_confirmations_go_with_desired_not_with_another_section(server):
    device = new_device(server, reported={"power": "off"})
    confirmed_and_cleared(server, device, {"power": "on"})
    call(server, "PUT", f"/devices/{device}", {"state": {"room": "hall"}})
    call(server, "PATCH", f"/devices/{device}/reported", {"uptime": 5}, MERGE)
    status, shown = call(server, "GET", f"/devices/{device}?include=metadata")
    assert shown["metadata"]["desired"]["power"]["cleared"] is True  # a state-only PUT leaves desired be
    status, body = call(server, "PUT", f"/devices/{device}/desired", {"desired": {}})
    assert status == 200 and body["desired"] == {}
    status, shown = call(server, "GET", f"/devices/{device}?include=metadata")
    assert shown["metadata"]["desired"] == {}
    assert table.STATUS_DESIRED not in stored(server, device)


def test_an_ack_that_needs_the_room_of_kept_confirmations_takes_it(server):
    device = new_device(server)
    me = bearer(device=device)
    confirmed_and_cleared(server, device, long_leaves("x", 1))
    status, wanted = call(server, "PATCH", f"/devices/{device}/desired", {"t": 1}, MERGE)
    assert status == 200
    call(server, "PUT", f"/devices/{device}", {"state": {"blob": ""}})  # read-modify-write: itemBytes exact
    room = MAX_STATE_ITEM_BYTES - int(stored(server, device)[table.ITEM_BYTES])
    status, body = call(server, "PUT", f"/devices/{device}", {"state": {"blob": "z" * (room - 100)}})
    assert status == 200, body
    ack = {"acks": [{"path": "/t", "version": wanted["version"], "code": 400, "reason": "r" * 256}]}
    status, body = call(server, "POST", f"/devices/{device}/desired/acks", ack, me)
    assert status == 200 and body["delta"] == {}, body
    assert set(stored(server, device)[table.STATUS_DESIRED]) == {"/t"}
