"""The one planner: every request on a device's state item is built here, whatever asks for
it (single writes, compiled patches, keyed writes, transaction operations, lease holder
changes, connections, settle marks, deletes and tombstones), from the item read (or none):
the request with all its conditions (version or liveness, lease fence, caller condition,
write identity; see ``item/journal``), and the device it leaves. Nothing here talks to
DynamoDB. Its requests come in three kinds, each in its own module: versioned writes
(``versioned``), read-free compiled patches (``compiled``) and unversioned bookkeeping
(``bookkeeping``)."""

from __future__ import annotations

from .bookkeeping import BookkeepingRequests
from .compiled import CompiledPatches
from .versioned import VersionedWrites


class Planner(VersionedWrites, CompiledPatches, BookkeepingRequests):
    """Plans requests on the state item at one instant (``now``) under one lease fence
    (``plan.PlanContext``)."""
