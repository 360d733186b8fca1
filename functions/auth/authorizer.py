"""The Lambda authorizer (REQUEST type) of the WebSocket API's $connect: the same
verification the handler uses, run before the connection exists. (The HTTP API has no
authorizer: its function verifies each request's credentials with the same code.)

The dev server's WebSocket runs ``decide()`` as API Gateway runs this function, and fills
the same event fields (``requestContext.authorizer``)."""

from __future__ import annotations

import time

from functions.problem_details import MEDIA_TYPE, problem

from .credentials import LEEWAY_SECONDS, MixedCredentials, Unauthenticated, authenticate_event
from .principals import Principal

MIXED = "mixed"  # context principalKind of a request carrying a certificate and a token (answered 400)


class Unauthorized(Exception):
    """Raised with exactly this message, API Gateway answers 401 (its UNAUTHORIZED response)."""

    def __init__(self):
        super().__init__("Unauthorized")


def unauthorized_problem() -> tuple[int, dict, dict]:
    """(status, headers, body) of a connect refused for its credentials, as problem+json."""
    return 401, {"Content-Type": MEDIA_TYPE, "WWW-Authenticate": "Bearer"}, problem(
        401, "unauthorized", "Unauthorized", "connecting needs a valid 'Authorization: Bearer <token>' (a "
        "browser: the subprotocols 'device-state, bearer.<token>') or a device certificate")


def decide(event: dict) -> dict:
    """The authorizer's answer for a REQUEST authorizer event (the WebSocket API's $connect):
    the caller's principal, allowed to connect; raises Unauthorized. Each subscription of the
    connection is authorized apart, by the push function."""
    try:
        principal = authenticate_event(event)
    except Unauthenticated:
        raise Unauthorized() from None
    except MixedCredentials:  # answered 400 by the push function
        return {"principalId": MIXED, "context": {"principalKind": MIXED},
                "policyDocument": _policy([event["methodArn"]])}
    return {"principalId": principal.subject, "context": principal.as_context(),
            "policyDocument": _policy([event["methodArn"]])}


def _policy(allowed: list[str]) -> dict:
    return {"Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": "Allow", "Resource": allowed}]}


def principal_of(event: dict) -> Principal:
    """The principal of an API Gateway event (HTTP or WebSocket): the one the authorizer put
    in ``requestContext.authorizer`` (a WebSocket connection's), or, with none there (every
    HTTP request), the request's own credentials verified and recorded there.
    Unauthenticated (401) or MixedCredentials (400) otherwise."""
    context = event.setdefault("requestContext", {})
    given = context.get("authorizer") or {}
    if given.get("principalKind") == MIXED:
        raise MixedCredentials("send a client certificate or a bearer token, not both")
    principal = Principal.from_context(given)
    if principal is None:
        principal = authenticate_event(event)
        context["authorizer"] = {"principalId": principal.subject, **principal.as_context()}
    if principal.expired(time.time(), LEEWAY_SECONDS):  # a cached authorizer answer outlives its token
        raise Unauthenticated("the token, or the credential it was issued on, has expired", token_given=True)
    return principal


def lambda_handler(event, _context):
    return decide(event)
