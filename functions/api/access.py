"""Who calls each request, and whether it may: ``common.route`` runs these for every route
before its own code, so nothing is read or written for a caller that may not. First the
caller (``authenticate``), then the route's own right on the resource its path names
(``check_route``), then, once the body is parsed, everything the body writes
(``check_writes``: the sections a create or put names, each operation of a transaction).

No authorizer runs in front of the HTTP API: the handler verifies each request's own
credentials and records the principal in ``requestContext.authorizer``, the field a
replayed event (``make invoke``) names its caller in."""

from __future__ import annotations

import contextlib

from functions.auth import authorizer
from functions.auth.credentials import Unauthenticated, assertion_of
from functions.auth.principals import Principal
from functions.auth.rights import authorize, authorize_all, needed_for_write

from .routes import BY_ASSERTION, PER_OPERATION, PUBLIC, EachOperation, Request, Route


def principal_of(event) -> Principal:
    """The request's principal (``functions.auth.authorizer.principal_of``)."""
    return authorizer.principal_of(event.raw_event if hasattr(event, "raw_event") else event)


def assertion(event) -> str | None:
    """The assertion a request to a route that takes one (``Route.assertion``) carries in place of
    a token: the route verifies it itself, before it reads anything else."""
    return assertion_of(event.raw_event if hasattr(event, "raw_event") else event)


def authenticate(event, declaration: Route) -> Principal | None:
    """The caller, unless the route is public or takes an assertion and the request carries one
    (None: the route verifies it); 401 without valid credentials."""
    if declaration.right == PUBLIC:
        return None
    if declaration.assertion and assertion(event) is not None:
        return None
    if declaration.right == BY_ASSERTION:
        with contextlib.suppress(Unauthenticated):  # read for its 400 alone: a certificate beside a token
            principal_of(event)  # is mixed-credentials here too, as on every route
        raise Unauthenticated("this route needs 'Authorization: Bearer <assertion>': a JWT the device signs "
                              "with its key (docs/api/identity.md)")
    return principal_of(event)


def check_route(principal: Principal | None, declaration: Route, path: dict) -> None:
    """The route's own right on the resource its path names (403 without it); none for a
    request that proves itself with an assertion (``principal`` None)."""
    if declaration.right in (PUBLIC, PER_OPERATION, BY_ASSERTION) or principal is None:
        return
    action, template = declaration.right
    authorize(principal, action, template.format(device_id=path.get("device_id")))


def check_writes(principal: Principal | None, declaration: Route, request: Request) -> None:
    """Everything the body writes needs (``rights.needed_for_write``), the sections it sets
    included: 403 naming the first right the caller lacks (and, in a transaction, the operation)."""
    writes = declaration.writes
    if writes is None:
        return
    indexed = isinstance(writes, EachOperation)
    for index, (kind, device_id, sections) in enumerate(writes.touched(request)):
        authorize_all(principal, needed_for_write(kind, device_id, sections), index=index if indexed else None)
