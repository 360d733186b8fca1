"""The WebSocket handler's answers that need no table: a message on a connection whose token
has expired since it connected is answered (401, connect again), never a handler failure."""

from __future__ import annotations

import time

import pytest

from functions.auth.principals import Principal
from functions.push import handler


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
