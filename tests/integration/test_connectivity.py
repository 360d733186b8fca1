"""Connectivity on the state item (connectivity.py): connects and disconnects of the
device's own WebSocket connections, lastSeen from its writes (in the same request) and its
reads (at most once a minute), none of it a new version; connectivity/connected in the
fleet index. On moto and DynamoDB Local (fleet queries: DynamoDB Local)."""

from __future__ import annotations

import pytest

from functions.device_state import MergePatch, OutcomeUnknown, TooManyConnections
from functions.device_state.model.connectivity import MAX_CONNECTIONS, member
from functions.device_state.write.store import SEND_ATTEMPTS, Store
from tests.helpers import once


def shown(manager, device_id, clock):
    return manager.get(device_id).as_dict(now=clock.now)["connectivity"]


def test_a_device_is_connected_while_a_connection_is_open(timed):
    manager, clock, _ = timed
    manager.create("lamp", {})
    assert shown(manager, "lamp", clock) == {"connected": False, "since": None, "lastSeen": None}
    assert manager.connected("lamp", "conn-a", clock.now + 7200)
    first = shown(manager, "lamp", clock)
    assert first["connected"] and first["since"] == first["lastSeen"]
    clock.now += 30
    manager.connected("lamp", "conn-b", clock.now + 7200)
    manager.disconnected("lamp", "conn-a", clock.now - 30 + 7200)
    second = shown(manager, "lamp", clock)
    assert second["connected"] and second["since"] == first["since"] and second["lastSeen"] > first["lastSeen"]
    manager.disconnected("lamp", "conn-b", clock.now + 7200)
    assert shown(manager, "lamp", clock)["connected"] is False
    assert shown(manager, "lamp", clock)["since"] is None
    assert manager.get("lamp").version == 1  # none of it is a version
    assert not manager.connected("ghost", "conn-c", clock.now + 60)


def test_a_connection_whose_close_never_came_ends_at_its_limit_and_is_forgotten(timed):
    manager, clock, _ = timed
    manager.create("lamp", {})
    manager.connected("lamp", "lost", clock.now + 60)
    clock.now += 61
    assert shown(manager, "lamp", clock)["connected"] is False
    for number in range(MAX_CONNECTIONS):
        manager.connected("lamp", f"conn-{number}", clock.now + 7200)
    assert len(manager.live_state("lamp")["connections"]["SS"]) == MAX_CONNECTIONS
    with pytest.raises(TooManyConnections):
        manager.connected("lamp", "one-too-many", clock.now + 7200)
    manager.connected("lamp", "conn-0", clock.now + 7200)  # the same connection again is no new one


@pytest.mark.parametrize("lost", [1, MAX_CONNECTIONS], ids=["one", "at-the-cap"])
def test_a_connect_after_connections_that_all_ended_unclosed_is_a_new_connected_period(timed, lost):
    """The device's connections all ended without their close (their $disconnect never came),
    so reads show it disconnected; its next connect starts a new connected period: since is that
    connect, not the lost ones', and the stream's images tell device.disconnected, then
    device.connected (where the connect alone kept the old since, and told nothing). At the cap
    the connect forgets the ended ones first, the same way."""
    from functions.device_state import connectivity_event

    manager, clock, spy = timed
    manager.create("lamp", {})
    images, update_item = [manager.live_state("lamp")], spy.update_item

    def imaged(**request):  # each write's new image, as the stream would carry it
        answer = update_item(**request)
        images.append(manager.live_state("lamp"))
        return answer

    spy.update_item = imaged
    for number in range(lost):
        manager.connected("lamp", f"lost-{number}", clock.now + 60)
    clock.now += 61
    assert shown(manager, "lamp", clock)["connected"] is False
    manager.connected("lamp", "next", clock.now + 7200)
    now = shown(manager, "lamp", clock)
    assert now["connected"] and now["since"] == now["lastSeen"]  # since this connect
    assert manager.live_state("lamp")["connections"]["SS"] == [member("next", clock.now + 7200)]
    events = [event[0] for event in map(connectivity_event, images, images[1:]) if event]
    assert events == ["device.connected", "device.disconnected", "device.connected"]
    manager.connected("lamp", "another", clock.now + 7200)  # connected already: no new period
    assert shown(manager, "lamp", clock)["since"] == now["since"]


