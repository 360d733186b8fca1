"""FIFO leases per device with fencing tokens: the queue's protocol by lease id (``queue``)
and the handle a caller holds, heartbeats and releases (``handle``)."""

from .handle import Lease
from .queue import (
                    DEFAULT_TTL_SECONDS,
                    MAX_TTL_SECONDS,
                    TICKET_DIGITS,
                    LeaseGrant,
                    LeaseQueue,
                    LeaseStatus,
                    check_ttl,
                    lease_token_of,
                    parse_lease_id,
)

__all__ = ["DEFAULT_TTL_SECONDS", "Lease", "LeaseGrant", "LeaseQueue", "LeaseStatus", "MAX_TTL_SECONDS",
           "TICKET_DIGITS", "check_ttl", "lease_token_of", "parse_lease_id"]
