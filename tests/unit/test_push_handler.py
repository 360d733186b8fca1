"""The WebSocket handler's answers that need no table: a message on a connection whose token
has expired since it connected is answered (401, connect again), never a handler failure; a
connect over the device's cap is 429 and counted, one with a credential the device no longer holds
401 and counted; a connect, a message or a disconnect storage does not take is answered (503 for
the client to connect again) and leaves the device no connection it did not get."""

from __future__ import annotations

import time

import pytest

from functions.auth.principals import Principal
from functions.device_state import CredentialRevoked, OutcomeUnknown, StorageUnavailable, TooManyConnections
from functions.device_state import metrics as names
from functions.device_state import table
from functions.device_state.model.connectivity import MAX_CONNECTIONS, member
from functions.push import connections, handler
from functions.push import services as push_services
from functions.push.subscriptions import CONNECTION_PK_PREFIX, DEVICES, Subscriptions
from tests.api.test_metrics_and_openapi import emitted_metrics
from tests.helpers import served


def _connect_event(principal: Principal) -> dict:
    """A $connect as the authorizer passes it on: connection c1 of ``principal``."""
    return {"requestContext": {"routeKey": "$connect", "eventType": "CONNECT", "connectionId": "c1",
                               "authorizer": {"principalId": principal.subject, **principal.as_context()}}}


@pytest.fixture
def posted(monkeypatch):
    sent = []
    monkeypatch.setattr(handler.connections, "post", lambda connection, message: sent.append((connection, message)))
    monkeypatch.setattr(handler, "services", lambda: (None, None))
    return sent


def _event(expires_at: int) -> dict:
    principal = Principal.client("svc", ["devices.read"], expires_at=expires_at)
    return {"requestContext": {"routeKey": "subscribe", "connectionId": "c1",
                               "authorizer": {"principalId": principal.subject, **principal.as_context()}},
            "body": '{"action": "subscribe", "deviceId": "lamp-1", "since": 0}'}


def test_a_message_after_the_token_expired_is_answered_401(posted):
    assert handler.lambda_handler(_event(int(time.time()) - 3600), None) == {"statusCode": 200}
    [(connection, message)] = posted
    assert connection == "c1" and message["type"] == "error" and message["problem"]["status"] == 401
    assert "connect again" in message["problem"]["detail"]


class _FullDevice:
    """A device holding its most connections already."""

    def as_device(self, device_id, holder):
        return self

    def connected(self, device_id, connection_id, until, closed=None):
        raise TooManyConnections(device_id, MAX_CONNECTIONS)


class _RevokedDevice(_FullDevice):
    """A device that no longer holds the credential its caller comes with."""

    def as_device(self, device_id, holder):
        assert holder is not None and holder.credential_id == "c" * 16
        return self

    def connected(self, device_id, connection_id, until, closed=None):
        raise CredentialRevoked(device_id)


class _UnknownDevice(_FullDevice):
    """A device that does not exist (yet, or any more)."""

    def connected(self, device_id, connection_id, until, closed=None):
        return False


class _Subscriptions:
    def ends(self, credential_ends):
        return credential_ends

    def open(self, *_):
        pass  # the connection item comes first: a refused connect leaves it to expire unused

    def closed(self, connection_ids):
        return set()  # every held connection open


@pytest.mark.parametrize("device, answer, metric", [
    (_FullDevice, {"statusCode": 429, "headers": {"Retry-After": "1"}}, names.CONNECTIONS_REFUSED),
    (_RevokedDevice, {"statusCode": 401}, names.REVOKED_CREDENTIAL_REQUESTS),
    (_UnknownDevice, {"statusCode": 404}, names.CONNECTIONS_REFUSED),  # it was let in, its cap never counting it
], ids=["over-the-cap", "credential-revoked", "no-such-device"])
def test_a_refused_connect_is_answered_and_counted(monkeypatch, capsys, device, answer, metric):
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    monkeypatch.setenv("TABLE_NAME", "devices")
    handler.push_config.cache_clear()
    monkeypatch.setattr(handler, "services", lambda: (_Subscriptions(), None))
    monkeypatch.setattr(handler, "devices", lambda: device())
    principal = Principal.device("lamp-1", expires_at=int(time.time()) + 3600, auth_time=int(time.time()),
                                 credential_id="c" * 16)
    event = _connect_event(principal)
    try:
        assert handler.lambda_handler(event, None) == answer
    finally:
        handler.push_config.cache_clear()
    assert (names.NAMESPACE, metric) in emitted_metrics(capsys.readouterr().out)


