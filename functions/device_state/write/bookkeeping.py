"""Unversioned requests on a device's state item: what changes its bookkeeping, not its
documents, so none makes a version or a journal entry, and each is harmless sent twice (its
condition names what it expects): index attributes set as the sections say, connections
opened and closed, seen, a lost write's settle mark, the lease holder taken, extended and
cleared."""

from __future__ import annotations

from ..fleet.index import QUERYABLE, connectivity_attributes
from ..item import schema
from ..item.credentials import MAX_CREDENTIALS, certificate_entry, entries, expired
from ..item.fencing import lease_instant, lease_key
from ..item.journal import WriteId
from ..item.room import MAX_STATE_ITEM_BYTES, value_size
from ..model.connectivity import CONNECTIVITY, MAX_CONNECTIONS, SEEN_EVERY_SECONDS, connectivity_of
from ..model.device import Device
from ..model.sections import DESIRED, REPORTED, STATE
from .expressions import Expression, live
from .plan import (
    ALL_DISCONNECTED,
    CONNECTED,
    CREDENTIAL_REGISTERED,
    CREDENTIAL_REVOKED,
    DISCONNECTED,
    LEASE_CLEARED,
    LEASE_EXTENDED,
    LEASE_TAKEN,
    REINDEXED,
    SEEN,
    SETTLE_MARK,
    PlanContext,
    Planned,
    index_sets,
)

STUB_SECONDS = 24 * 60 * 60  # a settle stub on a device that never existed expires after this


