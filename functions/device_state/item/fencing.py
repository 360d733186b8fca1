"""Lease fencing: the condition every state write carries, and why it refused one.

The active lease holder is recorded on the state item: ``leaseToken`` (its fencing token,
a ticket number that orders leases), ``leaseKey`` (a digest of the holder's secret lease
token) and ``leaseUntil``. A write to a device with an active lease must present that
lease's secret token; a write that presents a token succeeds only while that lease is
the active one. The fencing token opens nothing: anyone may see it.
"""

from __future__ import annotations

import hashlib

from ..errors import DeviceLocked, LeaseNotHeld
from ..write.expressions import Expression
from . import schema


def lease_key(lease_token: str) -> str:
    """What the state item stores of a secret lease token."""
    return hashlib.sha256(f"lease-key\n{lease_token}".encode("utf-8", "surrogatepass")).hexdigest()[:40]


def active_holder(state_item: dict, now: float) -> tuple[int | None, float | None]:
    """The fencing token and expiry of the lease active on a state item, or (None, None)."""
    token = state_item.get(schema.LEASE_TOKEN)
    until = state_item.get(schema.LEASE_UNTIL)
    if token is None or until is None or float(until["N"]) <= now:
        return None, None
    return int(token["N"]), float(until["N"])


class Fence:
    """The lease tokens one manager writes under: ``{device_id: token}``, where a token
    is the secret lease token a grant returned (a string) or a lease object with
    ``lease_token`` and ``lease_token_if_held()`` (which refuses once the lease is lost)."""

    def __init__(self, tokens: dict | None = None):
        self.tokens = dict(tokens or {})

    def with_tokens(self, tokens: dict) -> "Fence":
        """``{device_id: a Lease or its lease token}``; anything else (the fencing token, a
        number) is refused here, before a write's condition would fail on it."""
        for device_id, token in tokens.items():
            if not isinstance(token, str) and not hasattr(token, "lease_token_if_held"):
                raise TypeError(f"fenced() takes a Lease or its lease token for {device_id!r}, "
                                f"not {type(token).__name__}")
        return Fence({**self.tokens, **tokens})

    def condition(self, device_id: str, expr: Expression, now: float) -> str:
        """The fence condition at ``now`` (epoch seconds), its placeholders from ``expr``."""
        until, now_epoch = expr.name(schema.LEASE_UNTIL), expr.number(now)
        token = self.tokens.get(device_id)
        if token is None:
            return f"(attribute_not_exists({expr.name(schema.LEASE_TOKEN)}) OR {until} <= {now_epoch})"
        if not isinstance(token, str):
            token = token.lease_token_if_held()
        return f"({expr.name(schema.LEASE_KEY)} = {expr.value({'S': lease_key(token)})} AND {until} > {now_epoch})"

    def error(self, device_id: str, item: dict | None, now: float) -> Exception | None:
        """Why the fence refused a write to ``item`` (as it was), or None if it did not."""
        holder, until = active_holder(item, now) if item is not None else (None, None)
        token = self.tokens.get(device_id)
        if token is not None and not isinstance(token, str):
            token = token.lease_token
        if holder is None:
            return None if token is None else LeaseNotHeld(device_id)
        held = token is not None and schema.StateItem.of(item).text(schema.LEASE_KEY) == lease_key(token)
        return None if held else DeviceLocked(device_id, until)


def lease_instant(seconds: float) -> float:
    """Epoch seconds to the millisecond, as leases store and compare them."""
    return round(seconds, 3)