class _OpenDevice(_FullDevice):
    def connected(self, device_id, connection_id, until, closed=None):
        return True


class _Opened(_Subscriptions):
    """Subscriptions that record when each connection opened ends."""

    def __init__(self):
        self.ends_at = {}

    def open(self, connection_id, subject, ends, holder):
        self.ends_at[connection_id] = ends


@pytest.mark.parametrize("credential_expires_in, ends_in", [(None, 3600 + 60), (100, 100), (7200, 3600 + 60)],
                         ids=["never-expires", "credential-first", "token-first"])
def test_a_devices_connection_ends_with_its_token_or_its_credential_whichever_comes_first(
        monkeypatch, credential_expires_in, ends_in):
    """The token's expiry with the routes' leeway, but never past the credential's own expiry,
    which no later request would pass either."""
    monkeypatch.setenv("TABLE_NAME", "devices")
    handler.push_config.cache_clear()
    opened = _Opened()
    monkeypatch.setattr(handler, "services", lambda: (opened, None))
    monkeypatch.setattr(handler, "devices", lambda: _OpenDevice())
    now = int(time.time())
    principal = Principal.device("lamp-1", expires_at=now + 3600, auth_time=now, credential_id="c" * 16,
                                 credential_expires_at=None if credential_expires_in is None
                                 else now + credential_expires_in)
    event = _connect_event(principal)
    try:
        assert handler.lambda_handler(event, None)["statusCode"] == 200
    finally:
        handler.push_config.cache_clear()
    assert opened.ends_at == {"c1": now + ends_in}


class _Unreachable(_Opened):
    def open(self, connection_id, subject, ends, holder):
        raise StorageUnavailable("DynamoDB did not answer")


class _Recorded(_FullDevice):
    """A device's connectivity: its members as the model names them (connection and end)."""

    def __init__(self, fails: Exception | None = None):
        self.members, self.fails = set(), fails

    def connected(self, device_id, connection_id, until, closed=None):
        if self.fails is not None:
            raise self.fails
        self.members.add(member(connection_id, until))
        return True

    def disconnected(self, device_id, connection_id, until):
        self.members.discard(member(connection_id, until))


def _device_connects(monkeypatch, subscriptions, device) -> dict:
    monkeypatch.setenv("TABLE_NAME", "devices")
    handler.push_config.cache_clear()
    monkeypatch.setattr(handler, "services", lambda: (subscriptions, None))
    monkeypatch.setattr(handler, "devices", lambda: device)
    now = int(time.time())
    principal = Principal.device("lamp-1", expires_at=now + 3600, auth_time=now, credential_id="c" * 16)
    event = _connect_event(principal)
    try:
        return handler.lambda_handler(event, None)
    finally:
        handler.push_config.cache_clear()


def test_a_connect_whose_connection_cannot_be_stored_is_503_and_records_no_connectivity(monkeypatch):
    """DynamoDB not answering a connect (a fleet reconnecting at once): the client is told to come
    back, not an internal error, and the device holds no member for a connection it never got (4
    such would refuse its connects 429 for the 2 hours a connection may last)."""
    recorded = _Recorded()
    assert _device_connects(monkeypatch, _Unreachable(), recorded) == {"statusCode": 503,
                                                                         "headers": {"Retry-After": "1"}}
    assert recorded.members == set()
    opened = _Opened()
    assert _device_connects(monkeypatch, opened, recorded)["statusCode"] == 200  # the control: it records
    assert recorded.members == {member("c1", opened.ends_at["c1"])}


@pytest.mark.parametrize("error", [StorageUnavailable("DynamoDB did not answer"),
                                   OutcomeUnknown("lamp-1", "the answer was lost")], ids=["unavailable", "unknown"])
