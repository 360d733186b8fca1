"""DeviceStateManager against both engines (moto and DynamoDB Local), single-threaded."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest
from boto3.dynamodb.conditions import Attr

from functions.device_state import (
    ConditionFailed,
    DeviceAlreadyExists,
    DeviceNotFound,
    DeviceStateManager,
    InvalidCursor,
    InvalidDeviceId,
    InvalidValue,
    ItemTooLarge,
    JsonPatch,
    MergePatch,
    Operation,
    VersionConflict,
)
from functions.device_state import table
from functions.device_state.feed.items import change_sk
from functions.device_state.item.fencing import Fence
from functions.device_state.item.room import BOOKKEEPING_BYTES
from functions.device_state.write.planner import Planner
from tests.helpers import RecordingClient


def recording(engine):
    client, name = engine
    spy = RecordingClient(client)
    return spy, DeviceStateManager(spy, name)


def raw_item(engine, device_id, sk=table.STATE_SK):
    client, name = engine
    return client.get_item(
        TableName=name, Key={"deviceId": {"S": device_id}, "sk": {"S": sk}}, ConsistentRead=True
    ).get("Item")


# ------------------------------------------------------------------ create / get


def test_create_starts_at_version_1_and_reads_back(manager):
    created = manager.create("lamp-1", {"power": "on", "brightness": 75})
    assert created.version == 1
    assert created.created_at == created.updated_at
    assert created.created_at.endswith("Z")
    read = manager.get("lamp-1")
    assert read == created
    assert read.state == {"power": "on", "brightness": Decimal(75)}


def test_create_of_existing_device_fails_and_changes_nothing(manager):
    manager.create("lamp-1", {"power": "on"})
    with pytest.raises(DeviceAlreadyExists) as caught:
        manager.create("lamp-1", {"power": "off"})
    assert caught.value.current.state == {"power": "on"}
    assert manager.get("lamp-1").version == 1
    assert manager.get("lamp-1").state == {"power": "on"}


def test_get_of_missing_device(manager):
    with pytest.raises(DeviceNotFound):
        manager.get("nothing-here")


@pytest.mark.parametrize("bad_id", ["", "a" * 129, "lamp 1", "lamp/1", "läm", "a#b", None, 5])
def test_bad_device_ids_are_refused_before_any_request(engine, bad_id):
    spy, manager = recording(engine)
    for call in (
        lambda: manager.get(bad_id),
        lambda: manager.create(bad_id, {}),
        lambda: manager.put(bad_id, {}),
        lambda: manager.replace(bad_id, {}),
        lambda: manager.update(bad_id, lambda s: s, 1),
        lambda: manager.update_with_retry(bad_id, lambda s: s),
        lambda: manager.delete(bad_id),
    ):
        with pytest.raises(InvalidDeviceId):
            call()
    assert spy.calls == []


@pytest.mark.parametrize("dots", [".", ".."])
def test_a_device_id_of_dots_is_created_by_no_write(manager, dots):
    """The pattern allows "." and "..", which no URL reaches (a client resolves /devices/.. to
    /): no create, put or transaction makes a device of them, and nothing is stored."""
    for call in (lambda: manager.create(dots, {}), lambda: manager.put(dots, {}),
                 lambda: manager.transact([Operation.create(dots, {})])):
        with pytest.raises(InvalidDeviceId, match="dot segments"):
            call()
    with pytest.raises(DeviceNotFound):
        manager.get(dots)


def test_longest_and_all_allowed_characters_in_device_id(manager):
    device_id = ("Az09._:-" * 16)[:128]
    assert manager.create(device_id, {}).device_id == device_id


# ------------------------------------------------------------- replace / put


def test_replace_with_expected_version(manager):
    manager.create("t-1", {"setpoint": 20})
    replaced = manager.replace("t-1", {"setpoint": 21}, expected_version=1)
    assert (replaced.version, replaced.state) == (2, {"setpoint": 21})
    with pytest.raises(VersionConflict) as caught:
        manager.replace("t-1", {"setpoint": 5}, expected_version=1)
    assert caught.value.current.version == 2
    assert caught.value.current.state == {"setpoint": 21}
    assert manager.get("t-1").state == {"setpoint": 21}


def test_replace_without_version_clobbers_but_still_bumps_by_one(manager):
    manager.create("t-1", {"a": 1})
    for expected in (2, 3, 4):
        assert manager.replace("t-1", {"a": expected}).version == expected
    device = manager.get("t-1")
    assert device.state == {"a": 4}
    assert device.created_at <= device.updated_at


def test_replace_of_missing_device(manager):
    with pytest.raises(DeviceNotFound):
        manager.replace("ghost", {"a": 1})
    with pytest.raises(DeviceNotFound):
        manager.replace("ghost", {"a": 1}, expected_version=1)
    with pytest.raises(DeviceNotFound):
        manager.get("ghost")


def test_put_creates_then_replaces(manager):
    device, created = manager.put("cfg-1", {"blob": "x"})
    assert created and device.version == 1
    device, created = manager.put("cfg-1", {"blob": "y"})
    assert not created and device.version == 2 and device.state == {"blob": "y"}
    assert device.created_at == manager.get("cfg-1").created_at


# ------------------------------------------------------------------ update


def test_update_at_expected_version(manager):
    manager.create("lamp-1", {"brightness": 50})
    updated = manager.update("lamp-1", MergePatch({"brightness": 75}), expected_version=1)
    assert (updated.version, updated.state) == (2, {"brightness": 75})
    assert manager.get("lamp-1") == updated


def test_a_version_named_as_text_or_a_bool_is_refused_before_anything_is_sent(engine):
    """Not a conflict saying "at version 1, not 1": the version named must be an int."""
    spy, manager = recording(engine)
    manager.create("lamp-1", {"n": 1})
    spy.calls.clear()
    for named in ("1", True, 1.0, -1):
        with pytest.raises(ValueError, match="expected_version must be an int"):
            manager.update("lamp-1", MergePatch({"n": 2}), expected_version=named)
        with pytest.raises(ValueError, match="expected_version must be an int"):
            manager.delete("lamp-1", expected_version=named)
        with pytest.raises(ValueError, match="expected_version must be an int"):
            Operation.check("lamp-1", expected_version=named)
    assert spy.calls == [] and manager.get("lamp-1").version == 1


def test_update_at_stale_version_is_a_conflict_carrying_the_current_device(engine):
    spy, manager = recording(engine)
    manager.create("lamp-1", {"brightness": 50})
    manager.update("lamp-1", MergePatch({"brightness": 75}), expected_version=1)
    spy.calls.clear()
    with pytest.raises(VersionConflict) as caught:
        manager.update("lamp-1", MergePatch({"brightness": 25}), expected_version=1)
    assert caught.value.expected_version == 1
    assert caught.value.current.version == 2
    assert caught.value.current.state == {"brightness": 75}
    assert spy.writes == []
    assert manager.get("lamp-1").state == {"brightness": 75}


def test_update_of_missing_device(manager):
    with pytest.raises(DeviceNotFound):
        manager.update("ghost", lambda s: s, expected_version=1)
    with pytest.raises(DeviceNotFound):
        manager.update_with_retry("ghost", lambda s: s)


def test_the_lost_update_of_the_issue_cannot_happen(manager):
    """A reads 50 and writes 75; B read 50 too and writes 25 later: B is refused."""
    manager.create("lamp-1", {"brightness": 50})
    seen_by_a = manager.get("lamp-1")
    seen_by_b = manager.get("lamp-1")
    manager.update("lamp-1", MergePatch({"brightness": 75}), expected_version=seen_by_a.version)
    with pytest.raises(VersionConflict):
        manager.update("lamp-1", MergePatch({"brightness": 25}), expected_version=seen_by_b.version)
    assert manager.get("lamp-1").state == {"brightness": 75}


def test_every_write_bumps_version_by_exactly_one(manager):
    manager.create("c-1", {"n": 0})
    for expected in range(2, 12):
        device = manager.update_with_retry("c-1", JsonPatch([{"op": "increment", "path": "/n", "value": 1}]))
        assert device.version == expected
    assert manager.get("c-1").state == {"n": 10}
    assert manager.get("c-1").version == 11


def test_update_fn_gets_a_copy_and_raising_stops_without_a_write(engine):
    spy, manager = recording(engine)
    manager.create("lamp-1", {"nested": {"a": 1}})
    calls = []

    def rule(state):
        calls.append(state)
        state["nested"]["a"] = 999  # mutating the copy must not leak anywhere
        raise PermissionError("business rule says no")

    spy.calls.clear()
    with pytest.raises(PermissionError):
        manager.update_with_retry("lamp-1", rule)
    assert len(calls) == 1
    assert spy.writes == []
    assert manager.get("lamp-1").state == {"nested": {"a": 1}}
    assert manager.get("lamp-1").version == 1


def test_update_fn_must_return_a_state(manager):
    manager.create("lamp-1", {})
    with pytest.raises(TypeError):
        manager.update_with_retry("lamp-1", lambda state: None)
    assert manager.get("lamp-1").version == 1


# --------------------------------------------------------- extra conditions


def test_extra_condition_true_writes(manager):
    manager.create("lamp-1", {"status": "online", "counter": 3})
    device = manager.update_with_retry(
        "lamp-1",
        JsonPatch([{"op": "increment", "path": "/counter", "value": -1}]),
        condition=Attr("state.status").eq("online") & Attr("state.counter").gt(0),
    )
    assert device.state["counter"] == 2


def test_extra_condition_false_is_condition_failed_not_a_retry(engine):
    client, name = engine
    attempts = []

    from functions.device_state import UpdateObserver

    class Observer(UpdateObserver):
        def attempt(self, device_id, attempt):
            attempts.append(attempt)

    manager = DeviceStateManager(client, name, observer=Observer())
    manager.create("lamp-1", {"status": "offline", "counter": 0})
    with pytest.raises(ConditionFailed) as caught:
        manager.update_with_retry(
            "lamp-1",
            JsonPatch([{"op": "increment", "path": "/counter", "value": -1}]),
            condition=Attr("state.counter").gt(0),
        )
    assert attempts == [1]
    assert caught.value.current.state == {"status": "offline", "counter": 0}
    assert manager.get("lamp-1").version == 1


def test_compare_and_swap_with_update_and_condition(manager):
    manager.create("lamp-1", {"status": "online", "lastUpdate": 100})
    cas = Attr("state.status").eq("online") & Attr("state.lastUpdate").lt(150)
    manager.update("lamp-1", MergePatch({"lastUpdate": 140}), expected_version=1, condition=cas)
    with pytest.raises(ConditionFailed):
        manager.update("lamp-1", MergePatch({"lastUpdate": 200}), expected_version=2,
                       condition=Attr("state.lastUpdate").lt(100))
    assert manager.get("lamp-1").state["lastUpdate"] == 140


# ------------------------------------------------------------------ delete


def test_delete_honours_expected_version(manager):
    manager.create("lamp-1", {"a": 1})
    manager.replace("lamp-1", {"a": 2})
    with pytest.raises(VersionConflict) as caught:
        manager.delete("lamp-1", expected_version=1)
    assert caught.value.current.version == 2
    assert manager.get("lamp-1").version == 2
    deleted = manager.delete("lamp-1", expected_version=2)
    assert deleted.state == {"a": 2}
    with pytest.raises(DeviceNotFound):
        manager.get("lamp-1")
    with pytest.raises(DeviceNotFound):
        manager.delete("lamp-1")


def test_a_device_created_again_continues_its_versions_so_an_old_etag_never_matches(manager):
    manager.create("lamp-1", {"a": 1})
    manager.replace("lamp-1", {"a": 2})
    assert manager.delete("lamp-1").version == 2  # as it was; the tombstone holds version 3
    again = manager.create("lamp-1", {"a": 3})
    assert again.version == 4 and again.state == {"a": 3}
    with pytest.raises(VersionConflict):
        manager.delete("lamp-1", expected_version=2)  # a stale If-Match of the first incarnation
    with pytest.raises(VersionConflict):
        manager.replace("lamp-1", {"a": 9}, expected_version=1)
    assert manager.get("lamp-1").version == 4


def test_a_tombstone_reads_as_absent_everywhere_and_expires(engine, manager):
    client, name = engine
    manager.create("lamp-1", {"a": 1})
    manager.delete("lamp-1")
    with pytest.raises(DeviceNotFound):
        manager.get("lamp-1")
    with pytest.raises(DeviceNotFound):
        manager.update_with_retry("lamp-1", lambda s: s)
    with pytest.raises(DeviceNotFound):
        manager.delete("lamp-1")
    assert manager.list_devices()[0] == []
    tombstone = client.get_item(TableName=name, Key=table.state_key("lamp-1"))["Item"]
    assert tombstone["version"] == {"N": "2"} and "state" not in tombstone and "deletedAt" in tombstone
    assert int(tombstone["expiresAt"]["N"]) == pytest.approx(time.time() + 30 * 24 * 3600, abs=60)


# ------------------------------------------------------------ values, limits


def test_decimals_are_exact_end_to_end(manager):
    manager.create("m-1", {"x": Decimal("0.1"), "big": Decimal("1" * 38), "tiny": Decimal("1E-130")})
    device = manager.update_with_retry("m-1", JsonPatch([{"op": "increment", "path": "/x", "value": Decimal("0.2")}]))
    assert device.state["x"] == Decimal("0.3")
    stored = manager.get("m-1").state
    assert stored["x"] == Decimal("0.3")
    assert stored["big"] == Decimal("1" * 38)
    assert stored["tiny"] == Decimal("1E-130")


def test_a_section_that_is_no_object_or_no_section_is_refused_naming_it(manager):
    with pytest.raises(InvalidValue, match="^desired must be a JSON object$") as caught:
        manager.create("s-1", {}, sections={"desired": [1]})
    assert caught.value.limit == "state-object"
    with pytest.raises(InvalidValue, match="not 'foo'") as caught:
        manager.create("s-1", {}, sections={"foo": {}})
    assert caught.value.limit == "section"
    with pytest.raises(DeviceNotFound):
        manager.get("s-1")


@pytest.mark.parametrize(
    "state, limit",
    [
        ({"x": Decimal("NaN")}, "number-finite"),
        ({"x": Decimal("Infinity")}, "number-finite"),
        ({"x": Decimal("1" * 39)}, "number-precision"),
        ({"x": Decimal("1E+126")}, "number-range"),
        ({"x": Decimal("1E-131")}, "number-range"),
        ({"x": 0.5}, "number-exact"),
        ({"": 1}, "member-name"),
        ("not an object", "state-object"),
    ],
)
def test_values_dynamodb_cannot_hold_are_refused_before_any_write(engine, state, limit):
    spy, manager = recording(engine)
    manager.create("v-1", {"ok": True})
    spy.calls.clear()
    for call in (
        lambda: manager.create("v-2", state),
        lambda: manager.put("v-1", state),
        lambda: manager.replace("v-1", state),
        lambda: manager.update_with_retry("v-1", lambda s: state),
    ):
        with pytest.raises(InvalidValue) as caught:
            call()
        assert caught.value.limit == limit
    assert spy.writes == []
    assert manager.get("v-1").state == {"ok": True}


def nested(depth):
    value = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def test_nesting_limit_is_dynamodbs(manager):
    deepest_allowed = nested(31)
    manager.create("deep", deepest_allowed)  # accepted by the engine too
    assert manager.get("deep").state == deepest_allowed
    with pytest.raises(InvalidValue) as caught:
        manager.create("deeper", nested(32))
    assert caught.value.limit == "nesting-depth"


def test_item_too_large_is_refused_before_any_write(engine):
    spy, manager = recording(engine)
    manager.create("big", {"blob": "x"})
    spy.calls.clear()
    too_big = {"blob": "x" * (400 * 1024)}
    with pytest.raises(ItemTooLarge):
        manager.create("big-2", too_big)
    with pytest.raises(ItemTooLarge):
        manager.replace("big", too_big)
    with pytest.raises(ItemTooLarge):
        manager.update_with_retry("big", lambda s: too_big)
    assert spy.writes == []
    assert manager.get("big").state == {"blob": "x"}


def test_largest_item_under_the_limit_is_stored_and_still_leased_and_written(local_table):
    """DynamoDB Local only: moto sizes items more coarsely than DynamoDB does. A state write
    leaves room for the bookkeeping later requests add (lease holder, journal, settle mark)."""
    manager = DeviceStateManager(*local_table)
    low, high = 400 * 1024 - 2000 - BOOKKEEPING_BYTES, 400 * 1024
    while high - low > 1:  # the largest state a write accepts, to the byte
        middle = (low + high) // 2
        try:
            Planner(manager.table_name, Fence(), time.time()).create("big", {"blob": "x" * middle}, None)
            low = middle
        except ItemTooLarge:
            high = middle
    with pytest.raises(ItemTooLarge):
        manager.create("big", {"blob": "x" * (low + 1)})
    state = {"blob": "x" * (low - 64)}  # room for the member "n" the patches below add (and "updated")
    manager.create("big", state)
    assert manager.get("big").state == state
    with manager.lease("big", ttl_seconds=30) as lease:
        for _ in range(20):  # compiled patches grow the journal between trims
            lease.manager.update_with_retry("big", MergePatch({"n": 1}))
        lease.manager.update_with_retry("big", lambda state: {**state, "n": 2})  # read-modify-write still fits
    assert manager.get("big").version == 22


# ---------------------------------------------------------------- expiry


def put_raw(engine, device_id, sk, expires_at, version=3):
    client, name = engine
    client.put_item(
        TableName=name,
        Item={
            "deviceId": {"S": device_id},
            "sk": {"S": sk},
            "version": {"N": str(version)},
            "state": {"M": {"old": {"BOOL": True}}},
            "createdAt": {"S": "2020-01-01T00:00:00.000Z"},
            "updatedAt": {"S": "2020-01-01T00:00:00.000Z"},
            "expiresAt": {"N": str(expires_at)},
        },
    )


def test_expired_items_read_as_absent(engine, manager):
    put_raw(engine, "gone", table.STATE_SK, int(time.time()) - 10)
    with pytest.raises(DeviceNotFound):
        manager.get("gone")
    with pytest.raises(DeviceNotFound):
        manager.update_with_retry("gone", lambda s: s)
    with pytest.raises(DeviceNotFound):
        manager.replace("gone", {})
    with pytest.raises(DeviceNotFound):
        manager.delete("gone")
    assert manager.list_devices()[0] == []
    created = manager.create("gone", {"new": True})
    # Versions continue while the expired item is there (4); DynamoDB Local 3.x, like DynamoDB's
    # TTL, may have deleted it already, and then the device starts anew (1).
    assert created.version in (1, 4)
    assert manager.get("gone").state == {"new": True}


def test_put_over_an_expired_item_creates_anew(engine, manager):
    put_raw(engine, "gone", table.STATE_SK, int(time.time()) - 10)
    device, created = manager.put("gone", {"new": True})
    assert created and device.version in (1, 4) and device.state == {"new": True}  # see above


def test_unexpired_item_with_a_ttl_is_present(engine, manager):
    put_raw(engine, "soon", table.STATE_SK, int(time.time()) + 3600)
    assert manager.get("soon").version == 3
    with pytest.raises(DeviceAlreadyExists):
        manager.create("soon", {})


# ---------------------------------------------------------------- listing


def test_list_pages_through_every_device_and_nothing_else(engine, manager):
    ids = {f"dev-{i}" for i in range(7)}
    for device_id in ids:
        manager.create(device_id, {"id": device_id})
    put_raw(engine, "dev-0", "lease#1", int(time.time()) + 3600)  # not a device state item
    put_raw(engine, "expired", table.STATE_SK, int(time.time()) - 1)
    seen, cursor, pages = [], None, 0
    while True:
        devices, cursor = manager.list_devices(limit=3, cursor=cursor)
        assert len(devices) <= 3
        seen.extend(d.device_id for d in devices)
        pages += 1
        if cursor is None:
            break
        assert pages < 20
    assert sorted(seen) == sorted(ids)


def put_item(engine, device_id, sk):
    client, name = engine
    client.put_item(TableName=name, Item={"deviceId": {"S": device_id}, "sk": {"S": sk}})


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_a_walk_reads_past_what_is_no_device_takes_every_cursor_back_and_ends(engine, manager, limit):
    """Whatever else the table holds (bookkeeping under keys no device has, long runs of a
    device's own other items), every page holds devices only, every cursor is taken back, each
    device comes once and the walk ends with None."""
    for sk in ("job", "ix:0a1b2c3d", "ix:4e5f6a7b", "ix:8c9d0e1f", "ix:2a3b4c5d"):
        put_item(engine, "~fleet-index", sk)
    put_item(engine, "connection#Zx9Q_abc=", "connection")
    devices, cursor = manager.list_devices(limit=limit)
    while cursor is not None:  # bookkeeping only: no device, and an end
        page, cursor = manager.list_devices(limit=limit, cursor=cursor)
        devices += page
    assert devices == []
    ids = {f"dev-{number}" for number in range(5)}
    for device_id in ids:
        manager.create(device_id, {})
        for number in range(30):
            put_item(engine, device_id, change_sk(number))
    seen, cursor, sizes = [], None, []
    while True:
        page, cursor = manager.list_devices(limit=limit, cursor=cursor)
        seen += [device.device_id for device in page]
        sizes.append(len(page))
        if cursor is None:
            break
        assert len(sizes) < 50
    assert sorted(seen) == sorted(ids)
    assert all(sizes[:-1]), sizes  # runs of 30 items that are no device: no page but the last is empty


def test_a_listing_page_reads_a_bounded_number_of_items(engine):
    """At most MAX_SCAN_CALLS_PER_PAGE Scan calls, each of at most MAX_SCAN_ITEMS_PER_CALL items."""
    from functions.device_state.fleet.listing import MAX_SCAN_CALLS_PER_PAGE, MAX_SCAN_ITEMS_PER_CALL

    client, name = engine
    spy = RecordingClient(client)
    for number in range(40):
        put_item(engine, f"other-{number}", "lease#1")
    devices, cursor = DeviceStateManager(spy, name).list_devices(limit=1)
    scans = [request for operation, request in spy.requests if operation == "scan"]
    assert devices == [] and 1 <= len(scans) <= MAX_SCAN_CALLS_PER_PAGE
    assert all(request["Limit"] <= MAX_SCAN_ITEMS_PER_CALL for request in scans)
    assert [request["Limit"] for request in scans][:3] == [1, 4, 20]  # growing while nothing is found


@pytest.mark.parametrize("cursor", ["", "!!!", "bm90IGpzb24", "WzEsMl0", "WyJhIGIiLCJzIl0",
                                    "WyJhIiwic3RhdGUiXQ.AAAAAAAAAAAAAAAAAAAAAA"])
def test_bad_cursors_are_refused(manager, cursor):
    with pytest.raises(InvalidCursor):
        manager.list_devices(limit=3, cursor=cursor)


def test_a_cursor_is_taken_by_any_manager_of_the_same_key_and_no_other(engine):
    """Every instance of a service shares its key; after the key is replaced, cursors issued
    before are refused (the client starts its walk again)."""
    client, name = engine
    key = b"the service's key, 32 bytes or more"
    for number in range(3):
        DeviceStateManager(client, name).create(f"k{number}", {})
    _, cursor = DeviceStateManager(client, name, cursor_key=key).list_devices(limit=1)
    assert DeviceStateManager(client, name, cursor_key=key).list_devices(limit=5, cursor=cursor)[0]
    for other in (b"a replaced key, 32 bytes or more", None):
        with pytest.raises(InvalidCursor, match="current cursor key"):
            DeviceStateManager(client, name, cursor_key=other).list_devices(limit=5, cursor=cursor)
    with pytest.raises(ValueError):
        DeviceStateManager(client, name, cursor_key=b"short")


@pytest.mark.parametrize("limit", [0, 101, -1, True, "5"])
def test_bad_limits_are_refused(manager, limit):
    with pytest.raises(ValueError):
        manager.list_devices(limit=limit)
