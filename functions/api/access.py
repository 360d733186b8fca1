"""Who calls each request, and whether it may: every route passes through ``check()``
before its own code runs (``common.route`` wraps it), so nothing is read or written for a
caller that may not. A write whose body names the sections it sets (``POST /devices``,
``PUT /devices/{id}``) then passes ``check_write()`` once the body is parsed, still before
anything is read or written.

No authorizer runs in front of the HTTP API: the handler verifies each request's own
credentials and records the principal in ``requestContext.authorizer``, the field a
replayed event (``make invoke``) names its caller in."""

from __future__ import annotations

from functions.auth import authorizer
from functions.auth.credentials import Unauthenticated, assertion_of
from functions.auth.principals import Principal
from functions.auth.rights import (BY_ASSERTION, PER_OPERATION, PUBLIC, TAKES_ASSERTIONS, WriteKind, authorize,
                                   authorize_all, needed_for_write, route_rights)

from . import request_parsing as parse


def principal_of(event) -> Principal:
    """The request's principal (``functions.auth.authorizer.principal_of``)."""
    return authorizer.principal_of(event.raw_event if hasattr(event, "raw_event") else event)


def assertion(event) -> str | None:
    """The assertion a request to a route that takes one (``TAKES_ASSERTIONS``, ``BY_ASSERTION``)
    carries in place of a token: the route verifies it itself, before it reads anything else."""
    return assertion_of(event.raw_event if hasattr(event, "raw_event") else event)


def authenticated(event) -> bool:
    """Whether the request has a principal (every route's but the public ones and an assertion's)."""
    raw = event.raw_event if hasattr(event, "raw_event") else event
    return bool(((raw.get("requestContext") or {}).get("authorizer") or {}).get("principalKind"))


def check(event, method: str, rule: str, parameters: dict) -> None:
    """What every route runs first: authenticate, then authorize the route's action on its
    resource (a route with PER_OPERATION rights authorizes its body's operations itself). A
    route that takes an assertion gets the request unauthenticated when it carries one."""
    rights = route_rights(method, rule)
    if rights == PUBLIC:
        return
    if rights == BY_ASSERTION or (method, rule) in TAKES_ASSERTIONS:
        if assertion(event) is not None:
            return
        if rights == BY_ASSERTION:
            raise Unauthenticated("this route needs 'Authorization: Bearer <assertion>': a JWT the device signs "
                                  "with its key (docs/api/auth.md)")
    principal = principal_of(event)
    if rights == PER_OPERATION:
        return
    action, template = rights
    device_id = parse.device_id(parameters["device_id"]) if "device_id" in parameters else None
    authorize(principal, action, template.format(device_id=device_id))


def check_write(event, kind: WriteKind, device_id: str, sections) -> None:
    """Everything a write of ``kind`` to ``device_id`` needs (``rights.needed_for_write``), the
    ``sections`` its body sets included: 403 naming the first right the caller lacks."""
    authorize_all(principal_of(event), needed_for_write(kind, device_id, sections))
