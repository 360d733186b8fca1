"""The device loop over the real dev server: an app sets desired with an expiry or clear on
confirm, the device (its own token) gets the delta by push, refuses or applies it and acks
or reports, and the app reads the outcome; acks are changes the feed and push carry. The
device's connectivity follows its own WebSocket connections and calls."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from websockets.sync.client import connect

from tests.api.test_http import launch
from tests.auth import bearer

pytestmark = pytest.mark.dynamodb_local
MERGE = {"Content-Type": "application/merge-patch+json"}
APP = bearer(("devices.read", "devices.write"))


@pytest.fixture(scope="module")
def events_file(tmp_path_factory):
    return tmp_path_factory.mktemp("events") / "events.jsonl"


@pytest.fixture(scope="module")
def server(dynamodb_local, events_file):
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"loop-{uuid.uuid4().hex[:8]}",
                                WORKERS="4", FLEET_INDEX="reported/power:string,connectivity/connected:boolean",
                                CHANGE_EVENTS_FILE=str(events_file))
    yield candidate
    process.terminate()
    process.wait(timeout=30)


def call(server, method, path, body=None, headers=None):
    status, answer_headers, payload = server.request(method, path, body, headers)
    return status, answer_headers, json.loads(payload) if payload else None


def new_lamp(server, **sections) -> str:
    device = f"lamp-{uuid.uuid4().hex[:8]}"
    status, _, _ = call(server, "POST", "/devices", {"deviceId": device, "state": {"room": "hall"}, **sections})
    assert status == 201
    return device


def receive_change(client, version: int, seconds: float = 20) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        message = json.loads(client.recv(timeout=max(deadline - time.monotonic(), 0.01)))
        if message["type"] == "change" and message["version"] == version:
            return message


def test_the_device_refuses_one_leaf_applies_another_and_the_app_sees_both(server):
    device = new_lamp(server, reported={"power": "off", "brightness": 10})
    me = bearer(device=device)
    with connect(f"ws://127.0.0.1:{server.port}/ws", additional_headers=me, open_timeout=10) as client:
        client.send(json.dumps({"action": "subscribe", "deviceId": device, "since": 1, "sections": ["desired"]}))
        assert json.loads(client.recv(timeout=20))["type"] == "subscribed"
        status, _, wanted = call(server, "PATCH", f"/devices/{device}/desired?expiresIn=3600",
                                 {"power": "on", "brightness": 150}, {**APP, **MERGE})
        assert status == 200 and wanted["delta"] == {"power": "on", "brightness": 150}
        pushed = receive_change(client, wanted["version"])
        assert pushed["delta"] == {"power": "on", "brightness": 150}
        # the device answers: brightness refused, power applied and reported
        status, _, acked = call(server, "POST", f"/devices/{device}/desired/acks", {"acks": [
            {"path": "/brightness", "version": wanted["version"], "code": 400, "reason": "out of range 0-100"},
            {"path": "/power", "version": wanted["version"], "code": 200}]}, me)
        assert status == 200 and acked["version"] == wanted["version"] + 1 and acked["delta"] == {"power": "on"}, acked
        ack_change = receive_change(client, acked["version"])
        assert ack_change["sections"] == ["desired"] and ack_change["delta"] == {"power": "on"}
        assert {(ack["path"], ack["code"]) for ack in ack_change["acks"]} == {("/brightness", 400), ("/power", 200)}
        status, _, reported = call(server, "PATCH", f"/devices/{device}/reported", {"power": "on"}, {**me, **MERGE})
        assert status == 200 and reported["delta"] == {}
    status, _, seen = call(server, "GET", f"/devices/{device}?include=metadata", headers=APP)
    brightness, power = seen["metadata"]["desired"]["brightness"], seen["metadata"]["desired"]["power"]
    assert brightness["ack"]["code"] == 400 and brightness["ack"]["reason"] == "out of range 0-100"
    assert power["confirmedVersion"] == reported["version"] and power["ack"]["code"] == 200
    assert power["expiresAt"] and "expired" not in power
    deadline = time.monotonic() + 20
    while True:  # the feed trails the writes by the stream's delay
        feed = call(server, "GET", f"/devices/{device}/changes?since={wanted['version']}", headers=APP)[2]
        if len(feed["changes"]) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [change.get("acks", []) != [] for change in feed["changes"]] == [True, False]
    # the fleet query sees the same delta: nothing asked of this device any more
    count = call(server, "GET", "/devices/count?filter=and(eq(reported/power,\"on\"),exists(delta))",
                 headers=APP)[2]
    assert count == {"count": 0}


def test_an_expired_desire_is_not_asked_for(server):
    device = new_lamp(server, reported={"heating": "off"})
    status, _, wanted = call(server, "PATCH", f"/devices/{device}/desired?expiresIn=1", {"heating": "on"},
                             {**APP, **MERGE})
    assert status == 200 and wanted["delta"] == {"heating": "on"}
    time.sleep(1.2)
    status, _, delta = call(server, "GET", f"/devices/{device}/delta", headers=bearer(device=device))
    assert status == 200 and delta["delta"] == {} and delta["version"] == wanted["version"]  # nothing was written
    shown = call(server, "GET", f"/devices/{device}?include=metadata", headers=APP)[2]
    assert shown["desired"] == {"heating": "on"} and shown["metadata"]["desired"]["heating"]["expired"] is True
    # a device that subscribes after the deadline is not told to act
    with connect(f"ws://127.0.0.1:{server.port}/ws", additional_headers=bearer(device=device),
                 open_timeout=10) as client:
        client.send(json.dumps({"action": "subscribe", "deviceId": device, "since": 1}))
        assert receive_change(client, wanted["version"])["delta"] == {}


def test_clear_on_confirm_over_http(server):
    device = new_lamp(server)
    status, _, wanted = call(server, "PUT", f"/devices/{device}/desired?clearOnConfirm=true",
                             {"desired": {"power": "on"}}, APP)
    assert status == 200
    status, _, reported = call(server, "PATCH", f"/devices/{device}/reported", {"power": "on"},
                               {**bearer(device=device), **MERGE})
    assert status == 200 and reported["desired"] == {}
    shown = call(server, "GET", f"/devices/{device}?include=metadata", headers=APP)[2]
    assert shown["metadata"]["desired"]["power"] == {"version": wanted["version"],
                                                     "confirmedVersion": reported["version"], "cleared": True}


def test_a_cleared_desires_confirmation_shows_beside_a_desired_member_named_version(server):
    """A member called "version" beside a confirmed, cleared leaf is a member like any other:
    the leaf's metadata still shows the confirmation, as it does beside a member called "z"."""
    device = new_lamp(server)
    for sibling in ("z", "version"):
        status, _, wanted = call(server, "PUT", f"/devices/{device}/desired?clearOnConfirm=true",
                                 {"desired": {"x": {"y": 1}}}, APP)
        status, _, reported = call(server, "PATCH", f"/devices/{device}/reported", {"x": {"y": 1}},
                                   {**bearer(device=device), **MERGE})
        assert status == 200 and reported["desired"] == {}
        assert call(server, "PATCH", f"/devices/{device}/desired", {"x": {sibling: 5}}, {**APP, **MERGE})[0] == 200
        shown = call(server, "GET", f"/devices/{device}?include=metadata", headers=APP)[2]["metadata"]["desired"]
        assert shown["x"]["y"] == {"version": wanted["version"], "confirmedVersion": reported["version"],
                                   "cleared": True}, (sibling, shown)
        assert shown["x"][sibling]["version"] > reported["version"]
        call(server, "PATCH", f"/devices/{device}/desired", {"x": None}, {**APP, **MERGE})


