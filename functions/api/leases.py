"""A device's lease queue over HTTP: acquire (wait in line), status, heartbeat, release, and
end (a back-end ends anyone's lease or waiting ticket by its fencing token)."""

from __future__ import annotations

from decimal import Decimal

from .resolver import Response
from .resolver import Router

from functions.auth.rights import END, LEASES, authorize, device_resource, max_lease_seconds
from functions.device_state import InvalidLease, LeaseGrant, LeaseStatus, leases, timestamp

from . import access
from . import request_parsing as parse
from .common import json_response, location, manager, route, wait_budget
from .problems import BadRequest, LeaseNotFound

MAX_LEASE_WAIT_SECONDS = 25  # inside API Gateway's 29 s integration timeout
MAX_OWNER_LENGTH = 128
LIMITS = {"ttlSeconds": (1, leases.MAX_TTL_SECONDS), "waitSeconds": (0, MAX_LEASE_WAIT_SECONDS)}

router = Router()


def grant_json(grant: LeaseGrant) -> dict:
    """A lease as its holder sees it (no one else ever gets its lease id or token)."""
    ttl = grant.ttl_seconds
    return {"deviceId": grant.device_id, "leaseId": grant.lease_id, "leaseToken": grant.lease_token,
            "fencingToken": grant.fencing_token, "expiresAt": timestamp(grant.expires_at),
            "ttlSeconds": int(ttl) if float(ttl).is_integer() else Decimal(repr(float(ttl)))}


def status_json(device_id: str, status: LeaseStatus) -> dict:
    holder = None
    if status.holder_token is not None:
        holder = {"fencingToken": status.holder_token, "expiresAt": timestamp(status.holder_expires_at),
                  "owner": status.holder_owner}
    return {"deviceId": device_id, "holder": holder, "queueLength": status.waiting,
            "queue": [{"fencingToken": token, "owner": owner} for token, owner in status.queue]}


def _lease_id(raw: str) -> str:
    try:
        leases.parse_lease_id(raw)
    except InvalidLease:
        raise LeaseNotFound("no lease has this id") from None
    return raw


def _fencing_token(raw: str) -> int | None:
    """The fencing token when the path names a lease by it alone (digits, no secret)."""
    if not (raw.isascii() and raw.isdigit() and len(raw) <= leases.TICKET_DIGITS):
        return None
    return int(raw) if raw == str(int(raw)) and int(raw) else None


def _body(allowed: tuple[str, ...]) -> dict:
    """The optional JSON body of a lease request, its numbers checked (a device's ttl
    against its own cap: ``rights.max_lease_seconds``)."""
    event = router.current_event
    if event.get("body") in (None, "") and parse.header(event, "Content-Type") is None:
        return {}
    body = parse.json_object(parse.json_body(event), "the body", (), allowed)
    principal = access.principal_of(event)
    for name, (low, high) in LIMITS.items():
        value = body.get(name)
        cap = max_lease_seconds(principal, high) if name == "ttlSeconds" else high
        if name in body and (isinstance(value, bool) or not isinstance(value, (int, Decimal))
                             or not low <= value <= cap):
            whose = " for a device (a device's lease is capped so that it cannot lock out its owners)" \
                if cap < high else ""
            raise BadRequest(f"{name} must be a number from {low} to {cap}{whose}")
    owner = body.get("owner")
    if owner is not None and (not isinstance(owner, str) or not 1 <= len(owner) <= MAX_OWNER_LENGTH):
        raise BadRequest(f"owner must be a string of 1 to {MAX_OWNER_LENGTH} characters")
    return body


@route(router, "/devices/<device_id>/leases", "POST", body=True)
def acquire_lease(device_id: str):
    device_id = parse.device_id(device_id)
    body = _body(("ttlSeconds", "waitSeconds", "owner"))
    wait = wait_budget(router.lambda_context, float(body.get("waitSeconds", 0)))
    grant = manager().lease_queue().acquire(device_id, float(body.get("ttlSeconds", leases.DEFAULT_TTL_SECONDS)),
                                            wait, body.get("owner"))
    return json_response(grant_json(grant), 201,
                         {"Location": f"{location(router.current_event, device_id)}/leases/{grant.lease_id}"})


@route(router, "/devices/<device_id>/leases", "GET", "HEAD")
def lease_status(device_id: str):
    device_id = parse.device_id(device_id)
    return json_response(status_json(device_id, manager().lease_queue().status(device_id)))


@route(router, "/devices/<device_id>/leases/<lease_id>", "PUT", body=True)
def heartbeat_lease(device_id: str, lease_id: str):
    device_id, lease_id = parse.device_id(device_id), _lease_id(lease_id)
    ttl = _body(("ttlSeconds",)).get("ttlSeconds")
    grant = manager().lease_queue().heartbeat(device_id, lease_id, None if ttl is None else float(ttl))
    return json_response(grant_json(grant))


@route(router, "/devices/<device_id>/leases/<lease_id>", "DELETE")
def release_lease(device_id: str, lease_id: str):
    """With the lease id (its grant's): release. With the fencing token alone (what
    ``GET …/leases`` shows): end that lease or waiting ticket whoever holds it, which
    needs the right to end leases (a back-end's write scope; never a device's)."""
    device_id = parse.device_id(device_id)
    fencing_token = _fencing_token(lease_id)
    if fencing_token is not None:
        authorize(access.principal_of(router.current_event), END, device_resource(device_id, LEASES))
        manager().lease_queue().end(device_id, fencing_token)
        return Response(status_code=204)
    manager().lease_queue().release(device_id, _lease_id(lease_id))
    return Response(status_code=204)
