"""WebSocket push over the real dev server (its WebSocket process, stream processor and
fan-out consumer on DynamoDB Local), with real WebSocket clients."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import uuid

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from functions.auth.credentials import LEEWAY_SECONDS
from functions.auth.principals import ADMIN_SCOPE
from functions.device_state import table
from functions.device_state.feed.items import change_sk
from functions.device_state.model.connectivity import MAX_CONNECTIONS
from functions.device_state.client import dynamodb_client
from functions.push.subscriptions import CONNECTION_PK_PREFIX, MAX_SUBSCRIPTIONS, SUBSCRIPTION_SK_PREFIX
from tests.api.test_http import launch
from tests.auth import assertion, bearer, token
from tests.helpers import run_writers

pytestmark = pytest.mark.dynamodb_local
MERGE = {"Content-Type": "application/merge-patch+json"}
RECEIVE_SECONDS = 20
# 321 versions to three subscribers: the fan-out trails 16 writers by about 9 s on a quiet
# machine (measured: the writes take 6 s, the last version arrives 9 s after them; the same on
# the fan-out before subscriptions were moved on per page), two to three times that when the
# suite's other workers share the 2 cores. This test is about order and completeness, not lag.
BURST_RECEIVE_SECONDS = 60


@pytest.fixture(scope="module")
def server(dynamodb_local):
    table_name = f"push-{uuid.uuid4().hex[:8]}"
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=table_name, WORKERS="6")
    candidate.table = table_name
    yield candidate
    process.terminate()
    process.wait(timeout=30)


def _connect(server, credentials: dict | None = None, query=""):
    return connect(f"ws://127.0.0.1:{server.port}/ws{query}",
                   additional_headers=bearer() if credentials is None else credentials, open_timeout=10)


def _device(server, **state) -> str:
    device = f"push-{uuid.uuid4().hex[:8]}"
    assert server.request("POST", "/devices", {"deviceId": device, "state": state or {"n": 0}})[0] == 201
    return device


def _subscribe(client, device, since=0, **extra) -> dict:
    """The answer to a subscribe. Changes that come before it are kept for ``_changes``: the
    fan-out may send the device's first changes before the subscribe's own answer goes out, as
    a client takes them (by version) whenever they come."""
    client.send(json.dumps({"action": "subscribe", "deviceId": device, "since": since, **extra}))
    while True:
        message = json.loads(client.recv(timeout=RECEIVE_SECONDS))
        if message["type"] != "change":
            return message
        _early(client).append(message)


def _early(client) -> list:
    """The change messages a subscribe's answer came after, not yet taken by ``_changes``."""
    if not hasattr(client, "early_changes"):
        client.early_changes = []
    return client.early_changes


def _changes(client, device, until_version: int, seen: int = 0, seconds: float = RECEIVE_SECONDS) -> list[int]:
    """Versions received for ``device`` until ``until_version``, repeats (at or below the
    last seen) dropped as a client does; fails on a gap or on running out of time."""
    versions, deadline, early = [], time.monotonic() + seconds, _early(client)
    while seen < until_version:
        left = max(deadline - time.monotonic(), 0.01)
        message = early.pop(0) if early else json.loads(client.recv(timeout=left))
        if message["type"] != "change" or message["deviceId"] != device or message["version"] <= seen:
            continue
        assert message["previousVersion"] == seen or message["version"] == seen + 1, (seen, message)
        seen = message["version"]
        versions.append(seen)
    return versions


def test_subscribe_from_zero_receives_every_version_in_order_then_live_ones(server):
    device = _device(server)
    for n in range(1, 5):
        server.request("PATCH", f"/devices/{device}", {"n": n}, headers=MERGE)
    with _connect(server) as client:
        assert _subscribe(client, device) == {"type": "subscribed", "deviceId": device, "since": 0,
                                              "sections": ["state", "desired", "reported"]}
        assert _changes(client, device, 5) == [1, 2, 3, 4, 5]
        server.request("PATCH", f"/devices/{device}/desired", {"power": "on"}, headers=MERGE)
        message = json.loads(client.recv(timeout=RECEIVE_SECONDS))
        while message.get("version", 0) <= 5:
            message = json.loads(client.recv(timeout=RECEIVE_SECONDS))
        assert message["version"] == 6 and message["kind"] == "updated" and message["sections"] == ["desired"]
        assert message["delta"] == {"power": "on"} and message["patch"] == [
            {"op": "add", "path": "/desired/power", "value": "on"}]


