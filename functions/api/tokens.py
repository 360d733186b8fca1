"""``POST /devices/{id}/token``: a device that called with its client certificate (or a device
token) gets a device token for the routes and the WebSocket API (functions/auth/device_tokens.py)."""

from __future__ import annotations

from .resolver import Router

from functions.auth.device_tokens import device_token_issuer, issue
from functions.auth.signers import SigningFailed, SigningThrottled
from functions.device_state import DeviceNotFound, restore

from .common import json_response, manager, route
from .observability import record_device_token, record_signing_failure
from .routes import Request

router = Router()
restore.on_restore(device_token_issuer.cache_clear)  # a restored copy makes its own KMS client


@route(router, "issueDeviceToken")
def issue_device_token(request: Request):
    device_id = request.path["device_id"]
    # A token names a device that exists when it is issued: one strongly consistent read of the
    # state item (docs/costs.md), made only for the device itself (route() authorized it first).
    if manager().live_state(device_id) is None:
        raise DeviceNotFound(device_id)
    settings, signer = device_token_issuer()
    try:
        token = issue(request.principal, signer, settings)
    except SigningFailed as failed:
        record_signing_failure(throttled=isinstance(failed, SigningThrottled))
        raise
    record_device_token()
    return json_response(token, headers={"Cache-Control": "no-store"})
