"""Connectivity at its edges: two connections closing at once (each close read the other
still open), a reconnect after that race, the push handler naming a connection by one end
at connect and disconnect, and devices that never connected in connectivity/connected."""

from __future__ import annotations

import threading
import time

import pytest


@pytest.fixture
def fleet(connectivity_fleet):
    return connectivity_fleet


def test_two_connections_closing_at_once_leave_the_device_disconnected(fleet):
    """Both closes were delivered; each disconnect read the item while the other was still
    open, so each took the 'others stay open' path. Nobody removes connectedSince, the index
    keeps the device under true, and no device.disconnected event can come (connectedSince
    never goes). The next connect keeps the old `since`."""
    manager = fleet
    manager.create("lamp", {})
    manager.connected("lamp", "conn-a", 4_000_000_000)
    manager.connected("lamp", "conn-b", 4_000_000_000)
    snapshot = manager.live_state("lamp")  # what both disconnect handlers read
    barrier = threading.Barrier(2)
    real = manager.live_state

    first_reads = set()

    def stale_read(device_id):
        if threading.get_ident() in first_reads:
            return real(device_id)  # a read after a refused write sees the item as it is
        first_reads.add(threading.get_ident())
        barrier.wait(timeout=10)  # both read before either writes
        return snapshot

    manager.live_state = stale_read
    threads = [threading.Thread(target=manager.disconnected, args=("lamp", conn, 4_000_000_000))
               for conn in ("conn-a", "conn-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    manager.live_state = real
    item = manager.live_state("lamp")
    print("item after both closes:", {k: v for k, v in item.items() if k in ("connections", "connectedSince")
                                      or k.startswith("ix")})
    shown = manager.get("lamp").as_dict()["connectivity"]
    print("GET connectivity:", shown)
    assert shown["connected"] is False  # the read judges it right...
    found, _ = manager.query_devices("eq(connectivity/connected,false)")
    print("eq(connectivity/connected,false) finds:", [d.device_id for d in found])
    # ...but the item still says connected since the first connect, and the index says true
    assert "connectedSince" not in item, "connectedSince survived both closes"
    assert [d.device_id for d in found] == ["lamp"], "a disconnected device is missing from connected=false"


def test_a_reconnect_after_two_closes_at_once_is_a_new_connected_since_with_its_event(fleet):
    """Follow-on of the race above: connectedSince is still there, so the next connect
    keeps it (`since` says connected since the first connection) and the stream sees no
    connectedSince appear, so no device.connected event either."""
    from functions.device_state import connectivity_event

    manager = fleet
    manager.create("lamp", {})
    manager.connected("lamp", "conn-a", 4_000_000_000)
    manager.connected("lamp", "conn-b", 4_000_000_000)
    snapshot = manager.live_state("lamp")
    real = manager.live_state
    stale = [snapshot, snapshot]  # both closes read before either wrote; later reads see the item
    manager.live_state = lambda device_id: stale.pop() if stale else real(device_id)
    manager.disconnected("lamp", "conn-a", 4_000_000_000)
    manager.disconnected("lamp", "conn-b", 4_000_000_000)
    manager.live_state = real
    before = manager.live_state("lamp")
    manager.connected("lamp", "conn-c", 4_000_000_000)
    after = manager.live_state("lamp")
    print("since before/after reconnect:", before.get("connectedSince"), after.get("connectedSince"))
    print("event for the reconnect:", connectivity_event(before, after))
    assert connectivity_event(before, after) is not None, "the reconnect publishes no device.connected"


def push_handler_on(monkeypatch, manager, subscriptions, device_id: str):
    """The push handler wired to ``manager`` and ``subscriptions``; returns ``event(route,
    connection_id)``: an event of that device's own connection (a client certificate: no expiry)."""
    from functions.auth.principals import Principal
    from functions.config import PushConfig
    from functions.push import handler
    from functions.push import services as push_services

    monkeypatch.setattr(handler, "services", lambda: (subscriptions, None))
    monkeypatch.setattr(handler, "devices", lambda: manager)
    monkeypatch.setattr(push_services, "devices", lambda: manager)  # the disconnect records through services
    monkeypatch.setenv("TABLE_NAME", manager.table_name)  # the connect reads the push configuration, uncached
    monkeypatch.setattr(handler, "push_config", PushConfig.from_environment)
    principal = Principal.device(device_id)

    def event(route, connection_id="Abc123="):
        return {"requestContext": {"routeKey": route, "connectionId": connection_id,
                                   "authorizer": {"principalId": principal.subject, **principal.as_context()}}}

    return event


def test_the_push_handler_closes_the_connection_it_recorded_across_a_second_boundary(fleet, monkeypatch):
    """$connect computes `until` twice (subscriptions.ends() for the member, then again in
    subscriptions.open() for the connection item's expiry). A second boundary between the
    two (a write sits between them) makes them differ for a certificate
    device (no token expiry); $disconnect then deletes a member that is not there and the
    device stays connected for the connection's 2 hours (and a 9th such leak makes it 429)."""
    from functions.push import handler
    from functions.push.subscriptions import Subscriptions

    manager = fleet
    manager.create("cert-lamp", {})

    class Ticking:  # a clock that crosses a second boundary at every call (as a 5-20 ms write may)
        def __init__(self):
            self.now = 1_800_000_000.0

        def __call__(self):
            self.now += 0.6
            return self.now

    event = push_handler_on(monkeypatch, manager, Subscriptions(manager.client, manager.table_name, clock=Ticking()),
                            "cert-lamp")
    assert handler.lambda_handler(event("$connect"), None) == {"statusCode": 200}
    print("members after connect:", manager.live_state("cert-lamp")["connections"]["SS"])
    assert handler.lambda_handler(event("$disconnect"), None) == {"statusCode": 200}
    item = manager.live_state("cert-lamp")
    print("members after disconnect:", item.get("connections"))
    assert manager.get("cert-lamp").as_dict()["connectivity"]["connected"] is False, \
        "closed connection still counts as open"


def test_a_device_at_its_cap_whose_closes_never_reached_its_item_connects_again(fleet, monkeypatch):
    """Two $disconnects deleted their connections' items but storage did not take the device's
    connectivity write, so their members stay, and the device is at its cap. The next connect
    reads the held connections' items, forgets the two that are gone and is recorded. With
    every held connection's item there (all open), a connect is refused 429, as before."""
    from functions.device_state.model.connectivity import MAX_CONNECTIONS, connection_of
    from functions.push import handler
    from functions.push.subscriptions import Subscriptions

    manager = fleet
    manager.create("lamp", {})
    subscriptions = Subscriptions(manager.client, manager.table_name)
    event = push_handler_on(monkeypatch, manager, subscriptions, "lamp")
    for number in range(MAX_CONNECTIONS):
        assert handler.lambda_handler(event("$connect", f"c{number}"), None) == {"statusCode": 200}
    for number in (0, 1):
        subscriptions.close(f"c{number}")  # the close's first part; its connectivity write never landed

    def held() -> list[str]:
        return sorted(connection_of(entry) for entry in manager.live_state("lamp")["connections"]["SS"])

    assert held() == [f"c{number}" for number in range(MAX_CONNECTIONS)]
    assert handler.lambda_handler(event("$connect", "c8"), None) == {"statusCode": 200}
    assert held() == ["c2", "c3", "c8"]
    assert handler.lambda_handler(event("$connect", "c9"), None) == {"statusCode": 200}
    refused = handler.lambda_handler(event("$connect", "c10"), None)
    assert refused["statusCode"] == 429 and held() == ["c2", "c3", "c8", "c9"]  # all open: nothing forgotten


def test_a_device_at_its_cap_whose_connections_died_without_a_disconnect_connects_again(fleet, monkeypatch, capsys):
    """API Gateway delivers $disconnect on a best-effort basis: connections that ended without one
    keep their items and their members, and four of them held a device's connects out (429) for
    their 2 hours. At the cap, a connect asks API Gateway about each held connection opened more
    than CONNECTING_SECONDS ago, and forgets those it answers gone; it never asks about one younger
    (API Gateway answers a connection whose $connect is still running as gone too). The control,
    the cap that reads the connections' items only, refuses the device."""
    from functions.device_state import TooManyConnections
    from functions.device_state.model.connectivity import MAX_CONNECTIONS, connection_of
    from functions.push import handler
    from functions.push.subscriptions import CONNECTING_SECONDS, Subscriptions

    manager = fleet
    manager.create("lamp", {})
    now = [time.time() - CONNECTING_SECONDS - 5]
    subscriptions = Subscriptions(manager.client, manager.table_name, clock=lambda: now[0])
    event = push_handler_on(monkeypatch, manager, subscriptions, "lamp")
    open_ids, asked = {"c2", "c3"}, []

    def known_gone(connection_id):
        asked.append(connection_id)
        return connection_id not in open_ids

    monkeypatch.setattr(handler.connections, "known_gone", known_gone)
    for number in range(MAX_CONNECTIONS):
        assert handler.lambda_handler(event("$connect", f"c{number}"), None) == {"statusCode": 200}
    now[0] = time.time()  # c0 and c1 ended since, and their $disconnect never came

    def held() -> list[str]:
        return sorted(connection_of(entry) for entry in manager.live_state("lamp")["connections"]["SS"])

    with pytest.raises(TooManyConnections):  # the control: items only, all still there
        manager.connected("lamp", "c7", subscriptions.ends(), closed=subscriptions.closed)
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    capsys.readouterr()
    assert handler.lambda_handler(event("$connect", "c8"), None) == {"statusCode": 200}
    assert held() == ["c2", "c3", "c8"] and sorted(asked) == ["c0", "c1", "c2", "c3"]
    assert forgotten_counted(capsys.readouterr().out) == [2]
    assert handler.lambda_handler(event("$connect", "c9"), None) == {"statusCode": 200}  # at the cap again
    asked.clear()
    open_ids.clear()  # every one gone by API Gateway's word; c8 and c9 younger than CONNECTING_SECONDS
    assert handler.lambda_handler(event("$connect", "c10"), None) == {"statusCode": 200}
    assert held() == ["c10", "c8", "c9"] and sorted(asked) == ["c2", "c3"]  # the young ones not asked, kept
    assert forgotten_counted(capsys.readouterr().out) == [2]


def forgotten_counted(output: str) -> list[float]:
    """The ConnectionsForgotten values of the EMF lines in ``output``."""
    import json

    from functions.device_state import metrics as names
    values = [document[names.CONNECTIONS_FORGOTTEN] for line in output.splitlines()
              if line.startswith("{") and names.CONNECTIONS_FORGOTTEN in (document := json.loads(line))]
    return [sum(value) if isinstance(value, list) else value for value in values]  # Powertools may list them


def test_a_connection_item_an_older_release_wrote_is_never_asked_about(fleet):
    """An item without openedAt (written before connections carried it) may belong to a
    $connect still running: it is not asked about, and counts until its end."""
    from functions.push.subscriptions import CONNECTION_PK_PREFIX, CONNECTION_SK, Subscriptions

    manager = fleet
    subscriptions = Subscriptions(manager.client, manager.table_name)
    manager.client.put_item(TableName=manager.table_name, Item={
        "deviceId": {"S": CONNECTION_PK_PREFIX + "old"}, "sk": {"S": CONNECTION_SK}, "subject": {"S": "device:lamp"},
        "expiresAt": {"N": str(int(time.time()) + 3600)}})
    asked = []
    assert subscriptions.closed(["old", "gone"], lambda connection_id: asked.append(connection_id) or True) == {
        "gone"} and asked == []


def test_a_device_that_never_connected_is_found_by_connected_false(fleet):
    """GET shows connected: false for a device created after the field was declared, but
    create writes no connectivity index attribute (only a connect or the reindex does), so
    the fleet query and count of connected=false disagree with GET."""
    manager = fleet
    manager.create("fresh", {})
    manager.create("was-on", {})
    manager.connected("was-on", "c1", 4_000_000_000)
    manager.disconnected("was-on", "c1", 4_000_000_000)
    print("GET fresh:", manager.get("fresh").as_dict()["connectivity"])
    found, _ = manager.query_devices("eq(connectivity/connected,false)")
    print("eq(connectivity/connected,false):", sorted(d.device_id for d in found),
          "count:", manager.count_devices("eq(connectivity/connected,false)"))
    assert sorted(d.device_id for d in found) == ["fresh", "was-on"]