def test_acks_that_do_not_fit_are_refused_and_change_nothing(server):
    device = new_lamp(server, desired={"brightness": 150})
    me = bearer(device=device)
    cases = [
        ({"acks": [{"path": "/brightness", "version": 2, "code": 400}]}, me, 409, "desire-moved"),
        ({"acks": [{"path": "/power", "version": 1, "code": 400}]}, me, 409, "desire-moved"),
        ({"acks": [{"path": "/brightness", "version": 1, "code": 600}]}, me, 400, "bad-request"),
        ({"acks": [{"path": "brightness", "version": 1, "code": 400}]}, me, 400, "bad-request"),
        ({"acks": []}, me, 400, "bad-request"),
        ({"acks": [{"path": "/brightness", "version": 1, "code": 400, "extra": 1}]}, me, 400, "bad-request"),
        ({"acks": [{"path": "/brightness", "version": 1, "code": 400, "reason": "x" * 257}]}, me, 400,
         "invalid-value"),
        ({"acks": [{"path": "/brightness", "version": 1, "code": 400}]}, bearer(device="another"), 403, "forbidden"),
        ({"acks": [{"path": "/brightness", "version": 1, "code": 400}]}, APP, 403, "forbidden"),
    ]
    for body, headers, status, slug in cases:
        answer_status, _, problem = call(server, "POST", f"/devices/{device}/desired/acks", body, headers)
        assert (answer_status, problem["type"].rsplit(":", 1)[-1]) == (status, slug), (body, problem)
    for query in ("expiresIn=0", "expiresIn=2592001", "expiresIn=1.5", "clearOnConfirm=yes"):
        assert call(server, "PATCH", f"/devices/{device}/desired?{query}", {"a": 1}, {**APP, **MERGE})[0] == 400
    assert call(server, "PATCH", f"/devices/{device}/reported?expiresIn=5", {"a": 1}, MERGE)[0] == 400
    assert call(server, "GET", f"/devices/{device}", headers=APP)[2]["version"] == 1
    # a back-end with the report right may answer for the device
    status, _, acked = call(server, "POST", f"/devices/{device}/desired/acks",
                            {"acks": [{"path": "/brightness", "version": 1, "code": 500}]}, bearer(("devices.report",)))
    assert status == 200 and acked["delta"] == {}


