"""What each caller may do: the one pure ``authorize(principal, action, resource)``, and what
a write needs (``needed_for_write``). What each API route needs is part of its declaration
(functions/api/routes.py), which the handler checks before a route's own code runs (no gateway
authorizer stands in front of the HTTP API).

Resources are ``devices`` (the collection), ``jobs`` (every job: a back-end with the write scope
creates and cancels them, with the read scope reads them), ``device:<id>`` (the device: read it, its
delta and versions; replace or delete it whole) and ``device:<id>/<part>`` with part
``state``, ``desired``, ``reported`` (write one section), ``leases`` (read the queue's
status; take, heartbeat, release; ``end`` anyone's lease), ``changes`` (read the feed) and
``token`` (``issue`` a device token: the device itself only, never a scope) and
``credentials`` (``manage`` the device's registered credentials: the admin scope only); and
``enrollments`` (the collection of enrollments devices provision themselves by: ``manage``,
the admin scope only). Provisioning (``POST /devices/{id}/provision``) takes no principal: its
request is authenticated by its own assertion, signed with the key an enrollment derives for
the device (``routes.BY_ASSERTION``).

A write needs a right for each thing it touches (``needed_for_write``): its kind's own right
(create on the collection, replace or delete on the device; a patch has none beyond its
section's) and write on every section it sets. So whatever the route, setting ``reported``
takes the report right and ``desired`` the write right: a ``PUT /devices/{id}`` or a
transaction's ``put`` naming ``reported`` needs replace *and* write on ``reported``. A
route's own right is the coarse gate, checked before the body is parsed; everything the write
needs is checked once the body is parsed, before anything is read or written.

Devices cannot lock out their owners: a device may lease itself for at most
``DEVICE_MAX_LEASE_SECONDS`` at a time (``max_lease_seconds``), and ending a lease by its
fencing token, whoever holds it, is a back-end's right (the write scope), never a device's.
"""

from __future__ import annotations

from enum import StrEnum

from .principals import ADMIN_SCOPE, CLIENT, DEVICE, READ_SCOPE, REPORT_SCOPE, WRITE_SCOPE, Principal

READ, WRITE, LIST, CREATE, REPLACE, DELETE = "read", "write", "list", "create", "replace", "delete"
END = "end"  # end a lease or waiting ticket that is not the caller's (by its fencing token)
ISSUE = "issue"  # issue a device token (POST /devices/{id}/token)
MANAGE = "manage"  # register, list and revoke a device's credentials; create, read and end enrollments
COLLECTION = "devices"
JOBS = "jobs"  # the jobs (a desired change to many devices): create and cancel (write), read and list (read)
ENROLLMENTS = "enrollments"
STATE, DESIRED, REPORTED, LEASES, CHANGES, TOKEN = "state", "desired", "reported", "leases", "changes", "token"
CREDENTIALS = "credentials"
DEVICE_PARTS = (STATE, DESIRED, REPORTED, LEASES, CHANGES, TOKEN, CREDENTIALS)

# (action, part) each scope grants on every device; part None is the device itself,
# COLLECTION the collection.
_SCOPE_GRANTS = {
    READ_SCOPE: {(READ, None), (READ, CHANGES), (READ, LEASES), (LIST, COLLECTION), (READ, JOBS)},
    WRITE_SCOPE: {(CREATE, COLLECTION), (REPLACE, None), (DELETE, None), (WRITE, STATE), (WRITE, DESIRED),
                  (WRITE, LEASES), (END, LEASES), (WRITE, JOBS)},
    REPORT_SCOPE: {(WRITE, REPORTED)},
    ADMIN_SCOPE: {(MANAGE, CREDENTIALS), (MANAGE, ENROLLMENTS)},
}
# What a device principal may do to itself, and nothing else. Not END: a device ends only
# its own lease, by the lease id its grant returned. ISSUE on its token is a device's only:
# no scope grants a back-end a device's token.
_DEVICE_GRANTS = {(READ, None), (READ, CHANGES), (READ, LEASES), (WRITE, REPORTED), (WRITE, LEASES),
                  (ISSUE, TOKEN)}
# The longest lease a device may take or heartbeat to (a back-end's: the library's 900 s).
DEVICE_MAX_LEASE_SECONDS = 60


class Forbidden(Exception):
    """The principal may not do ``action`` on ``resource``."""

    def __init__(self, action: str, resource: str, index: int | None = None):
        where = "" if index is None else f"operations[{index}]: "
        super().__init__(f"{where}{action} on {resource} is not allowed for this caller")
        self.action, self.resource, self.index = action, resource, index


