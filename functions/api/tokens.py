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
from functions.device_state import DeviceNotFound, credential_token_entry, registered_credentials, restore

from . import access
from .common import as_caller, json_response, manager, route
from .observability import record_device_token, record_signing_failure
from .routes import Request

router = Router()
restore.on_restore(device_token_issuer.cache_clear)  # a restored copy makes its own KMS client
restore.on_restore(sealer.cache_clear)


@route(router, "issueDeviceToken", reads_holder=True)
def issue_device_token(request: Request):
    device_id = request.path["device_id"]
    assertion = access.assertion(request.event) if request.principal is None else None
    if assertion is not None:
        principal, credential_expires, entry = identity.proven(manager(), device_id, assertion, sealer(), time.time())
    else:
        principal, (credential_expires, entry) = request.principal, _held(request, device_id)
    return token_response(principal, credential_expires, entry)


def _held(request: Request, device_id: str) -> tuple[int | None, str | None]:
    """A token names a device that exists when it is issued, and whose item still holds the
    credential the caller comes with: one strongly consistent read of the state item
    (docs/costs.md), made only for the device itself (route() authorized it first). When that
    credential expires (None: never), and the entry its token names (``credential_token_entry``)."""
    item = as_caller(request, device_id).live_state(device_id)
    if item is None:
        raise DeviceNotFound(device_id)
    principal = request.principal
    registered = registered_credentials(item).get(principal.credential_id) or None
    # A certificate's own end (carried on by its tokens) bounds its tokens too.
    return (min(filter(None, (registered, principal.credential_expires_at)), default=None),
            credential_token_entry(item, principal.credential_id, principal.certificate))


def token_response(principal: Principal, credential_expires: int | None, entry: str | None = None,
                   status: int = 200, **members):
    """A signed device token for ``principal``, never past its credential's expiry, naming the
    credential's ``entry`` on the device's item when it has one."""
    settings, signer = device_token_issuer()
    try:
        token = issue(principal, signer, settings, credential_expires_at=credential_expires,
                      credential_registration=entry)
    except SigningFailed as failed:
        record_signing_failure(throttled=isinstance(failed, SigningThrottled))
        raise
    record_device_token()
    return json_response({**members, **token}, status, headers={"Cache-Control": "no-store"})
