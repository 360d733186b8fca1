"""Who calls each request, and whether it may: ``common.route`` runs these for every route
before its own code, so nothing is read or written for a caller that may not. First the
caller (``authenticate``), then the route's own right on the resource its path names
(``check_route``), then, once the body is parsed, everything the body writes
(``check_writes``: the sections a create or put names, each operation of a transaction).

No authorizer runs in front of the HTTP API: the handler verifies each request's own
credentials and records the principal in ``requestContext.authorizer``, the field a
replayed event (``make invoke``) names its caller in."""

from __future__ import annotations

from functions.auth import authorizer
from functions.auth.principals import Principal
from functions.auth.rights import authorize, authorize_all, needed_for_write

from .routes import PER_OPERATION, PUBLIC, EachOperation, Request, Route


def principal_of(event) -> Principal:
    """The request's principal (``functions.auth.authorizer.principal_of``)."""
    return authorizer.principal_of(event.raw_event if hasattr(event, "raw_event") else event)


def authenticate(event, declaration: Route) -> Principal | None:
    """The caller, unless the route is public (401 without valid credentials)."""
    return None if declaration.right == PUBLIC else principal_of(event)


def check_route(principal: Principal | None, declaration: Route, path: dict) -> None:
    """The route's own right on the resource its path names (403 without it)."""
    if declaration.right in (PUBLIC, PER_OPERATION):
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
