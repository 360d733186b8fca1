"""POST /transactions: the body's operations (parsed into library Operations and authorized,
each, by the route's declaration) run as one all-or-nothing transaction."""

from __future__ import annotations

import time

from functions.device_state import MAX_EXPIRY_SECONDS, dumps

from .resolver import Router

from . import request_parsing as parse
from .common import (IDEMPOTENT_REPLAYED, as_caller, budget, fits_in_an_answer, idempotency_key, include_metadata,
                     json_response, manager, route)
from .routes import Request

router = Router()


@route(router, "runTransaction", reads_holder=True)
def run_transaction(request: Request):
    """A device's own transaction carries its credential in the condition on its item."""
    entries = request.body["operations"]
    operations = [entry.operation for entry in entries]
    tokens = {entry.operation.device_id: entry.lease_token for entry in entries if entry.lease_token is not None}
    key = idempotency_key(request, scope="transaction", body=_without_lease_tokens(request))
    device_id = request.principal.device_id
    writer = as_caller(request, device_id) if device_id is not None else manager()
    devices = writer.fenced(tokens).transact(operations, idempotency=key, budget_seconds=budget(request.context),
                                             answer_fits=lambda planned: replays_fit(operations, planned))
    headers = {IDEMPOTENT_REPLAYED: "true"} if devices and devices[0].replayed else None
    return json_response(answer(operations, devices, include_metadata(request)), headers=headers)


def _without_lease_tokens(request: Request) -> str | None:
    """What of the body makes two transactions the same: all but the operations' lease tokens (a
    lease's token is no part of what is asked, as a PATCH's Lease-Token header is not: the same
    transaction sent again under a later lease, or with no lease left to name, replays). Always
    this form, tokens or none, so that a retry which adds or drops one meets the same fingerprint.
    None without a key (the body is read again only for a key's sake)."""
    if parse.IDEMPOTENCY_KEY not in request.headers:
        return None
    sent = parse.json_body(request.event)
    return dumps({**sent, "operations": [{name: value for name, value in operation.items() if name != "leaseToken"}
                                         for operation in sent["operations"]]})


def replays_fit(operations, devices) -> bool:
    """Whether the answer fits in what a Lambda may answer however and whenever a replay under
    the key asks for it: with metadata, each device as its largest, its delta as it is (expiry
    only takes leaves out of it) and its metadata once every desire has expired (each leaf's
    metadata then says so)."""
    now = time.time()
    return fits_in_an_answer(_in_order(operations, devices, lambda device: {
        **device.as_dict(True, now), "metadata": device.as_dict(True, now + MAX_EXPIRY_SECONDS + 1)["metadata"]}))


def answer(operations, devices, metadata: bool, now: float | None = None) -> dict:
    """The devices in order, each as written or checked (None for a delete), as shown at ``now``."""
    return _in_order(operations, devices, lambda device: device.as_dict(metadata, now))


def _in_order(operations, devices, shown) -> dict:
    return {"devices": [None if operation.action == "delete" else shown(device)
                        for operation, device in zip(operations, devices)]}
