"""The leases' stated limits, apart from the protocol, so that the routes can declare them
without loading the lease code, which only a lease's own requests use."""

DEFAULT_TTL_SECONDS = 60
MAX_TTL_SECONDS = 900
TICKET_DIGITS = 38
MAX_OWNER_CHARS = 128  # a lease's owner: a name for people reading the status