def test_sixteen_writers_and_three_subscribers_each_see_every_version_once_in_order(server):
    device = _device(server)
    subscribers = [_connect(server) for _ in range(3)]
    try:
        for client in subscribers:
            assert _subscribe(client, device)["type"] == "subscribed"
        errors = run_writers(16, 20, lambda index, step: _write(server, device, index, step))
        assert not errors, errors
        received = {}

        def listen(number, client):
            received[number] = _changes(client, device, 1 + 16 * 20, seconds=BURST_RECEIVE_SECONDS)

        threads = [threading.Thread(target=listen, args=pair) for pair in enumerate(subscribers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=BURST_RECEIVE_SECONDS + 5)
        assert [received.get(number) for number in range(3)] == [list(range(1, 322))] * 3
    finally:
        for client in subscribers:
            client.close()


def _write(server, device, index, step):
    status = server.request("PATCH", f"/devices/{device}", {f"w{index}": step}, headers=MERGE)[0]
    assert status == 200, status


def test_a_client_that_reconnects_with_its_last_version_misses_nothing(server):
    device = _device(server)
    with _connect(server) as client:
        _subscribe(client, device)
        for n in range(1, 4):
            server.request("PATCH", f"/devices/{device}", {"n": n}, headers=MERGE)
        seen = _changes(client, device, 3)
    for n in range(4, 8):  # while it is away
        server.request("PATCH", f"/devices/{device}", {"n": n}, headers=MERGE)
    with _connect(server) as client:
        _subscribe(client, device, since=seen[-1])
        assert _changes(client, device, 8, seen=seen[-1]) == [4, 5, 6, 7, 8]


def test_unsubscribe_stops_the_messages(server):
    device = _device(server)
    with _connect(server) as client:
        _subscribe(client, device)
        _changes(client, device, 1)
        client.send(json.dumps({"action": "unsubscribe", "deviceId": device}))
        answer = json.loads(client.recv(timeout=RECEIVE_SECONDS))
        while answer["type"] == "change" and answer["version"] <= 1:  # a repeat (delivery is at least once)
            answer = json.loads(client.recv(timeout=RECEIVE_SECONDS))
        assert answer == {"type": "unsubscribed", "deviceId": device}
        server.request("PATCH", f"/devices/{device}", {"n": 9}, headers=MERGE)
        other = _device(server)  # the control: a subscription made after it still gets its changes
        _subscribe(client, other)
        assert _changes(client, other, 1) == [1]
        with pytest.raises(TimeoutError):
            while True:
                message = json.loads(client.recv(timeout=2))
                assert message.get("deviceId") != device, message


def test_a_device_may_follow_itself_only(server):
    own, foreign = _device(server), _device(server)
    with _connect(server, bearer(device=own)) as client:
        refused = _subscribe(client, foreign)
        assert refused["type"] == "error" and refused["problem"]["status"] == 403
        assert _subscribe(client, own)["type"] == "subscribed"  # the connection is still open
        assert _changes(client, own, 1) == [1]
    with _connect(server, bearer(["devices.write"])) as client:  # write does not imply read
        assert _subscribe(client, own)["problem"]["status"] == 403


def test_connect_needs_credentials_and_takes_a_token_in_the_query(server):
    for credentials in ({"Authorization": None}, {"Authorization": "Bearer nonsense"}):
        with pytest.raises(InvalidStatus) as refused:
            _connect(server, {name: value for name, value in credentials.items() if value})
        assert refused.value.response.status_code == 401
    device = _device(server)
    with _connect(server, {}, query=f"?token={token(device=device)}") as client:
        assert _subscribe(client, device)["type"] == "subscribed"


def test_a_browser_connects_with_its_token_as_a_subprotocol_and_gets_device_state_selected(server):
    """What a browser sends, new WebSocket(url, ["device-state", "bearer.<token>"]): no header of its
    own, no token in the URL. The answer selects "device-state" (a browser fails a connect that
    offered subprotocols and got none) and never echoes the token's entry."""
    device = _device(server)
    with connect(f"ws://127.0.0.1:{server.port}/ws", subprotocols=["device-state", f"bearer.{token(device=device)}"],
                 open_timeout=10) as client:
        assert client.subprotocol == "device-state"
        assert client.response.headers["Sec-WebSocket-Protocol"] == "device-state"
        assert _subscribe(client, device)["type"] == "subscribed"
    with connect(f"ws://127.0.0.1:{server.port}/ws", subprotocols=["device-state"],
                 additional_headers=bearer(), open_timeout=10) as client:  # a header token, the subprotocol asked
        assert client.subprotocol == "device-state"
    with _connect(server) as client:  # a client that offers none gets none, as before
        assert client.subprotocol is None and "Sec-WebSocket-Protocol" not in client.response.headers
    for offered in (["device-state", "bearer.nonsense"], ["device-state"],
                    ["device-state", f"bearer.{token()}", f"bearer.{token()}"]):
        with pytest.raises(InvalidStatus) as refused:
            connect(f"ws://127.0.0.1:{server.port}/ws", subprotocols=offered, open_timeout=10)
        assert refused.value.response.status_code == 401, offered
    with pytest.raises(InvalidStatus) as refused:  # a subprotocol token and a query token: two tokens
        connect(f"ws://127.0.0.1:{server.port}/ws?token={token()}", subprotocols=["device-state", f"bearer.{token()}"],
                open_timeout=10)
    assert refused.value.response.status_code == 401


def test_nothing_is_pushed_on_a_token_past_its_expiry(server):
    """Judged by when each message arrives (a reader thread stamps them): a repeat posted
    before the expiry may still be waiting in the client's buffer afterwards, as documented;
    nothing may arrive once the connection has ended, a repeat included (the step-by-step
    cases are in tests/integration/test_push_delivery.py)."""
    device = _device(server)
    # Past its exp already, but within the 60 s of leeway for clocks: valid for up to 4 more seconds.
    expires = int(time.time()) - LEEWAY_SECONDS + 4
    ends = expires + LEEWAY_SECONDS + IN_FLIGHT_SECONDS
    with _connect(server, bearer(exp=expires)) as client:
        _subscribe(client, device)
        arrivals = _stamp_arrivals(client)
        _wait_for(lambda: any(message.get("version") == 1 for _, message in arrivals))
        time.sleep(max(ends - time.time(), 0))  # the token expires; the connection stays open
        server.request("PATCH", f"/devices/{device}", {"n": 1}, headers=MERGE)
        time.sleep(3)  # the fan-out's time: the control below gets version 2 in it
        client.send(json.dumps({"action": "subscribe", "deviceId": device, "since": 1}))
        _wait_for(lambda: any(message["type"] == "error" for _, message in arrivals))
        late = [message for when, message in arrivals if when > ends and message["type"] == "change"]
        assert not late, late
        [refused] = [message for _, message in arrivals if message["type"] == "error"]
        assert refused["problem"]["status"] == 401 and "connect again" in refused["problem"]["detail"]
    with _connect(server) as client:  # the control: a fresh token gets the change it missed
        _subscribe(client, device, since=1)
        assert _changes(client, device, 2, seen=1) == [2]


IN_FLIGHT_SECONDS = 1  # a post made just before the connection's end may arrive this much later


def _stamp_arrivals(client) -> list:
    """(arrival time, message) of every message from now on, read by a thread of its own."""
    arrivals = []

    def read():
        try:
            for raw in client:
                arrivals.append((time.time(), json.loads(raw)))
        except ConnectionClosed:
            pass

    threading.Thread(target=read, daemon=True).start()
    return arrivals


def _wait_for(condition) -> None:
    deadline = time.monotonic() + RECEIVE_SECONDS
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("message, slug", [
    ("not json", "bad-message"), ("[1]", "bad-message"), ('{"action": "dance"}', "unknown-action"),
    ('{"action": "subscribe", "deviceId": "no spaces", "since": 0}', "invalid-device-id"),
    ('{"action": "subscribe", "deviceId": "d", "since": -1}', "bad-message"),
    ('{"action": "subscribe", "deviceId": "d", "since": 0, "sections": ["secret"]}', "bad-message"),
    ('{"action": "subscribe", "deviceId": "d", "since": 0, "extra": 1}', "bad-message"),
    ('{"action": "unsubscribe", "deviceId": "d", "extra": 1}', "bad-message"),
    ('{"action": "ping", "x": 1}', "bad-message"), ('{"action": ["ping"]}', "unknown-action"),
    ('{"action": "ping", "\\ud800": 1}', "bad-message"),  # a lone surrogate's name, echoed: an answer it crashed
    ('{"action": "subscribe", "deviceId": "d", "since": 0, "\\udfff": 1}', "bad-message"),
    ('{"action": "subscribe", "deviceId": "d", "since": 0, "sections": [["state"]]}', "bad-message"),
    ('{"action": "subscribe", "deviceId": "d", "since": 0, "sections": [{}]}', "bad-message"),
    ("[" * 2000 + "]" * 2000, "bad-message"), ('{"a":' * 1000 + "1" + "}" * 1000, "bad-message"),
    ('{"action": "subscribe", "deviceId": "not-created-yet", "since": 5}', "invalid-since"),
])
def test_bad_messages_get_errors_and_the_connection_survives(server, message, slug):
    with _connect(server) as client:
        client.send(message)
        answer = json.loads(client.recv(timeout=RECEIVE_SECONDS))
        assert answer["type"] == "error" and answer["problem"]["type"].endswith(slug), answer
        device = _device(server)
        assert _subscribe(client, device)["type"] == "subscribed"


def test_ping_is_answered_pong_while_the_token_is_valid_and_401_after(server):
    expires = int(time.time()) - LEEWAY_SECONDS + 2  # within the leeway: valid for up to 2 more seconds
    with _connect(server, bearer(exp=expires)) as client:
        client.send('{"action": "ping"}')
        assert json.loads(client.recv(timeout=RECEIVE_SECONDS)) == {"type": "pong"}
        time.sleep(max(expires + LEEWAY_SECONDS + 1 - time.time(), 0))
        for message in ('{"action": "ping"}', "not json"):  # every message, as a REST request would be
            client.send(message)
            refused = json.loads(client.recv(timeout=RECEIVE_SECONDS))
            assert refused["type"] == "error" and refused["problem"]["status"] == 401, refused
            assert "connect again" in refused["problem"]["detail"]


def test_a_device_connects_once_it_exists_so_that_its_cap_counts_every_connection(server):
    """A device's connects before its device existed were let in and never counted: six, then four
    more once created, ten in all against a cap of four (found by a hostile review)."""
    device = f"push-{uuid.uuid4().hex[:8]}"
    own = {"Authorization": f"Bearer {token(device=device)}"}
    with pytest.raises(InvalidStatus) as refused:
        _connect(server, own)
    assert refused.value.response.status_code == 404
    assert server.request("POST", "/devices", {"deviceId": device, "state": {}})[0] == 201
    _fills_its_cap(server, own)


def _fills_its_cap(server, own: dict) -> None:
    """``MAX_CONNECTIONS`` connects with the device's ``own`` headers are let in, one more is 429."""
    held = [_connect(server, own) for _ in range(MAX_CONNECTIONS)]
    try:
        with pytest.raises(InvalidStatus) as full:
            _connect(server, own)
        assert full.value.response.status_code == 429
    finally:
        for client in held:
            client.close()


def test_an_upgrade_with_two_tokens_is_refused_as_a_rest_request_is(server):
    device = _device(server)
    first, second = token(device=device), token()
    for credentials in ([("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")],
                        [("Authorization", f"Bearer {first}"), ("authorization", f"Bearer {first}")]):
        with pytest.raises(InvalidStatus) as refused:
            _connect(server, credentials)
        assert refused.value.response.status_code == 401
    for credentials, query in (({}, f"?token={first}&token={second}"),
                               ({"Authorization": f"Bearer {first}"}, f"?token={second}"),  # the header and another
                               ({"Authorization": f"Bearer {first}",
                                 "Sec-WebSocket-Protocol": f"bearer.{second}"}, "")):
        with pytest.raises(InvalidStatus) as refused:
            _connect(server, credentials, query=query)
        assert refused.value.response.status_code == 401
    assert server.request("GET", f"/devices/{device}", headers={  # the HTTP route's answer to the same
        "Authorization": f"Bearer {first}", "authorization": f"Bearer {second}"})[0] == 401
    with _connect(server, [("Authorization", f"Bearer {second}")]) as client:  # the control: one is enough
        assert _subscribe(client, device)["type"] == "subscribed"


def test_a_client_that_drops_without_a_close_frame_leaves_a_clean_log(server, dynamodb_local):
    device, logged = _device(server), len(server.log)
    client = _connect(server)
    _subscribe(client, device)
    client.socket.shutdown(socket.SHUT_RDWR)  # gone without a close frame, as a lost network is
    client.socket.close()
    subscriptions = {"TableName": server.table, "KeyConditionExpression": "#pk = :device AND begins_with(#sk, :sub)",
                     "ExpressionAttributeNames": {"#pk": table.PARTITION_KEY, "#sk": table.SORT_KEY},
                     "ExpressionAttributeValues": {":device": {"S": device}, ":sub": {"S": SUBSCRIPTION_SK_PREFIX}}}
    deadline = time.monotonic() + RECEIVE_SECONDS
    while dynamodb_client(dynamodb_local.endpoint).query(**subscriptions)["Items"]:  # until $disconnect has run
        assert time.monotonic() < deadline, "the dropped connection was never disconnected"
        time.sleep(0.1)
    time.sleep(1)  # the handler's thread ends right after $disconnect: what it logs on the way out is in by now
    assert "Traceback" not in server.log[logged:], server.log[logged:]


def test_only_an_upgrade_on_exactly_ws_reaches_the_websocket_api(server, dynamodb_local):
    status, _, _ = server.request("GET", "/ws")  # no Upgrade: refused before anything is connected
    assert status == 426
    items = dynamodb_client(dynamodb_local.endpoint).scan(
        TableName=server.table, FilterExpression="begins_with(#pk, :connection)",
        ExpressionAttributeNames={"#pk": table.PARTITION_KEY}, ExpressionAttributeValues={
            ":connection": {"S": CONNECTION_PK_PREFIX}})["Items"]
    opened = {item[table.PARTITION_KEY]["S"] for item in items}
    assert server.request("GET", "/ws")[0] == 426
    items = dynamodb_client(dynamodb_local.endpoint).scan(
        TableName=server.table, FilterExpression="begins_with(#pk, :connection)",
        ExpressionAttributeNames={"#pk": table.PARTITION_KEY}, ExpressionAttributeValues={
            ":connection": {"S": CONNECTION_PK_PREFIX}})["Items"]
    assert {item[table.PARTITION_KEY]["S"] for item in items} == opened  # nothing new connected
    for path in ("/ws/", "/wsx"):
        with pytest.raises(InvalidStatus) as refused:
            connect(f"ws://127.0.0.1:{server.port}{path}", additional_headers=bearer(), open_timeout=10)
        assert refused.value.response.status_code == 404


def test_two_hundred_clients_connecting_at_once_are_all_served(server):
    """A fleet reconnecting together (after a deploy, a network blip) all gets through."""
    clients, errors = [], []

    def join():
        for _ in range(10):  # as the clients do: a connect storage could not take (503) comes again after Retry-After
            try:
                clients.append(_connect(server))
                return
            except InvalidStatus as refused:
                if refused.response.status_code != 503:
                    errors.append(refused)
                    return
                time.sleep(float(refused.response.headers["Retry-After"]))
            except Exception as error:  # noqa: BLE001 - counted below
                errors.append(error)
                return
        errors.append("still 503 after 10 connects")

    threads = [threading.Thread(target=join) for _ in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert not errors and len(clients) == 200, (errors[:3], server.log[-6000:])
        device = _device(server)
        for client in clients[:5]:
            assert _subscribe(client, device)["type"] == "subscribed"
    finally:
        for client in clients:
            client.close()


def test_connects_over_a_devices_cap_are_429_never_401_and_a_close_frees_a_place(server):
    """Eight connects with one device token: MAX_CONNECTIONS are served, each one past them is
    refused 429 with Retry-After (the $connect integration's status and header), never 401, which a device takes for a bad token to renew or give up on."""
    device, another = _device(server), _device(server)
    device_credentials = bearer(device=device)
    opened, refused = [], []
    try:
        for _ in range(8):
            try:
                opened.append(_connect(server, device_credentials))
            except InvalidStatus as error:
                refused.append(error.response)
        assert len(opened) == MAX_CONNECTIONS
        assert [response.status_code for response in refused] == [429] * (8 - MAX_CONNECTIONS)
        assert not any(response.body for response in refused)
        assert {response.headers.get("Retry-After") for response in refused} == {"1"}
        with _connect(server, bearer(device=another)):  # the cap is per device
            pass
        opened.pop().close()
        deadline = time.monotonic() + RECEIVE_SECONDS
        while True:  # its $disconnect runs once the close is done
            try:
                opened.append(_connect(server, device_credentials))
                break
            except InvalidStatus as error:
                assert error.response.status_code == 429 and time.monotonic() < deadline, error
                time.sleep(0.1)
        assert _subscribe(opened[-1], device)["type"] == "subscribed"
    finally:
        for client in opened:
            client.close()


def test_too_many_subscriptions_is_an_error(server):
    with _connect(server) as client:
        for number in range(MAX_SUBSCRIPTIONS):
            client.send(json.dumps({"action": "subscribe", "deviceId": f"many-{number}", "since": 0}))
        answers = [json.loads(client.recv(timeout=RECEIVE_SECONDS))["type"] for _ in range(MAX_SUBSCRIPTIONS)]
        assert answers == ["subscribed"] * MAX_SUBSCRIPTIONS
        refused = _subscribe(client, "one-too-many")
        assert refused["type"] == "error" and refused["problem"]["type"].endswith("too-many-subscriptions")
        assert _subscribe(client, "many-0")["type"] == "subscribed"  # subscribing again to one it has is fine


def test_a_deleted_devices_deleted_change_is_pushed(server):
    device = _device(server)
    with _connect(server) as client:
        _subscribe(client, device, since=1, sections=["desired"])  # a delete comes whatever the sections
        assert server.request("DELETE", f"/devices/{device}")[0] == 204
        message = json.loads(client.recv(timeout=RECEIVE_SECONDS))
        assert (message["type"], message["kind"], message["version"], message["delta"]) == (
            "change", "deleted", 2, None)


def _credential_token(server, device: str) -> tuple[str, str]:
    """A device token minted from a secret registered on ``device``: (the token, the credential's id)."""
    status, _, body = server.request("POST", f"/devices/{device}/credentials", {"type": "secret"},
                                     headers=bearer((ADMIN_SCOPE,)))
    assert status == 201, body
    added = json.loads(body)
    status, _, body = server.request("POST", f"/devices/{device}/token", headers={
        "Authorization": f"Bearer {assertion(device, added['credentialId'], base64.b64decode(added['secret']))}"})
    assert status == 200, body
    return json.loads(body)["token"], added["credentialId"]


def _closed_with_nothing_after(client, last_version: int, seen: int) -> list[int]:
    """Receives until the service closes the connection: the versions after ``seen`` it got
    (repeats of those a client has, which the fan-out may send again, dropped as a client drops
    them); fails on a change past ``last_version`` or when the connection stays open."""
    deadline, versions = time.monotonic() + RECEIVE_SECONDS, []
    while True:
        try:
            message = json.loads(client.recv(timeout=max(deadline - time.monotonic(), 0.01)))
        except ConnectionClosed:
            return versions
        except TimeoutError:
            pytest.fail(f"the connection is still open {RECEIVE_SECONDS} s on")
        assert message.get("version", 0) <= last_version, message
        if message.get("version", 0) > seen:
            versions.append(message["version"])


@pytest.mark.parametrize("names_a_credential, ending", [(False, "delete"), (True, "delete"), (True, "revoke")],
                         ids=["plain-token-device-deleted", "credential-token-device-deleted", "credential-revoked"])
def test_a_devices_own_connection_ends_with_its_device_or_credential_and_a_back_ends_follows_on(
        server, names_a_credential, ending):
    """docs/api/feed-and-push.md: deleting a device closes its own connections once they heard the
    delete, whatever their token names (one naming no credential was left open, uncounted against
    the cap once the device was created again, and sent the new device's changes); revoking a
    credential, the delete included, closes those opened with it before anything more goes out.
    A back-end following the device hears the delete and what comes after."""
    device = _device(server)
    own_token, credential = _credential_token(server, device) if names_a_credential else (token(device=device), None)
    own_headers = {"Authorization": f"Bearer {own_token}"}
    with _connect(server, own_headers) as own, _connect(server) as back_end:
        for client in (own, back_end):
            assert _subscribe(client, device)["type"] == "subscribed"
            assert _changes(client, device, 1) == [1]
        if ending == "delete":
            assert server.request("DELETE", f"/devices/{device}")[0] == 204
            heard = _closed_with_nothing_after(own, 1 if names_a_credential else 2, seen=1)
            assert heard == ([] if names_a_credential else [2])  # the delete, which ends a device's follow
            assert server.request("POST", "/devices", {"deviceId": device, "state": {"n": 9}})[0] == 201
            assert _changes(back_end, device, 3, seen=1) == [2, 3]
        else:
            status, _, body = server.request("DELETE", f"/devices/{device}/credentials/{credential}",
                                             headers=bearer((ADMIN_SCOPE,)))
            assert status == 204, body
            assert server.request("PATCH", f"/devices/{device}", {"n": 1}, headers=MERGE)[0] == 200
            _closed_with_nothing_after(own, 1, seen=1)
            assert _changes(back_end, device, 2, seen=1) == [2]
    if not names_a_credential:  # the device connects again, and those connections count against its cap
        _fills_its_cap(server, own_headers)


def test_a_revoked_credentials_connections_that_follow_nothing_are_closed_and_free_the_devices_places(server):
    """A stolen token's holder opened the device's MAX_CONNECTIONS connections and subscribed to
    nothing: the revocation closed none of them (only subscriptions were looked at), they still
    answered pings, and the device with its new credential was refused 429 until the stolen
    token expired (found by a hostile review)."""
    device = _device(server)
    stolen, credential = _credential_token(server, device)
    idle = [_connect(server, {"Authorization": f"Bearer {stolen}"}) for _ in range(MAX_CONNECTIONS)]
    try:
        status, _, body = server.request("DELETE", f"/devices/{device}/credentials/{credential}",
                                         headers=bearer((ADMIN_SCOPE,)))
        assert status == 204, body
        for client in idle:
            with pytest.raises(ConnectionClosed):
                client.recv(timeout=RECEIVE_SECONDS)  # closed by the fan-out, nothing sent before
        renewed = {"Authorization": f"Bearer {_credential_token(server, device)[0]}"}
        with _connect(server, renewed) as own:  # a place under the cap
            assert _subscribe(own, device)["type"] == "subscribed"
    finally:
        for client in idle:
            client.close()


@pytest.mark.parametrize("names_a_credential", [False, True], ids=["plain-token", "credential-token"])
def test_a_deleted_devices_own_connections_that_follow_nothing_are_closed(server, names_a_credential):
    """A delete removes the connections from the device's item, and only subscriptions were looked
    at: an own connection that followed nothing stayed open, answering pings, through the delete
    and a create again (found by a hostile review). The delete's change names them."""
    device = _device(server)
    own_token = _credential_token(server, device)[0] if names_a_credential else token(device=device)
    with _connect(server, {"Authorization": f"Bearer {own_token}"}) as idle:
        assert server.request("DELETE", f"/devices/{device}")[0] == 204
        with pytest.raises(ConnectionClosed):
            idle.recv(timeout=RECEIVE_SECONDS)  # closed by the fan-out, nothing sent before


def test_a_gap_past_the_retention_found_by_the_fan_out_is_changes_expired_410(server, dynamodb_local):
    """The subscription is taken (version 1's change could still be on its way), and the fan-out,
    bringing it up to version 2, finds version 1's change gone: the same 410 the subscribe answers.

    The fan-out follows the change items' stream behind the processor that recorded them. Where
    it reaches version 1's record only after the subscription, it sends version 1 from the stream,
    which is right (the change is known; under real TTL its record is long gone from the stream)
    and shows nothing of the gap: then the test checks that the subscriber got versions 1 and 2,
    and tries again with a new device. It needs the 410 once."""
    for _ in range(5):
        device = _device(server)
        deadline = time.monotonic() + RECEIVE_SECONDS
        while not json.loads(server.request("GET", f"/devices/{device}/changes?since=0")[2])["changes"]:  # recorded
            assert time.monotonic() < deadline
            time.sleep(0.1)
        dynamodb_client(dynamodb_local.endpoint).delete_item(  # past the retention, as TTL would have it
            TableName=server.table, Key={table.PARTITION_KEY: {"S": device}, table.SORT_KEY: {"S": change_sk(1)}})
        with _connect(server) as client:
            assert _subscribe(client, device, since=0)["type"] == "subscribed"
            server.request("PATCH", f"/devices/{device}", {"n": 1}, headers=MERGE)
            if _early(client):  # the stream's version 1, sent before the subscribe's answer
                assert _changes(client, device, 2) == [1, 2]
                continue
            message = json.loads(client.recv(timeout=RECEIVE_SECONDS))
            if message["type"] == "change":  # the stream's version 1, after the answer
                assert message["version"] == 1 and _changes(client, device, 2, seen=1) == [2], message
                continue
            assert message["type"] == "error" and message["problem"]["type"].endswith("changes-expired"), message
            assert message["problem"]["status"] == 410 and message["problem"]["currentVersion"] == 2, message
            return
    pytest.fail("five times the fan-out reached version 1's stream record only after the subscription")


def test_since_past_the_retention_is_changes_expired_and_since_past_the_device_is_refused(server, dynamodb_local):
    device = _device(server)
    server.request("PATCH", f"/devices/{device}", {"n": 1}, headers=MERGE)
    with _connect(server) as client:
        _subscribe(client, device)
        _changes(client, device, 2)  # both changes are recorded
        refused = _subscribe(client, device, since=99)
        assert refused["problem"]["type"].endswith("invalid-since"), refused
    client = dynamodb_client(dynamodb_local.endpoint)  # version 1's change passes the retention (as TTL would)
    client.delete_item(TableName=server.table, Key={table.PARTITION_KEY: {"S": device},
                                                    table.SORT_KEY: {"S": change_sk(1)}})
    with _connect(server) as client:
        refused = _subscribe(client, device, since=0)
        assert refused["problem"]["type"].endswith("changes-expired") and refused["problem"]["currentVersion"] == 2
        assert _subscribe(client, device, since=1)["type"] == "subscribed"  # the control: from 1 it is all there
