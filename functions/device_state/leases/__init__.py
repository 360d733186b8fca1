"""FIFO leases per device with fencing tokens: the queue's protocol by lease id (``queue``)
and the handle a caller holds, heartbeats and releases (``handle``). The limits load with
the package; the protocol and the handle when a name of theirs is first used, so a request
that takes no lease never loads them."""

import importlib

from .limits import DEFAULT_TTL_SECONDS, MAX_OWNER_CHARS, MAX_TTL_SECONDS, TICKET_DIGITS

_LOADED_ON_USE = {"Lease": "handle", "LeaseGrant": "queue", "LeaseQueue": "queue", "LeaseStatus": "queue",
                  "check_ttl": "queue", "lease_token_of": "queue", "parse_lease_id": "queue"}


def __getattr__(name: str):
    if name not in _LOADED_ON_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LOADED_ON_USE[name]}", __name__), name)


__all__ = ["DEFAULT_TTL_SECONDS", "Lease", "LeaseGrant", "LeaseQueue", "LeaseStatus", "MAX_OWNER_CHARS",
           "MAX_TTL_SECONDS", "TICKET_DIGITS", "check_ttl", "lease_token_of", "parse_lease_id"]
