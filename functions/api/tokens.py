"""``POST /devices/{id}/token``: a device that proves itself with what it holds (its client
certificate, an assertion signed with a registered key or secret, or a device token) gets a
device token for the routes and the WebSocket API (functions/auth/device_tokens.py)."""

from __future__ import annotations

import time

from .resolver import Router

from functions.auth import identity
from functions.auth.device_tokens import device_token_issuer, issue
from functions.auth.principals import Principal
from functions.auth.sealing import sealer
from functions.auth.signers import SigningFailed, SigningThrottled
from functions.device_state import DeviceNotFound, registered_credentials, restore

from . import access
from . import request_parsing as parse
from .common import as_caller, json_response, manager, route
from .observability import record_device_token, record_signing_failure
from .problems import BadRequest

router = Router()
restore.on_restore(device_token_issuer.cache_clear)  # a restored copy makes its own KMS client
restore.on_restore(sealer.cache_clear)


@route(router, "/devices/<device_id>/token", "POST", body=True, reads_holder=True)
def issue_device_token(device_id: str):
    event = router.current_event
    device_id = parse.device_id(device_id)
    if event.get("body") not in (None, "") and parse.json_body(event) != {}:
        raise BadRequest("the body must be empty or {}; nothing was done")
    assertion = access.assertion(event)
    if assertion is not None:
        principal, credential_expires = identity.proven(manager(), device_id, assertion, sealer(), time.time())
    else:
        principal, credential_expires = access.principal_of(event), _held(event, device_id)
    return token_response(principal, credential_expires)


def _held(event, device_id: str) -> int | None:
    """A token names a device that exists when it is issued, and whose item still holds the
    credential the caller comes with: one strongly consistent read of the state item
    (docs/costs.md), made only for the device itself (route() authorized it first). When that
    credential expires (None: never)."""
    item = as_caller(event, device_id).live_state(device_id)
    if item is None:
        raise DeviceNotFound(device_id)
    credential = access.principal_of(event).credential_id
    return registered_credentials(item).get(credential) or None


def token_response(principal: Principal, credential_expires: int | None, status: int = 200, **members):
    """A signed device token for ``principal``, never past its credential's expiry."""
    settings, signer = device_token_issuer()
    try:
        token = issue(principal, signer, settings, credential_expires_at=credential_expires)
    except SigningFailed as failed:
        record_signing_failure(throttled=isinstance(failed, SigningThrottled))
        raise
    record_device_token()
    return json_response({**members, **token}, status, headers={"Cache-Control": "no-store"})