class BookkeepingRequests(PlanContext):
    def reindex(self, item: dict) -> Planned | None:
        """Sets the live ``item``'s index attributes as its sections say, at its version
        (no journal entry, no new version: sent twice it sets the same values); None when
        they are already so. What ``make reindex`` sends for a field declared on a table
        that holds devices."""
        current = Device.from_item(item)
        documents = {STATE: current.state, DESIRED: current.desired, REPORTED: current.reported,
                     CONNECTIVITY: connectivity_of(item, self.now)}
        indexed, _ = self.fleet_index.attributes(current.device_id, documents, QUERYABLE)
        # what the item holds of fields not indexed now: undeclared, or of another type
        unindexed = [attribute for attribute in schema.StateItem.of(item).index_attributes if attribute not in indexed]
        if not unindexed and all(item.get(attribute) == value for attribute, value in indexed.items()):
            return None
        expr = Expression()
        growth = sum(1 + len(attribute.encode()) + value_size(value) for attribute, value in indexed.items()
                     if attribute not in item)
        item_bytes = expr.name(schema.ITEM_BYTES)
        sets = index_sets(expr, indexed, {}) + [f"{item_bytes} = {item_bytes} + {expr.number(growth)}"]
        update = "SET " + ", ".join(sets)
        if unindexed:
            update += " REMOVE " + ", ".join(expr.name(attribute) for attribute in unindexed)
        condition = (f"{self._at_version(expr, current.version)} AND "
                     f"{item_bytes} <= {expr.number(MAX_STATE_ITEM_BYTES - growth)}")
        return self._update(current.device_id, update, condition, expr, None, REINDEXED, current, current.version)

    def connect(self, device_id: str, opened: str) -> Planned:
        """Records the connection ``opened`` (``connectivity.member``) on the live device,
        unless it has ``MAX_CONNECTIONS`` open already: connected (also in the fleet index,
        where declared), since now if it was not, seen now. It returns what the item held before
        (UPDATED_OLD, at no cost): connections that all ended without their close show there."""
        expr = Expression()
        connections, since = expr.name(schema.CONNECTIONS), expr.name(schema.CONNECTED_SINCE)
        ours, now = expr.value({"SS": [opened]}), expr.number(int(self.now * 1000))
        sets = [f"{since} = if_not_exists({since}, {now})", f"{expr.name(schema.LAST_SEEN)} = {now}"]
        sets += index_sets(expr, connectivity_attributes(self.fleet_index, device_id, True), {})
        condition = " AND ".join([
            live(expr, self.now), *self._holder_condition(expr, device_id),
            f"(attribute_not_exists({connections}) OR contains({connections}, {expr.value({'S': opened})}) OR "
            f"size({connections}) < {expr.number(MAX_CONNECTIONS)})"])
        return self._update(device_id, f"ADD {connections} {ours} SET {', '.join(sets)}", condition, expr, None,
                            CONNECTED, ReturnValues="UPDATED_OLD")

    def disconnect(self, device_id: str, closed: list[str], held: list[str] | None = None) -> Planned:
        """Forgets the connections ``closed`` (members) of the live device, seen now, while
        others stay open (the last goes with ``all_disconnected``). ``held``: only while the
        item holds exactly these members (the set read), so that of two connections closing
        at once, the second finds the first gone and closes as the last."""
        expr = Expression()
        update = (f"DELETE {expr.name(schema.CONNECTIONS)} {expr.value({'SS': closed})} "
                  f"SET {expr.name(schema.LAST_SEEN)} = {expr.number(int(self.now * 1000))}")
        condition = live(expr, self.now)
        if held is not None:
            condition += f" AND {_holds_exactly(expr, held)}"
        return self._update(device_id, update, condition, expr, None, DISCONNECTED)

    def all_disconnected(self, device_id: str, gone: list[str]) -> Planned:
        """Not connected, seen now: removes the members ``gone`` (the closing connection and
        those whose close never came) and ``connectedSince``, and marks the fleet index, only
        while those are all the item holds (a connect meanwhile refuses it)."""
        expr = Expression()
        connections, now = expr.name(schema.CONNECTIONS), expr.number(int(self.now * 1000))
        condition = f"{live(expr, self.now)} AND {_holds_exactly(expr, gone)}"
        sets = [f"{expr.name(schema.LAST_SEEN)} = {now}"]
        sets += index_sets(expr, connectivity_attributes(self.fleet_index, device_id, False), {})
        update = f"SET {', '.join(sets)} REMOVE {expr.name(schema.CONNECTED_SINCE)}"
        if gone:
            update += f" DELETE {connections} {expr.value({'SS': gone})}"
        return self._update(device_id, update, condition, expr, None, ALL_DISCONNECTED)

    def seen(self, device_id: str) -> Planned:
        """The live device seen now, unless it was within ``SEEN_EVERY_SECONDS``."""
        expr = Expression()
        seen, now = expr.name(schema.LAST_SEEN), int(self.now * 1000)
        condition = (f"{live(expr, self.now)} AND (attribute_not_exists({seen}) OR "
                     f"{seen} <= {expr.number(now - SEEN_EVERY_SECONDS * 1000)})")
        return self._update(device_id, f"SET {seen} = {expr.number(now)}", condition, expr, None, SEEN)

    def settle_mark(self, device_id: str, write: WriteId, on_versioned_item: bool) -> Planned:
        """Marks ``write`` as never applied unless it already did: once it lands, no copy
        of the write can land any more (each requires its entry absent). On an item without
        a version (a device that never existed) it leaves a stub that reads as absent and
        expires. Sent alone (``WritePipeline.settle``), never in a transaction."""
        expr = Expression()
        journaled, version = expr.name(write.attribute), expr.name(schema.VERSION)
        update = f"SET {journaled} = {expr.number(0)}"
        if on_versioned_item:
            condition = f"attribute_not_exists({journaled}) AND attribute_exists({version})"
        else:
            update += f", {expr.name(schema.TTL_ATTRIBUTE)} = {expr.number(int(self.now) + STUB_SECONDS)}"
            condition = f"attribute_not_exists({journaled}) AND attribute_not_exists({version})"
        return self._update(device_id, update, condition, expr, None, SETTLE_MARK, ReturnValues="ALL_NEW")

    def register_credential(self, item: dict, credential_id: str, expires: int, certificate: bool) -> Planned:
        """Adds ``credential_id`` (expiring at ``expires``, epoch seconds; 0: never) to the live
        ``item``'s credentials, unless it holds ``MAX_CREDENTIALS`` already; a certificate also
        marks the device as requiring registered certificates from now on. No version; a journal
        entry (at the current version) lets a lost answer be settled."""
        current = Device.from_item(item)
        expr = Expression()
        name, credentials = expr.name, expr.name(schema.CREDENTIALS)
        removes = []
        value = certificate_entry(expires) if certificate else str(expires)
        if schema.CREDENTIALS in item:  # the map stays, empty, once its last credential is revoked
            held = entries(item)
            entry = f"{credentials}.{name(credential_id)}"
            sets = [f"{entry} = {expr.value({'N': value})}"]
            # Expired entries leave in the same write (one of the same id is replaced): the
            # condition holds each at the expiry read, so the size it reads counts them exactly
            # and none revoked and registered again meanwhile is taken off.
            gone = expired(item, self.now)
            removes = [f"{credentials}.{name(other)}" for other in gone if other != credential_id]
            room = expr.number(MAX_CREDENTIALS + len(gone))
            condition = " AND ".join([
                f"attribute_exists({credentials}) AND size({credentials}) < {room}",
                f"{entry} = {expr.value({'N': held[credential_id]})}" if credential_id in gone
                else f"attribute_not_exists({entry})",
                *(f"{credentials}.{name(other)} = {expr.value({'N': held[other]})}" for other in gone
                  if other != credential_id)])
        else:
            sets = [f"{credentials} = {expr.value({'M': {credential_id: {'N': value}}})}"]
            condition = f"attribute_not_exists({credentials})"
        if certificate:
            sets.append(f"{name(schema.CERTIFICATE_REQUIRED)} = {expr.value({'BOOL': True})}")
        return self._journaled(expr, current.device_id, sets, removes, f"{live(expr, self.now)} AND {condition}",
                               CREDENTIAL_REGISTERED, current)

    def revoke_credential(self, item: dict, credential_id: str) -> Planned:
        """Removes ``credential_id`` from the live ``item``'s credentials (the device's tokens of
        it open nothing from now on). A journal entry lets a lost answer be settled."""
        current = Device.from_item(item)
        expr = Expression()
        entry = f"{expr.name(schema.CREDENTIALS)}.{expr.name(credential_id)}"
        return self._journaled(expr, current.device_id, [], [entry], f"{live(expr, self.now)} AND attribute_exists({entry})",
                               CREDENTIAL_REVOKED, current)

    def _journaled(self, expr: Expression, device_id: str, sets: list[str], removes: list[str], condition: str,
                   outcome: str, device: Device) -> Planned:
        """A bookkeeping request that records a journal entry holding the item's version, so
        that ``WritePipeline.settle`` can tell whether it applied when its answer was lost."""
        write = WriteId.new(self.now)
        journaled, version = expr.name(write.attribute), expr.name(schema.VERSION)
        update = "SET " + ", ".join([*sets, f"{journaled} = {version}"])
        if removes:
            update += " REMOVE " + ", ".join(removes)
        return self._update(device_id, update, f"{condition} AND attribute_not_exists({journaled})", expr, write,
                            outcome, device)

    def take_lease(self, device_id: str, ticket: int, lease_token: str, until: float, created_at: dict) -> Planned:
        """Record ``ticket`` as the lease holder (until ``until``) on the live device created at
        ``created_at`` (its stored attribute: the one the ticket queued on, not one created again
        since), unless another lease is active, a later ticket was granted (``leaseLast``), or the
        device's own request no longer holds its credential."""
        expr = Expression()
        token, holder_until, ours = expr.name(schema.LEASE_TOKEN), expr.name(schema.LEASE_UNTIL), expr.number(ticket)
        last = expr.name(schema.LEASE_LAST)
        now = lease_instant(self.now)
        condition = " AND ".join([
            live(expr, now), f"{expr.name(schema.CREATED_AT)} = {expr.value(created_at)}",
            *self._holder_condition(expr, device_id),
            f"(attribute_not_exists({token}) OR {holder_until} <= {expr.number(now)} OR {token} = {ours})",
            f"(attribute_not_exists({last}) OR {last} <= {ours})"])  # no lower ticket after a higher one
        update = (f"SET {token} = {ours}, {expr.name(schema.LEASE_KEY)} = {expr.value({'S': lease_key(lease_token)})}, "
                  f"{holder_until} = {expr.number(until)}, {last} = {ours}")
        return self._update(device_id, update, condition, expr, None, LEASE_TAKEN)

    def extend_lease(self, device_id: str, ticket: int, until: float) -> Planned:
        """Move the expiry of the lease ``ticket`` holds, while it still holds it (and the device's
        own request its credential)."""
        expr = Expression()
        holder_until = expr.name(schema.LEASE_UNTIL)
        condition = " AND ".join([f"{expr.name(schema.LEASE_TOKEN)} = {expr.number(ticket)}",
                                  f"{holder_until} > {expr.number(lease_instant(self.now))}",
                                  *self._holder_condition(expr, device_id)])
        return self._update(device_id, f"SET {holder_until} = {expr.number(until)}", condition, expr, None,
                            LEASE_EXTENDED)

    def clear_lease(self, device_id: str, ticket: int) -> Planned:
        """Clear the lease holder, only if it is ``ticket`` (and the device's own request still holds
        its credential)."""
        expr = Expression()
        holder = ", ".join(expr.name(attribute) for attribute in schema.LEASE_ATTRIBUTES)
        condition = " AND ".join([f"{expr.name(schema.LEASE_TOKEN)} = {expr.number(ticket)}",
                                  *self._holder_condition(expr, device_id)])
        return self._update(device_id, f"REMOVE {holder}", condition, expr, None, LEASE_CLEARED)


def _holds_exactly(expr: Expression, members: list[str]) -> str:
    """The condition that the item's connections are exactly ``members`` (none: no set)."""
    connections = expr.name(schema.CONNECTIONS)
    if not members:
        return f"attribute_not_exists({connections})"
    return "(" + " AND ".join([f"size({connections}) = {expr.number(len(members))}"] + [
        f"contains({connections}, {expr.value({'S': entry})})" for entry in members]) + ")"
