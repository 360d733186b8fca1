"""A device's lease queue over HTTP: acquire (wait in line), status, heartbeat, release, and
end (a back-end ends anyone's lease or waiting ticket by its fencing token)."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING

from .resolver import Response
from .resolver import Router

from functions.auth.rights import END, LEASES, authorize, device_resource, max_lease_seconds
from functions.device_state import InvalidLease, leases, timestamp

from .common import json_response, location, manager, own_holder, route, wait_budget
from .problems import BadRequest, LeaseNotFound
from .routes import LEASE_LIMITS, MAX_LEASE_WAIT_SECONDS, Request  # noqa: F401 (MAX_LEASE_WAIT_SECONDS: the stack's)

if TYPE_CHECKING:  # the lease code loads with a lease request's first use of it, not at a cold start
    from functions.device_state import LeaseGrant, LeaseStatus

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


def _ttl(request: Request) -> float | None:
    """The body's ttlSeconds, within what this caller may ask (a device's is capped so that it
    cannot lock out its owners: ``rights.max_lease_seconds``)."""
    ttl = (request.body or {}).get("ttlSeconds")
    low, high = LEASE_LIMITS["ttlSeconds"]
    cap = max_lease_seconds(request.principal, high)
    if ttl is not None and ttl > cap:
        raise BadRequest(f"ttlSeconds must be a number from {low} to {cap} for a device (a device's lease is "
                         "capped so that it cannot lock out its owners)")
    return None if ttl is None else float(ttl)


@route(router, "acquireLease", reads_holder=True)
def acquire_lease(request: Request):
    device_id, body = request.path["device_id"], request.body or {}
    ttl = _ttl(request)
    wait = wait_budget(request.context, float(body.get("waitSeconds", 0)))
    grant = manager().lease_queue().acquire(device_id, leases.DEFAULT_TTL_SECONDS if ttl is None else ttl, wait,
                                            body.get("owner"), own_holder(request, device_id))
    return json_response(grant_json(grant), 201,
                         {"Location": f"{location(request.event, device_id)}/leases/{grant.lease_id}"})


@route(router, "getLeaseStatus", reads_holder=True)
def lease_status(request: Request):
    device_id = request.path["device_id"]
    return json_response(status_json(device_id, manager().lease_queue().status(device_id,
                                                                                own_holder(request, device_id))))


@route(router, "heartbeatLease", reads_holder=True)
def heartbeat_lease(request: Request):
    device_id, lease_id = request.path["device_id"], _lease_id(request.path["lease_id"])
    grant = manager().lease_queue().heartbeat(device_id, lease_id, _ttl(request), own_holder(request, device_id))
    return json_response(grant_json(grant))


@route(router, "releaseLease", reads_holder=True)
def release_lease(request: Request):
    """With the lease id (its grant's): release. With the fencing token alone (what
    ``GET …/leases`` shows): end that lease or waiting ticket whoever holds it, which
    needs the right to end leases (a back-end's write scope; never a device's)."""
    device_id, lease_id = request.path["device_id"], request.path["lease_id"]
    fencing_token = _fencing_token(lease_id)
    if fencing_token is not None:
        authorize(request.principal, END, device_resource(device_id, LEASES))
        manager().lease_queue().end(device_id, fencing_token)
        return Response(status_code=204)
    manager().lease_queue().release(device_id, _lease_id(lease_id), own_holder(request, device_id))
    return Response(status_code=204)