def test_a_connect_whose_cap_and_credential_cannot_be_checked_is_503(monkeypatch, error):
    """The connect's own write checks the cap and the credential: not taken, nothing was checked."""
    assert _device_connects(monkeypatch, _Opened(), _Recorded(fails=error)) == {"statusCode": 503,
                                                                                "headers": {"Retry-After": "1"}}


class _Closing:
    """A store whose connection item comes back deleted, and whose subscription deletes fail."""

    def send(self, operation, mode, **request):
        assert operation == "delete_item"
        if request["Key"][table.PARTITION_KEY]["S"].startswith(CONNECTION_PK_PREFIX):
            return {"Attributes": {"subject": {"S": Principal.device("lamp-1").subject},
                                   table.TTL_ATTRIBUTE: {"N": "1900000000"}, DEVICES: {"SS": ["lamp-1", "lamp-2"]}}}
        raise StorageUnavailable("DynamoDB did not answer")


def test_a_disconnect_storage_partly_refuses_still_leaves_the_devices_connectivity(monkeypatch):
    """A subscription's delete not taken (it expires with the connection) neither raises nor keeps
    the device holding the member, which would count against its cap for the connection's 2 hours."""
    subscriptions = Subscriptions(None, "devices")
    subscriptions.store = _Closing()
    recorded = _Recorded()
    recorded.members.add(member("c1", 1_900_000_000))
    monkeypatch.setattr(push_services, "devices", lambda: recorded)
    monkeypatch.setattr(handler, "services", lambda: (subscriptions, None))
    event = {"requestContext": {"routeKey": "$disconnect", "eventType": "DISCONNECT", "connectionId": "c1"}}
    assert handler.lambda_handler(event, None) == {"statusCode": 200}
    assert recorded.members == set()


def test_a_message_storage_does_not_take_is_answered_503_for_the_client_to_connect_again(posted, monkeypatch):
    """An error message the clients read (not the gateway's internal error, which names no type)."""
    class Unreachable:
        def unsubscribe(self, *_):
            raise StorageUnavailable("DynamoDB did not answer")

    monkeypatch.setattr(handler, "services", lambda: (Unreachable(), None))
    event = {**_event(int(time.time()) + 3600), "body": '{"action": "unsubscribe", "deviceId": "lamp-1"}'}
    assert handler.lambda_handler(event, None) == {"statusCode": 200}
    [(connection, message)] = posted
    assert message["type"] == "error" and message["problem"]["status"] == 503
    assert message["problem"]["type"].endswith("storage-unavailable")