def test_at_the_cap_connections_known_closed_are_forgotten_and_the_connect_recorded(timed):
    """``closed`` is asked about the held connections only at the cap with none past its end;
    those it names go (one write), then the connect; with none named, TooManyConnections."""
    manager, clock, _ = timed
    manager.create("lamp", {})
    until = clock.now + 7200
    for number in range(MAX_CONNECTIONS):
        manager.connected("lamp", f"conn-{number}", until, closed=lambda ids: pytest.fail(f"asked at {ids}"))
    asked = []

    def closed(connection_ids):
        asked.append(connection_ids)
        return {"conn-1", "conn-3"}

    assert manager.connected("lamp", "new", until, closed=closed)
    assert asked == [[f"conn-{number}" for number in range(MAX_CONNECTIONS)]]
    held = manager.live_state("lamp")["connections"]["SS"]
    assert sorted(held) == sorted(member(connection, until) for connection in ("conn-0", "conn-2", "new"))
    manager.connected("lamp", "fourth", until)
    with pytest.raises(TooManyConnections):
        manager.connected("lamp", "fifth", until, closed=lambda ids: set())
    assert len(manager.live_state("lamp")["connections"]["SS"]) == MAX_CONNECTIONS
    assert manager.get("lamp").version == 1


def test_the_devices_own_writes_and_reads_record_it_seen(timed):
    manager, clock, spy = timed
    manager.create("lamp", {})
    device = manager.as_device("lamp")
    spy.calls.clear()
    device.update_with_retry("lamp", MergePatch({"power": "on"}), section="reported")
    assert spy.calls == ["update_item"]  # in the same request
    assert shown(manager, "lamp", clock)["lastSeen"] is not None
    clock.now += 30
    spy.calls.clear()
    manager.saw(manager.get("lamp"))
    assert spy.calls == ["get_item"]  # seen 30 s ago: no write
    clock.now += 31
    manager.saw(manager.get("lamp"))
    assert spy.calls[-1] == "update_item" and shown(manager, "lamp", clock)["lastSeen"].startswith("2027")
    # a back-end's write does not make the device seen
    before = shown(manager, "lamp", clock)["lastSeen"]
    clock.now += 120
    manager.update_with_retry("lamp", MergePatch({"power": "off"}), section="desired")
    assert shown(manager, "lamp", clock)["lastSeen"] == before


def test_connectivity_connected_is_a_fleet_query_field(connectivity_fleet):
    manager = connectivity_fleet
    for device in ("a", "b", "c"):
        manager.create(device, {})
    manager.connected("a", "conn-a", 4_000_000_000)
    manager.connected("b", "conn-b", 4_000_000_000)
    manager.disconnected("b", "conn-b", 4_000_000_000)
    manager.connected("c", "ended", 1_000)  # a connection that ended unclosed long ago
    found, _ = manager.query_devices("eq(connectivity/connected,true)")
    assert [device.device_id for device in found] == ["a"]
    assert found[0].as_dict()["connectivity"]["connected"] is True
    listed, _ = manager.list_devices()  # a page sized by its items, connections (a string set) and all
    assert sorted((device.device_id, device.as_dict()["connectivity"]["connected"]) for device in listed) == [
        ("a", True), ("b", False), ("c", False)]
    assert manager.count_devices("eq(connectivity/connected,true)") == {"count": 1}
    assert manager.count_devices("eq(connectivity/connected,false)") == {"count": 1}  # b; c is stale at 1


@pytest.fixture
def rig(dynamodb_local, local_table):
    from tests.integration.test_faults import Rig

    rig = Rig(dynamodb_local, *local_table)
    yield rig
    rig.forwarder.close()


@pytest.mark.parametrize("between", [False, True], ids=["alone", "another-writer-between"])
def test_connect_and_disconnect_under_a_lost_answer_record_once(rig, between):
    """Adding or deleting a set member is the same write when sent again: a lost answer is
    resent, whoever wrote in between (another connection of the device here)."""
    rig.other.create("d", {})
    other = (lambda: rig.other.connected("d", "other", 4_000_000_000)) if between else None
    rig.forwarder.lose("UpdateItem", then=other)
    assert rig.manager.connected("d", "ours", 4_000_000_000)
    assert rig.forwarder.lost == ["UpdateItem"]
    item = rig.other.live_state("d")
    assert sorted(item["connections"]["SS"]) == sorted(["4000000000000:ours"] + ["4000000000000:other"] * between)
    rig.forwarder.lose("UpdateItem")
    rig.manager.disconnected("d", "ours", 4_000_000_000)
    shown = rig.other.get("d").as_dict()["connectivity"]
    assert shown["connected"] is bool(between) and rig.other.get("d").version == 1


def test_control_a_naive_connection_counter_counts_one_connect_twice(rig):
    import boto3
    from botocore.config import Config

    from functions.device_state import table

    rig.other.create("d", {})
    naive = boto3.session.Session().client(
        "dynamodb", endpoint_url=rig.forwarder.endpoint, region_name="us-east-1",
        config=Config(retries={"mode": "standard", "max_attempts": 3}, read_timeout=3))
    rig.forwarder.lose("UpdateItem")
    naive.update_item(TableName=rig.name, Key=table.state_key("d"), UpdateExpression="ADD openConnections :one",
                      ExpressionAttributeValues={":one": {"N": "1"}})
    assert rig.other.live_state("d")["openConnections"] == {"N": "2"}  # one connect, counted twice