def test_a_keyed_ack_applies_once_and_the_key_binds_the_desire_options(server):
    device = new_lamp(server, desired={"brightness": 150})
    keyed = {**bearer(device=device), "Idempotency-Key": uuid.uuid4().hex}
    body = {"acks": [{"path": "/brightness", "version": 1, "code": 202}]}
    first = call(server, "POST", f"/devices/{device}/desired/acks", body, keyed)
    again = call(server, "POST", f"/devices/{device}/desired/acks", body, keyed)
    assert first[0] == again[0] == 200 and first[2]["version"] == again[2]["version"] == 2
    key = {**APP, **MERGE, "Idempotency-Key": uuid.uuid4().hex}
    assert call(server, "PATCH", f"/devices/{device}/desired?expiresIn=60", {"a": 1}, key)[0] == 200
    assert call(server, "PATCH", f"/devices/{device}/desired?expiresIn=61", {"a": 1}, key)[0] == 422


def wait_for(check, seconds: float = 20):
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.2)


def test_connectivity_follows_the_devices_own_connections_and_calls(server, events_file):
    device = new_lamp(server)
    shown = call(server, "GET", f"/devices/{device}", headers=APP)[2]
    assert shown["connectivity"] == {"connected": False, "since": None, "lastSeen": None}
    # a back-end's connection says nothing of the device
    with connect(f"ws://127.0.0.1:{server.port}/ws", additional_headers=APP, open_timeout=10):
        assert call(server, "GET", f"/devices/{device}", headers=APP)[2]["connectivity"]["connected"] is False
    with connect(f"ws://127.0.0.1:{server.port}/ws", additional_headers=bearer(device=device), open_timeout=10):
        online = call(server, "GET", f"/devices/{device}", headers=APP)[2]
        assert online["connectivity"]["connected"] is True and online["connectivity"]["since"]
        found = call(server, "GET", "/devices?filter=eq(connectivity/connected,true)&limit=100", headers=APP)[2]
        assert device in [item["deviceId"] for item in found["items"]]
    offline = wait_for(lambda: (lambda answer: answer if not answer["connectivity"]["connected"] else None)(
        call(server, "GET", f"/devices/{device}", headers=APP)[2]))
    assert offline and offline["connectivity"]["since"] is None and offline["connectivity"]["lastSeen"]
    assert offline["version"] == 1  # connectivity is no version
    def connectivity_events():
        lines = events_file.read_text().splitlines() if events_file.exists() else []
        kinds = [event["detail-type"] for event in map(json.loads, lines)
                 if event["detail"].get("deviceId") == device and event["detail-type"].startswith("device.")]
        return kinds if len(kinds) >= 2 else None

    assert wait_for(connectivity_events) == ["device.connected", "device.disconnected"]
    # the device's own report records it seen, in the report's own write
    status, _, _ = call(server, "PATCH", f"/devices/{device}/reported", {"power": "on"},
                        {**bearer(device=device), **MERGE})
    assert status == 200
    after = call(server, "GET", f"/devices/{device}", headers=APP)[2]["connectivity"]["lastSeen"]
    assert after > offline["connectivity"]["lastSeen"]
