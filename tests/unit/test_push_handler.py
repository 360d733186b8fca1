"""The WebSocket handler's answers that need no table: a message on a connection whose token
has expired since it connected is answered (401, connect again), never a handler failure; a
connect over the device's cap is 429 and counted, one with a credential the device no longer holds
401 and counted."""

from __future__ import annotations

import time

import pytest

from functions.auth.principals import Principal
from functions.device_state import CredentialRevoked, StorageUnavailable, TooManyConnections
from functions.device_state import metrics as names
from functions.device_state.model.connectivity import MAX_CONNECTIONS
from functions.push import handler
from functions.push import services as push_services
from tests.api.test_metrics_and_openapi import emitted_metrics


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

    def connected(self, device_id, connection_id, until):
        raise TooManyConnections(device_id, MAX_CONNECTIONS)


class _RevokedDevice(_FullDevice):
    """A device that no longer holds the credential its caller comes with."""

    def as_device(self, device_id, holder):
        assert holder is not None and holder.credential_id == "c" * 16
        return self

    def connected(self, device_id, connection_id, until):
        raise CredentialRevoked(device_id)


class _Subscriptions:
    def ends(self, credential_ends):
        return credential_ends

    def open(self, *_):
        raise AssertionError("a refused connect opens nothing")


@pytest.mark.parametrize("device, answer, metric", [
    (_FullDevice, {"statusCode": 429, "headers": {"Retry-After": "1"}}, names.CONNECTIONS_REFUSED),
    (_RevokedDevice, {"statusCode": 401}, names.REVOKED_CREDENTIAL_REQUESTS),
], ids=["over-the-cap", "credential-revoked"])
def test_a_refused_connect_is_answered_and_counted(monkeypatch, capsys, device, answer, metric):
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    monkeypatch.setenv("TABLE_NAME", "devices")
    handler.push_config.cache_clear()
    monkeypatch.setattr(handler, "services", lambda: (_Subscriptions(), None))
    monkeypatch.setattr(push_services, "devices", lambda: device())
    principal = Principal.device("lamp-1", expires_at=int(time.time()) + 3600, auth_time=int(time.time()),
                                 credential_id="c" * 16)
    event = {"requestContext": {"routeKey": "$connect", "eventType": "CONNECT", "connectionId": "c1",
                                "authorizer": {"principalId": principal.subject, **principal.as_context()}}}
    try:
        assert handler.lambda_handler(event, None) == answer
    finally:
        handler.push_config.cache_clear()
    assert (names.NAMESPACE, metric) in emitted_metrics(capsys.readouterr().out)


class _OpenDevice(_FullDevice):
    def connected(self, device_id, connection_id, until):
        return True


class _Opened:
    """Subscriptions that record when each connection opened ends."""

    def __init__(self):
        self.ends_at = {}

    def ends(self, credential_ends):
        return credential_ends

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
    monkeypatch.setattr(push_services, "devices", lambda: _OpenDevice())
    now = int(time.time())
    principal = Principal.device("lamp-1", expires_at=now + 3600, auth_time=now, credential_id="c" * 16,
                                 credential_expires_at=None if credential_expires_in is None
                                 else now + credential_expires_in)
    event = {"requestContext": {"routeKey": "$connect", "eventType": "CONNECT", "connectionId": "c1",
                                "authorizer": {"principalId": principal.subject, **principal.as_context()}}}
    try:
        assert handler.lambda_handler(event, None)["statusCode"] == 200
    finally:
        handler.push_config.cache_clear()
    assert opened.ends_at == {"c1": now + ends_in}


class _Unreachable(_Opened):
    def open(self, connection_id, subject, ends, holder):
        raise StorageUnavailable("DynamoDB did not answer")


class _Recorded(_FullDevice):
    def __init__(self):
        self.members = set()

    def connected(self, device_id, connection_id, until):
        self.members.add(connection_id)
        return True

    def disconnected(self, device_id, connection_id, until):
        self.members.discard(connection_id)


def test_a_connect_whose_connection_cannot_be_stored_is_503_and_leaves_the_devices_connectivity(monkeypatch):
    """DynamoDB not answering a connect (a fleet reconnecting at once): the client is told to
    come back, not an internal error, and the device is not left holding a connection it never
    got (which would count against its cap)."""
    monkeypatch.setenv("TABLE_NAME", "devices")
    handler.push_config.cache_clear()
    recorded = _Recorded()
    monkeypatch.setattr(handler, "services", lambda: (_Unreachable(), None))
    monkeypatch.setattr(push_services, "devices", lambda: recorded)
    now = int(time.time())
    principal = Principal.device("lamp-1", expires_at=now + 3600, auth_time=now, credential_id="c" * 16)
    event = {"requestContext": {"routeKey": "$connect", "eventType": "CONNECT", "connectionId": "c1",
                                "authorizer": {"principalId": principal.subject, **principal.as_context()}}}
    try:
        assert handler.lambda_handler(event, None) == {"statusCode": 503, "headers": {"Retry-After": "1"}}
    finally:
        handler.push_config.cache_clear()
    assert recorded.members == set()