def fill_to_one_place_left(rig, until: float) -> None:
    rig.other.create("d", {})
    for number in range(MAX_CONNECTIONS - 1):
        rig.other.connected("d", f"open-{number}", until)


def members(rig) -> list[str]:
    return sorted(rig.other.live_state("d")["connections"]["SS"])


@pytest.mark.parametrize("between", [False, True], ids=["alone", "another-connection-swapped-between"])
def test_a_connect_that_takes_the_last_place_under_a_lost_answer_is_connected_not_refused(rig, between):
    """The resend finds the cap full with its own first copy (and, between, another connection
    closed and a new one opened, so full again): the condition admits the member it adds, so the
    connect is told it connected (a 200, not a 429), the member held once."""
    until = 4_000_000_000
    fill_to_one_place_left(rig, until)

    def swap():
        rig.other.disconnected("d", "open-0", until)
        rig.other.connected("d", "newcomer", until)

    rig.forwarder.lose("UpdateItem", then=once(swap) if between else None, when=lambda body: b"ours" in body)
    assert rig.manager.connected("d", "ours", until) is True
    assert rig.forwarder.lost == ["UpdateItem"]
    kept = [f"open-{number}" for number in range(int(between), MAX_CONNECTIONS - 1)] + ["ours"] + ["newcomer"] * between
    assert members(rig) == sorted(f"{until * 1000}:{connection}" for connection in kept)
    assert len(kept) == MAX_CONNECTIONS


def test_a_connect_whose_every_answer_is_lost_is_outcome_unknown(rig):
    """Every send's answer lost (the store sends it SEND_ATTEMPTS times, DynamoDB's refusals
    lost too): it did land, so only "unknown" is true, and nothing says refused. The push
    handler answers that connect 503 (tests/unit/test_push_handler.py)."""
    until = 4_000_000_000
    fill_to_one_place_left(rig, until)
    rig.forwarder.lose("UpdateItem", times=SEND_ATTEMPTS, when=lambda body: b"ours" in body)
    with pytest.raises(OutcomeUnknown):
        rig.manager.connected("d", "ours", until)
    assert rig.forwarder.lost == ["UpdateItem"] * SEND_ATTEMPTS
    assert f"{until * 1000}:ours" in members(rig)


def test_control_a_naive_cap_refuses_the_resend_of_its_own_landed_connect(rig):
    """The cap alone in the condition: the first copy landed and took the last place, so the
    resend is refused, and its caller would answer 429 for a connection the device holds."""
    import boto3
    from botocore.config import Config

    from functions.device_state import table

    until = 4_000_000_000
    fill_to_one_place_left(rig, until)
    naive = boto3.session.Session().client(
        "dynamodb", endpoint_url=rig.forwarder.endpoint, region_name="us-east-1",
        config=Config(retries={"total_max_attempts": 1}, read_timeout=3))
    ours = f"{until * 1000}:ours"

    def naive_connect():
        naive.update_item(TableName=rig.name, Key=table.state_key("d"), UpdateExpression="ADD connections :ours",
                          ConditionExpression="size(connections) < :cap",
                          ExpressionAttributeValues={":ours": {"SS": [ours]}, ":cap": {"N": str(MAX_CONNECTIONS)}})

    rig.forwarder.lose("UpdateItem")
    with pytest.raises(Exception):  # noqa: B017 - the lost answer, whatever botocore calls it
        naive_connect()
    with pytest.raises(naive.exceptions.ConditionalCheckFailedException):
        naive_connect()
    assert ours in members(rig)  # refused, yet held


def test_connectivity_events_follow_connectedsince_and_a_delete_of_a_connected_device(timed):
    from functions.device_state import connectivity_event

    manager, clock, _ = timed
    manager.create("lamp", {})
    offline = manager.live_state("lamp")
    manager.connected("lamp", "conn-a", clock.now + 7200)
    online = manager.live_state("lamp")
    kind, detail = connectivity_event(offline, online)
    assert (kind, detail["deviceId"], detail["connected"]) == ("device.connected", "lamp", True)
    manager.connected("lamp", "conn-b", clock.now + 7200)
    assert connectivity_event(online, manager.live_state("lamp")) is None  # connected already
    before_delete = manager.live_state("lamp")
    manager.delete("lamp")
    deleted = manager.live_state("lamp") or Store(manager.client, manager.table_name).get_state("lamp")
    kind, detail = connectivity_event(before_delete, deleted)
    assert (kind, detail["connected"]) == ("device.disconnected", False) and detail["at"]
    assert connectivity_event(None, deleted) is None  # never connected in this record's view