def device_resource(device_id: str, part: str | None = None) -> str:
    return f"device:{device_id}" if part is None else f"device:{device_id}/{part}"


def parse_resource(resource: str) -> tuple[str | None, str | None]:
    """(device id, part): (None, COLLECTION) for the collection, (None, JOBS) for the jobs,
    (None, ENROLLMENTS) for the enrollments; part None for the device."""
    if resource in (COLLECTION, JOBS, ENROLLMENTS):
        return None, resource
    if not resource.startswith("device:"):
        raise ValueError(f"unknown resource {resource!r}")
    name, _, part = resource[len("device:"):].partition("/")
    if not name or (part and part not in DEVICE_PARTS):
        raise ValueError(f"unknown resource {resource!r}")
    return name, part or None


def allowed(principal: Principal, action: str, resource: str) -> bool:
    device_id, part = parse_resource(resource)
    if principal.kind == DEVICE:
        return device_id is not None and device_id == principal.device_id and (action, part) in _DEVICE_GRANTS
    if principal.kind == CLIENT:
        return any((action, part) in _SCOPE_GRANTS.get(scope, ()) for scope in principal.scopes)
    return False


class WriteKind(StrEnum):
    """What a write does to one device: the kinds of the library's transaction operations."""

    CREATE = "create"    # a new device
    PUT = "put"          # create the device, or replace its state
    REPLACE = "replace"  # replace an existing device's state
    UPDATE = "update"    # patch or replace one section
    DELETE = "delete"
    CHECK = "check"      # a transaction's check: writes nothing, requires the device


# Each kind's own right, beside the sections it sets: (action, part), part as in _SCOPE_GRANTS.
_KIND_RIGHTS = {WriteKind.CREATE: (CREATE, COLLECTION), WriteKind.PUT: (REPLACE, None),
                WriteKind.REPLACE: (REPLACE, None), WriteKind.UPDATE: None, WriteKind.DELETE: (DELETE, None),
                WriteKind.CHECK: (READ, None)}
SECTION_PARTS = (STATE, DESIRED, REPORTED)
_WHOLE = (WriteKind.CREATE, WriteKind.PUT, WriteKind.REPLACE)  # these set the state always


def needed_for_write(kind: str, device_id: str, sections=()) -> list[tuple[str, str]]:
    """Every (action, resource) a write of ``kind`` to ``device_id`` needs, in the order they
    are checked: its kind's own right (none for an update), then write on each section it sets,
    in the order state, desired, reported. ``sections``: the sections the write names (a create,
    put or replace sets ``state`` whether named or not; an update sets exactly one; a delete or
    a check none)."""
    kind = WriteKind(kind)
    sections = set(sections) | ({STATE} if kind in _WHOLE else set())
    if not sections <= set(SECTION_PARTS):
        raise ValueError(f"unknown sections {sorted(sections - set(SECTION_PARTS))}")
    sets_none = kind in (WriteKind.DELETE, WriteKind.CHECK)
    if (kind is WriteKind.UPDATE and len(sections) != 1) or (sets_none and sections):
        raise ValueError(f"a {kind} cannot set {sorted(sections) or 'no section'}")
    needed = []
    if _KIND_RIGHTS[kind] is not None:
        action, part = _KIND_RIGHTS[kind]
        needed.append((action, COLLECTION if part == COLLECTION else device_resource(device_id, part)))
    return needed + [(WRITE, device_resource(device_id, part)) for part in SECTION_PARTS if part in sections]


def needed_to_follow(device_id: str) -> list[tuple[str, str]]:
    """What following a device's changes needs, over the feed or pushed: read on its changes."""
    return [(READ, device_resource(device_id, CHANGES))]


def first_refused(principal: Principal, needed) -> tuple[str, str] | None:
    """The first (action, resource) of ``needed`` the principal may not do; None if it may do all."""
    return next(((action, resource) for action, resource in needed
                 if not allowed(principal, action, resource)), None)


def authorize_all(principal: Principal, needed, index: int | None = None) -> None:
    """Raises Forbidden naming the first of ``needed`` the principal may not do."""
    refused = first_refused(principal, needed)
    if refused is not None:
        raise Forbidden(*refused, index)


def max_lease_seconds(principal: Principal, default: float) -> float:
    """The longest ``ttlSeconds`` this principal may ask of a lease (``default``: the service's)."""
    return min(default, DEVICE_MAX_LEASE_SECONDS) if principal.kind == DEVICE else default


def authorize(principal: Principal, action: str, resource: str, index: int | None = None) -> None:
    """Raises Forbidden unless ``principal`` may do ``action`` on ``resource``."""
    if not allowed(principal, action, resource):
        raise Forbidden(action, resource, index)
