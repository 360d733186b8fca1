"""POST /transactions: the body's operations (parsed into library Operations and authorized,
each, by the route's declaration) run as one all-or-nothing transaction."""

from __future__ import annotations

from .resolver import Router

from .common import (IDEMPOTENT_REPLAYED, as_caller, budget, idempotency_key, include_metadata, json_response,
                     manager, route)
from .routes import Request

router = Router()


@route(router, "runTransaction", reads_holder=True)
def run_transaction(request: Request):
    """A device's own transaction carries its credential in the condition on its item."""
    entries = request.body["operations"]
    operations = [entry.operation for entry in entries]
    tokens = {entry.operation.device_id: entry.lease_token for entry in entries if entry.lease_token is not None}
    key = idempotency_key(request, scope="transaction")
    device_id = request.principal.device_id
    writer = as_caller(request, device_id) if device_id is not None else manager()
    devices = writer.fenced(tokens).transact(operations, idempotency=key, budget_seconds=budget(request.context))
    metadata = include_metadata(request)
    result = {"devices": [None if operation.action == "delete" else device.as_dict(metadata)
                          for operation, device in zip(operations, devices)]}
    headers = {IDEMPOTENT_REPLAYED: "true"} if devices and devices[0].replayed else None
    return json_response(result, headers=headers)