def test_known_gone_is_true_only_when_api_gateway_answers_gone():
    """GET @connections/{id}: 410 GoneException is gone; 200 is open; any other answer, or none,
    leaves the connection counted (a connect at the cap is then refused, not let past it)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from localdev.dynamodb_local import free_port

    answers = {"open": (200, {}), "closed": (410, {"x-amzn-ErrorType": "GoneException"}),
               "broken": (500, {"x-amzn-ErrorType": "InternalServerErrorException"})}

    class Gateway(BaseHTTPRequestHandler):
        def do_GET(self):
            status, headers = answers[self.path.rsplit("/", 1)[-1]]
            body = b'{"ConnectedAt": "2026-11-29T00:00:00Z"}' if status == 200 else b'{"message": "x"}'
            self.send_response(status)
            for name, value in {**headers, "Content-Type": "application/json",
                                "Content-Length": str(len(body))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    stop = served(server)
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert [connections.known_gone(name, endpoint) for name in ("open", "closed", "broken")] == [
            False, True, False]
        assert connections.known_gone("open", f"http://127.0.0.1:{free_port()}") is False  # nobody answers
    finally:
        stop()


def test_known_gone_without_an_endpoint_counts_the_connection(monkeypatch):
    monkeypatch.delenv(connections.CONNECTIONS_ENDPOINT, raising=False)
    assert connections.known_gone("c1") is False


def test_known_gone_counts_a_connection_api_gateway_is_slow_to_answer_about(monkeypatch):
    """A connect at the cap waits for its lookups at most LOOKUP_TIMEOUT_SECONDS each (side by
    side): a management API that does not answer in time leaves the connection counted."""
    import socket

    monkeypatch.setattr(connections, "LOOKUP_TIMEOUT_SECONDS", 0.25)  # the bound is the constant, whatever it is

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)  # accepts connections and never answers
    try:
        started = time.monotonic()
        assert connections.known_gone("c1", f"http://127.0.0.1:{listener.getsockname()[1]}") is False
        waited = time.monotonic() - started
        assert connections.LOOKUP_TIMEOUT_SECONDS * 0.9 <= waited < connections.LOOKUP_TIMEOUT_SECONDS + 3  # not 5 s
    finally:
        listener.close()


class _AtCapFinding(_FullDevice):
    """A device at its cap whose connect finds c0 closed, forgets it, then ends as ``then``."""

    def __init__(self, then: Exception | None):
        self.then = then

    def connected(self, device_id, connection_id, until, closed=None):
        assert closed(["c0", "c3"]) == {"c0"}
        if self.then is not None:
            raise self.then
        return True


class _OneClosed(_Subscriptions):
    def closed(self, connection_ids, known_gone=None):
        return {"c0"}


@pytest.mark.parametrize("then, status, counted", [
    (None, 200, True), (TooManyConnections("lamp-1", MAX_CONNECTIONS), 429, True),
    (StorageUnavailable("DynamoDB did not answer"), 503, False)], ids=["connected", "still-full", "unavailable"])
def test_connections_forgotten_at_the_cap_are_counted_unless_the_connect_is_503(monkeypatch, capsys, then, status,
                                                                                 counted):
    """A 503 may come before the forgetting was written: the connect sent again counts them."""
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    assert _device_connects(monkeypatch, _OneClosed(), _AtCapFinding(then))["statusCode"] == status
    found = (names.NAMESPACE, names.CONNECTIONS_FORGOTTEN) in emitted_metrics(capsys.readouterr().out)
    assert found is counted


@pytest.mark.parametrize("stopped", ["post-failed", "out-of-time"])
def test_a_catch_up_that_stops_short_tells_the_client_to_subscribe_again_and_keeps_the_subscription(
        posted, monkeypatch, stopped):
    """A post of the catch-up fails (throttled) or its time runs out: the client hears a 503 it
    acts on (subscribe again from the last version kept), where it heard nothing and waited for
    the device's next write; the subscription stays for the fan-out to go on from."""
    from functions.push.delivery import CatchUpStopped, PostFailed

    class Log:
        def read(self, device_id, since, limit, holder=None):
            return []

    class Delivery:
        log = Log()

        def advance(self, subscription, known=(), until=None):
            assert until is not None and until > time.monotonic()  # a catch-up runs on a clock
            raise PostFailed("post to c1 failed: throttled") if stopped == "post-failed" else \
                CatchUpStopped("sent up to version 7")

    class Held:
        unsubscribed = []

        def subscribe(self, connection_id, device_id, since, sections, own=False):
            return object()

        def unsubscribe(self, *args):
            self.unsubscribed.append(args)

    subscriptions = Held()
    monkeypatch.setattr(handler, "services", lambda: (subscriptions, Delivery()))
    monkeypatch.setattr(handler, "push_config", lambda: type("Config", (), {"require_registered_credentials": False}))
    assert handler.lambda_handler(_event(int(time.time()) + 3600), None) == {"statusCode": 200}
    (_, subscribed), (_, message) = posted
    assert subscribed["type"] == "subscribed" and message["type"] == "error"
    problem = message["problem"]
    assert (problem["status"], problem["type"].rsplit(":", 1)[1], problem["deviceId"]) == (
        503, "catch-up-stopped", "lamp-1")
    assert "subscribe again from the last version kept" in problem["detail"]
    assert subscriptions.unsubscribed == []


def test_an_answer_the_gateway_refuses_to_take_is_logged_not_a_function_error(monkeypatch):
    """Posting the answer fails (throttled): the message is over, not an "Internal server error"."""
    def throttled(connection, message):
        raise RuntimeError("LimitExceededException")

    monkeypatch.setattr(handler.connections, "post", throttled)
    monkeypatch.setattr(handler, "services", lambda: (None, None))
    assert handler.lambda_handler(_event(int(time.time()) - 3600), None) == {"statusCode": 200}
