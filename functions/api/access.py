"""Who calls each request, and whether it may: every route passes through ``check()``
before its own code runs (``common.route`` wraps it), so nothing is read or written for a
caller that may not.

The principal comes from API Gateway's authorizer context when the authorizer ran (the
dev server runs the same step); otherwise the handler verifies the request's own
credentials with the same code and records the principal in the same place."""

from __future__ import annotations

import time

from functions.auth.credentials import LEEWAY_SECONDS, Unauthenticated, MixedCredentials, authenticate_event
from functions.auth.principals import Principal
from functions.auth.rights import PER_OPERATION, PUBLIC, authorize, route_rights
from functions.auth.authorizer import MIXED

from . import request_parsing as parse


def principal_of(event) -> Principal:
    """The request's principal; Unauthenticated (401) or MixedCredentials (400) otherwise."""
    raw = event.raw_event if hasattr(event, "raw_event") else event
    context = raw.setdefault("requestContext", {})
    given = context.get("authorizer") or {}
    if given.get("principalKind") == MIXED:
        raise MixedCredentials("send a client certificate or a bearer token, not both")
    principal = Principal.from_context(given)
    if principal is None:
        principal = authenticate_event(raw)
        context["authorizer"] = {"principalId": principal.subject, **principal.as_context()}
    if principal.expired(time.time(), LEEWAY_SECONDS):  # a cached authorizer answer outlives its token
        raise Unauthenticated("the token has expired", token_given=True)
    return principal


def check(event, method: str, rule: str, parameters: dict) -> None:
    """What every route runs first: authenticate, then authorize the route's action on its
    resource (a route with PER_OPERATION rights authorizes its body's operations itself)."""
    rights = route_rights(method, rule)
    if rights == PUBLIC:
        return
    principal = principal_of(event)
    if rights == PER_OPERATION:
        return
    action, template = rights
    device_id = parse.device_id(parameters["device_id"]) if "device_id" in parameters else None
    authorize(principal, action, template.format(device_id=device_id))
