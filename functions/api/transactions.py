"""POST /transactions: the body's operations (parsed into library Operations and authorized,
each, by the route's declaration) run as one all-or-nothing transaction."""

from __future__ import annotations

from .resolver import Router

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
    key = idempotency_key(request, scope="transaction")
    device_id = request.principal.device_id
    writer = as_caller(request, device_id) if device_id is not None else manager()
    # held to Lambda's answer with metadata, as the widest answer a replay under its key may ask for
    devices = writer.fenced(tokens).transact(
        operations, idempotency=key, budget_seconds=budget(request.context),
        answer_fits=lambda planned: fits_in_an_answer(answer(operations, planned, metadata=True)))
    headers = {IDEMPOTENT_REPLAYED: "true"} if devices and devices[0].replayed else None
    return json_response(answer(operations, devices, include_metadata(request)), headers=headers)


def answer(operations, devices, metadata: bool) -> dict:
    """The devices in order, each as written or checked (None for a delete)."""
    return {"devices": [None if operation.action == "delete" else device.as_dict(metadata)
                        for operation, device in zip(operations, devices)]}
