"""Pure write planners: every request on a device's state item is built here, whatever
asks for it (single writes, compiled patches, keyed writes, transaction operations, lease
holder changes, settle marks, deletes and tombstones), from the item read (or none): the
request with all its conditions (version or liveness, lease fence, caller condition,
write identity; see ``journal``), and the device it leaves. Nothing here talks to DynamoDB.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from boto3.dynamodb.conditions import ConditionBase

from ..model import connectivity
from ..item import contention
from ..model import desires
from ..item import schema
from ..model.device import Device
from ..model.times import time_attribute, timestamp
from ..feed.items import change_item_size
from ..errors import DeviceAlreadyExists, DeviceNotFound, InvalidValue, ItemTooLarge, VersionConflict
from .expressions import Expression, live, not_live, number
from ..item.fencing import Fence, lease_key
from ..fleet.index import QUERYABLE, FleetIndex, compiled_attributes, connectivity_attributes, shard_of
from .keyed import CHECKED, CREATED, DELETED, REPLACED, UPDATED
from ..item.journal import (JOURNAL_KEEP, TRIMMED_STAMPS_KEEP, WriteId, trimmed_stamp, trimmed_stamps, trimming,
                      watermark)
from ..model.patches import INCREMENT, REMOVED
from ..model.sections import (ALL, DESIRED, DEVICE_SECTIONS, MAX_POINTER_BYTES,
                       REPORTED, STATE, STATUS, VERSION_SPAN, SectionWrite, check_pointer, leaf_entries,
                       longest_leaf_pointer, next_entries, pack, pointer_bytes, touched_by)
from ..model.updates import UpdateFn
from ..model.values import MAX_ITEM_BYTES, check_state, from_attribute, item_size, to_attribute

STUB_SECONDS = 24 * 60 * 60  # a settle stub on a device that never existed expires after this
DEFAULT_TOMBSTONE_SECONDS = 30 * 24 * 60 * 60
# Room a state write leaves on the item for what later requests add without a state change:
# journal entries (up to 16, ~25 bytes each) and the trimmed stamps, settle marks, the lease
# holder (~120), and connectivity (up to 4 connections of ~31 bytes, connectedSince and
# lastSeen, and where connectivity/connected is declared its index attribute and the shard).
BOOKKEEPING_BYTES = 768
MAX_STATE_ITEM_BYTES = MAX_ITEM_BYTES - BOOKKEEPING_BYTES  # the most a state write may leave on the item
COMPILED_EXTRA_BYTES = 8  # a compiled patch's version gaining a digit
_REMOVED = None  # an attribute a write removes, among those it writes (sized as absent)
_LARGEST_VERSION = number(VERSION_SPAN - 1)  # a version or changed mark, as sized for the item's budget
_LONGEST_NUMBER_BYTES = 21  # DynamoDB's size of a 38-digit number
_LONGEST_OUTCOME = max((CREATED, REPLACED, UPDATED), key=len)  # lastWrite, as sized for the item's budget

# What a lease holder change does to the state item (``Planned.outcome``). These carry no
# journal entry: each names its ticket in its condition, so sending one again is harmless.
LEASE_TAKEN, LEASE_EXTENDED, LEASE_CLEARED = "lease-taken", "lease-extended", "lease-cleared"
LEASE_OUTCOMES = frozenset({LEASE_TAKEN, LEASE_EXTENDED, LEASE_CLEARED})
REINDEXED = "reindexed"  # index attributes set as the item's sections say (``Planner.reindex``)
# What a connectivity change does to the state item: no version, no journal entry; each is
# the same when sent again (a set member added or deleted, a time set).
CONNECTED, DISCONNECTED, ALL_DISCONNECTED, SEEN = "connected", "disconnected", "all-disconnected", "seen"
CONNECTIVITY_OUTCOMES = frozenset({CONNECTED, DISCONNECTED, ALL_DISCONNECTED, SEEN})
SETTLE_MARK = "settle-mark"  # a lost write marked as never applied (classified by ``WritePipeline.settle``)


@dataclass(frozen=True)
class Planned:
    """One request on a device's state item, ready to send alone (``WritePipeline.send``) or
    with others in a transaction (TransactWriteItems form)."""

    device_id: str
    request: dict
    device: Device | None  # after the write (a delete: as it was; a compiled patch, a lease change: unknown)
    outcome: str
    expected_version: int | None = None
    write: WriteId | None = None  # its journal entry; None: idempotent by its condition (a lease change)


def _apply(update_fn: UpdateFn, document: dict) -> dict:
    new_state = update_fn(copy.deepcopy(document))
    if new_state is None:
        raise TypeError("update_fn must return the new state")
    return new_state


@dataclass(frozen=True)
class Planner:
    """Plans writes at one instant (``now``, epoch seconds) under one lease fence."""

    table_name: str
    fence: Fence
    now: float
    tombstone_seconds: int = DEFAULT_TOMBSTONE_SECONDS
    fleet_index: FleetIndex = FleetIndex()
    seen_by: str | None = None  # the device whose own writes these are: they set its lastSeen too
    raced: contention.Raced | None = None  # how a read-modify-write came to this try (None: it races no one)

    # ---------------------------------------------------------------- planners

    def create(self, device_id: str, state: dict, item: dict | None, sections: dict | None = None) -> Planned:
        """Create over nothing, a settle stub, or a tombstone (its version continues).
        ``sections``: the device's desired and reported (each ``{}`` when absent)."""
        if schema.is_live_state(item, self.now):
            raise DeviceAlreadyExists(device_id, Device.from_item(item))
        check_state(state)
        previous = int(item[schema.VERSION]["N"]) if item and schema.VERSION in item else 0
        stamp = timestamp(self.now)
        documents = {section: (sections or {}).get(section) or {} for section in DEVICE_SECTIONS}
        entries = {section: next_entries(documents[section], {}, (ALL,), pack(previous + 1, self.now))
                   for section in DEVICE_SECTIONS}
        device = Device(device_id, previous + 1, state, stamp, stamp, desired=documents[DESIRED],
                        reported=documents[REPORTED], entries=entries)
        expr, written = Expression(), {schema.STATE: to_attribute(state)}
        name, now = expr.name, expr.value(time_attribute(self.now))
        if previous:
            condition = f"{name(schema.VERSION)} = {expr.number(previous)} AND {not_live(expr, self.now)}"
        else:
            condition = f"attribute_not_exists({name(schema.VERSION)})"
        sets = [f"{name(schema.STATE)} = {expr.value(written[schema.STATE])}", f"{name(schema.CREATED_AT)} = {now}",
                f"{name(schema.UPDATED_AT)} = {now}"]
        sets += _section_sets(expr, documents, entries, device.version, written)
        removes = [name(attribute) for attribute in schema.GONE_ON_CREATE]
        indexed, unindexed = self.fleet_index.attributes(device_id, {STATE: state, **documents})
        # a new device is not connected, and a query for the disconnected finds it
        indexed.update(connectivity_attributes(self.fleet_index, device_id, False))
        sets += _index_sets(expr, indexed, written)
        removes += [name(attribute) for attribute in unindexed]
        return self._planned(expr, device_id, item, device, CREATED, previous or None, condition, sets, removes,
                             written)

    def replace_state(self, item: dict, update_fn: UpdateFn, condition: ConditionBase | None,
                      outcome: str, section: str = STATE, options=None) -> Planned:
        """``update_fn(state)`` (or of another section) written over the live ``item``, at its
        version; ``options``: a desired write's ``desires.DesireOptions``."""
        return self.write_sections(item, [SectionWrite(section, update_fn, None, options)], condition, outcome)

    def write_sections(self, item: dict, writes: list[SectionWrite], condition: ConditionBase | None,
                       outcome: str) -> Planned:
        """Each ``SectionWrite``'s update function applied to its section of the live
        ``item``, all in one write at its version; desired and reported renew the
        metadata of the leaves each write touched. The item it leaves holds what the size
        formula counts (``_held_sets``)."""
        return self._making_room(lambda keep_cleared: self._write_sections(item, writes, condition, outcome,
                                                                           keep_cleared))

    def _write_sections(self, item: dict, writes: list[SectionWrite], condition: ConditionBase | None,
                        outcome: str, keep_cleared: bool) -> Planned:
        current = Device.from_item(item)
        documents = {STATE: current.state, DESIRED: current.desired, REPORTED: current.reported}
        entries = dict(current.entries)
        stamp = timestamp(self.now)
        version = current.version + 1
        for write in writes:
            touched = write.touched if write.touched is not None else touched_by(write.update_fn,
                                                                                 documents[write.section])
            new_document = _apply(write.update_fn, documents[write.section])
            check_state(new_document)
            documents[write.section] = new_document
            if write.section != STATE:
                entries[write.section] = next_entries(new_document, entries.get(write.section, {}),
                                                      touched, pack(version, self.now))
            if write.section == DESIRED and (write.options or entries.get(STATUS)):
                entries[STATUS] = desires.after_desired_write(new_document, entries, write.options or
                                                              desires.DesireOptions(), version, self.now,
                                                              replaced=ALL in touched)
        changed = {write.section for write in writes}
        if REPORTED in changed and entries.get(STATUS):
            confirmed = desires.after_report(documents[DESIRED], documents[REPORTED], entries, version)
            if confirmed is not None:  # the report confirmed desires marked clear on confirm
                documents[DESIRED], entries[STATUS] = confirmed
                entries[DESIRED] = next_entries(documents[DESIRED], entries.get(DESIRED, {}), (), 0)
                changed.add(DESIRED)
        expr, written = Expression(), {}
        sets = [f"{expr.name(schema.UPDATED_AT)} = {expr.value(time_attribute(self.now))}"]
        if STATE in changed:
            written[schema.STATE] = to_attribute(documents[STATE])
            sets.insert(0, f"{expr.name(schema.STATE)} = {expr.value(written[schema.STATE])}")
        sets += _section_sets(expr, {section: documents[section] for section in DEVICE_SECTIONS if section in changed},
                              entries, version, written)
        indexed, unindexed = self.fleet_index.attributes(current.device_id, documents, changed)
        sets += _index_sets(expr, indexed, written)
        removes = [expr.name(attribute) for attribute in unindexed]
        written.update(dict.fromkeys(unindexed, _REMOVED))
        _held_sets(expr, item, documents, entries, changed, keep_cleared, sets, removes, written)
        device = Device(current.device_id, version, documents[STATE], current.created_at, stamp,
                        desired=documents[DESIRED], reported=documents[REPORTED], entries=entries)
        return self._planned(expr, current.device_id, item, device, outcome, current.version,
                             self._at_version(expr, current.version), sets, removes, written, condition)

    def acknowledge(self, item: dict, acks: list) -> Planned:
        """Records the device's acknowledgements (``desires.Ack``) of desires on the live
        ``item``, at its version: a change to desired's statuses (its documents stay),
        which wakes delta waiters as a desired write does. ``DesireMoved`` when an ack
        answers a desire that is not the leaf's current one."""
        return self._making_room(lambda keep_cleared: self._acknowledge(item, acks, keep_cleared))

    def _acknowledge(self, item: dict, acks: list, keep_cleared: bool) -> Planned:
        current = Device.from_item(item)
        version = current.version + 1
        documents = {STATE: current.state, DESIRED: current.desired, REPORTED: current.reported}
        entries = {**current.entries, STATUS: desires.after_acks(current.desired, current.entries, acks, self.now)}
        expr, written, removes = Expression(), {}, []
        stamp = timestamp(self.now)
        sets = [f"{expr.name(schema.UPDATED_AT)} = {expr.value(time_attribute(self.now))}",
                f"{expr.name(schema.CHANGED_ATTRIBUTES[DESIRED])} = {expr.number(version)}"]
        written[schema.CHANGED_ATTRIBUTES[DESIRED]] = _LARGEST_VERSION
        _held_sets(expr, item, documents, entries, set(), keep_cleared, sets, removes, written)
        device = Device(current.device_id, version, current.state, current.created_at, stamp,
                        desired=current.desired, reported=current.reported, entries=entries)
        return self._planned(expr, current.device_id, item, device, UPDATED, current.version,
                             self._at_version(expr, current.version), sets, removes, written)

    def delete(self, item: dict) -> Planned:
        """The device becomes a tombstone: its version goes on (so it never repeats), its
        state goes, and it expires after ``tombstone_seconds``."""
        current = Device.from_item(item)
        expr = Expression()
        name, now = expr.name, expr.value({"S": timestamp(self.now)})
        sets = [f"{name(schema.DELETED_AT)} = {now}", f"{name(schema.UPDATED_AT)} = {expr.value(time_attribute(self.now))}",
                f"{name(schema.TTL_ATTRIBUTE)} = {expr.number(int(self.now) + self.tombstone_seconds)}"]
        removes = [name(attribute) for attribute in (*schema.DELETED_WITH_THE_DEVICE,
                                                     *schema.StateItem.of(item).index_attributes)]
        return self._planned(expr, current.device_id, item, current, DELETED, current.version,
                             self._at_version(expr, current.version), sets, removes, {},
                             version=current.version + 1)

    def check(self, item: dict, condition: ConditionBase | None) -> Planned:
        current = Device.from_item(item)
        expr = Expression()
        expression = self._at_version(expr, current.version)
        if condition is not None:
            expression += " AND " + expr.condition(condition)
        request = {"ConditionCheck": {
            "TableName": self.table_name, "Key": schema.state_key(current.device_id),
            "ConditionExpression": expression, **expr.attributes(),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }}
        return Planned(current.device_id, request, current, CHECKED, current.version)

    def compiled(self, device_id: str, compiled, seen: dict | None = None, section: str = STATE) -> Planned | None:
        """A patch compiled to one UpdateItem: no read, no version condition; its write id
        alone keeps any copy of it from applying twice. A desired or reported patch sets the
        metadata of the members it sets and removes that of the members it removes, in the
        same request (``sections.pack``), on condition that this leaves one entry per leaf
        (``_one_entry_per_leaf``). It also
        drops the journal entries that ``seen`` (the item as this container last saw it, if
        it did) shows beyond the journal's keep: entries written since are newer still, so
        the newest stay. It ADDs the newest stamp it drops to ``journalTrimmedStamps``, or,
        when it saw ``TRIMMED_STAMPS_KEEP`` of them, prunes the set and drops only what the
        set covers (see the module's docstring). None when the metadata keys of its members
        (``check_pointer``) cannot be stored (read-modify-write then decides)."""
        try:
            if section != STATE:
                for leaf in compiled.pointers:
                    check_pointer(leaf)
                # an object set at a member has leaves below it, each keyed by its full pointer
                inner = max(map(longest_leaf_pointer, compiled.values.values()), default=0)
                if inner and max(map(pointer_bytes, compiled.pointers), default=0) + inner > MAX_POINTER_BYTES:
                    return None
        except (InvalidValue, TypeError, ArithmeticError):
            return None
        expr = compiled.expression.copy()  # the request goes on with the patch's placeholders
        name = expr.name
        write = WriteId.new(self.now)
        stamps = trimmed_stamps(seen)
        pruning = len(stamps) >= TRIMMED_STAMPS_KEEP
        journal_removes, newest_dropped = trimming(
            expr, seen, JOURNAL_KEEP - 1, self.now, covered=trimmed_stamp(seen) if pruning else None)
        adds_stamp = not pruning and newest_dropped > trimmed_stamp(seen)
        growth = _most_added(compiled)
        version, one = name(schema.VERSION), expr.number(1)
        sets = list(compiled.sets)
        conditions = list(compiled.conditions)
        indexed, operands, unindexed = compiled_attributes(self.fleet_index.in_sections((section,)), compiled.effects)
        if indexed or operands:
            indexed[schema.SHARD_ATTRIBUTE] = {"N": str(shard_of(device_id))}
        sets += _index_sets(expr, indexed, {})
        sets += [f"{name(attribute)} = {operand}" for attribute, operand in operands.items()]
        # each index attribute as if new (an increment's number at DynamoDB's longest)
        growth += sum(1 + len(attribute.encode()) + _value_size(value) for attribute, value in indexed.items())
        growth += sum(1 + len(attribute.encode()) + _LONGEST_NUMBER_BYTES for attribute in operands)
        removes = list(compiled.removes)
        if section != STATE:
            meta, map_type = name(schema.META_ATTRIBUTES[section]), expr.value({"S": "M"})
            removed = compiled.removed
            gone = set(removed)
            renewed = [leaf for leaf in compiled.pointers if leaf not in gone]
            if renewed:
                stamp = expr.number(pack(1, self.now))
                sets += [f"{meta}.{name(leaf)} = {version} + {stamp}" for leaf in renewed]
            removes += [f"{meta}.{name(leaf)}" for leaf in removed]  # a member's entry goes with it
            sets.append(f"{name(schema.CHANGED_ATTRIBUTES[section])} = {version} + {one}")
            conditions += [f"attribute_type({compiled.root}, {map_type})", f"attribute_type({meta}, {map_type})"]
            conditions += _one_entry_per_leaf(expr, compiled, map_type)
            if section == REPORTED:  # a report that may clear a desire reads first (write_sections)
                conditions.append(f"attribute_not_exists({name(schema.CLEAR_PENDING)})")
            # each metadata entry it sets and the section's changed mark, all as if new
            growth += sum(1 + len(leaf.encode()) + _value_size(number(pack(VERSION_SPAN - 1, self.now)))
                          for leaf in renewed)
            growth += 1 + len(schema.CHANGED_ATTRIBUTES[section]) + _value_size(number(VERSION_SPAN - 1))
        if self.seen_by == device_id:  # bookkeeping: in BOOKKEEPING_BYTES, not in the growth
            sets.append(f"{name(schema.LAST_SEEN)} = {expr.number(int(self.now * 1000))}")
        item_bytes, journaled = name(schema.ITEM_BYTES), name(write.attribute)
        update = "SET " + ", ".join(sets + [
            f"{version} = {version} + {one}", f"{name(schema.UPDATED_AT)} = {expr.value(time_attribute(self.now))}",
            f"{journaled} = {version} + {one}", f"{item_bytes} = {item_bytes} + {expr.number(growth)}"])
        conditions.insert(0, f"{item_bytes} <= {expr.number(MAX_STATE_ITEM_BYTES - growth)}")
        removes += [name(attribute) for attribute in unindexed] + journal_removes + [
            name(schema.LAST_WRITE), *map(name, schema.CONTENTION_MARKS)]
        if removes:
            update += " REMOVE " + ", ".join(removes)
        if pruning:
            pruned = expr.value({"NS": [str(stamp) for stamp in stamps[:-1]]})
            update += f" DELETE {name(schema.JOURNAL_TRIMMED_STAMPS)} {pruned}"
        elif adds_stamp:
            update += f" ADD {name(schema.JOURNAL_TRIMMED_STAMPS)} {expr.value({'NS': [str(newest_dropped)]})}"
        expression = " AND ".join([live(expr, self.now), f"attribute_not_exists({journaled})",
                                   self.fence.condition(device_id, expr, self.now), *conditions])
        return self._update(device_id, update, expression, expr, write, UPDATED, ReturnValues="ALL_NEW")

    def reindex(self, item: dict) -> Planned | None:
        """Sets the live ``item``'s index attributes as its sections say, at its version
        (no journal entry, no new version: sent twice it sets the same values); None when
        they are already so. What ``make reindex`` sends for a field declared on a table
        that holds devices."""
        current = Device.from_item(item)
        documents = {STATE: current.state, DESIRED: current.desired, REPORTED: current.reported,
                     connectivity.CONNECTIVITY: connectivity.connectivity_of(item, self.now)}
        indexed, _ = self.fleet_index.attributes(current.device_id, documents, QUERYABLE)
        # what the item holds of fields not indexed now: undeclared, or of another type
        unindexed = [attribute for attribute in schema.StateItem.of(item).index_attributes if attribute not in indexed]
        if not unindexed and all(item.get(attribute) == value for attribute, value in indexed.items()):
            return None
        expr = Expression()
        growth = sum(1 + len(attribute.encode()) + _value_size(value) for attribute, value in indexed.items()
                     if attribute not in item)
        item_bytes = expr.name(schema.ITEM_BYTES)
        sets = _index_sets(expr, indexed, {}) + [f"{item_bytes} = {item_bytes} + {expr.number(growth)}"]
        update = "SET " + ", ".join(sets)
        if unindexed:
            update += " REMOVE " + ", ".join(expr.name(attribute) for attribute in unindexed)
        condition = (f"{self._at_version(expr, current.version)} AND "
                     f"{item_bytes} <= {expr.number(MAX_STATE_ITEM_BYTES - growth)}")
        return self._update(current.device_id, update, condition, expr, None, REINDEXED, current, current.version)

    def connect(self, device_id: str, opened: str) -> Planned:
        """Records the connection ``opened`` (``connectivity.member``) on the live device,
        unless it has ``MAX_CONNECTIONS`` open already: connected (also in the fleet index,
        where declared), since now if it was not, seen now."""
        expr = Expression()
        connections, since = expr.name(schema.CONNECTIONS), expr.name(schema.CONNECTED_SINCE)
        ours, now = expr.value({"SS": [opened]}), expr.number(int(self.now * 1000))
        sets = [f"{since} = if_not_exists({since}, {now})", f"{expr.name(schema.LAST_SEEN)} = {now}"]
        sets += _index_sets(expr, connectivity_attributes(self.fleet_index, device_id, True), {})
        condition = (f"{live(expr, self.now)} AND (attribute_not_exists({connections}) OR "
                     f"contains({connections}, {expr.value({'S': opened})}) OR "
                     f"size({connections}) < {expr.number(connectivity.MAX_CONNECTIONS)})")
        return self._update(device_id, f"ADD {connections} {ours} SET {', '.join(sets)}", condition, expr, None,
                            CONNECTED)

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
        sets += _index_sets(expr, connectivity_attributes(self.fleet_index, device_id, False), {})
        update = f"SET {', '.join(sets)} REMOVE {expr.name(schema.CONNECTED_SINCE)}"
        if gone:
            update += f" DELETE {connections} {expr.value({'SS': gone})}"
        return self._update(device_id, update, condition, expr, None, ALL_DISCONNECTED)

    def seen(self, device_id: str) -> Planned:
        """The live device seen now, unless it was within ``SEEN_EVERY_SECONDS``."""
        expr = Expression()
        seen, now = expr.name(schema.LAST_SEEN), int(self.now * 1000)
        condition = (f"{live(expr, self.now)} AND (attribute_not_exists({seen}) OR "
                     f"{seen} <= {expr.number(now - connectivity.SEEN_EVERY_SECONDS * 1000)})")
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

    def take_lease(self, device_id: str, ticket: int, lease_token: str, until: float) -> Planned:
        """Record ``ticket`` as the lease holder (until ``until``) on the live device, unless
        another lease is active."""
        expr = Expression()
        token, holder_until, ours = expr.name(schema.LEASE_TOKEN), expr.name(schema.LEASE_UNTIL), expr.number(ticket)
        now = lease_instant(self.now)
        condition = (f"{live(expr, now)} AND "
                     f"(attribute_not_exists({token}) OR {holder_until} <= {expr.number(now)} OR {token} = {ours})")
        update = (f"SET {token} = {ours}, {expr.name(schema.LEASE_KEY)} = {expr.value({'S': lease_key(lease_token)})}, "
                  f"{holder_until} = {expr.number(until)}")
        return self._update(device_id, update, condition, expr, None, LEASE_TAKEN)

    def extend_lease(self, device_id: str, ticket: int, until: float) -> Planned:
        """Move the expiry of the lease ``ticket`` holds, while it still holds it."""
        expr = Expression()
        holder_until = expr.name(schema.LEASE_UNTIL)
        condition = (f"{expr.name(schema.LEASE_TOKEN)} = {expr.number(ticket)} AND "
                     f"{holder_until} > {expr.number(lease_instant(self.now))}")
        return self._update(device_id, f"SET {holder_until} = {expr.number(until)}", condition, expr, None,
                            LEASE_EXTENDED)

    def clear_lease(self, device_id: str, ticket: int) -> Planned:
        """Clear the lease holder, only if it is ``ticket``."""
        expr = Expression()
        holder = ", ".join(expr.name(attribute) for attribute in schema.LEASE_ATTRIBUTES)
        condition = f"{expr.name(schema.LEASE_TOKEN)} = {expr.number(ticket)}"
        return self._update(device_id, f"REMOVE {holder}", condition, expr, None, LEASE_CLEARED)

    # --------------------------------------------------------------- internals

    @staticmethod
    def _making_room(plan: Callable[[bool], Planned]) -> Planned:
        """``plan(True)``; when that write does not fit beside the confirmations of cleared
        desires the item keeps, ``plan(False)``: they are history, and a write that needs
        their room takes it (a write that fits on a fresh device fits here too)."""
        try:
            return plan(True)
        except ItemTooLarge:
            return plan(False)

    def _update(self, device_id: str, update: str, condition: str, expr: Expression, write: WriteId | None,
                outcome: str, device: Device | None = None, expected_version: int | None = None,
                **returns) -> Planned:
        """An UpdateItem on the device's state item, in TransactWriteItems form."""
        request = {"Update": {
            "TableName": self.table_name, "Key": schema.state_key(device_id),
            "UpdateExpression": update, "ConditionExpression": condition, **expr.attributes(),
            **returns, "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }}
        return Planned(device_id, request, device, outcome, expected_version, write)

    def _connectivity_attribute(self) -> str | None:
        """The index attribute of ``connectivity/connected``, where it is declared."""
        field = self.fleet_index.field(connectivity.CONNECTIVITY, connectivity.CONNECTED_FIELD)
        return field.attribute if field else None

    def _at_version(self, expr: Expression, version: int) -> str:
        """The condition that the item is live at ``version``."""
        return f"{expr.name(schema.VERSION)} = {expr.number(version)} AND {live(expr, self.now)}"

    def _planned(self, expr: Expression, device_id: str, item: dict | None, device: Device, outcome: str,
                 expected_version: int | None, condition: str, sets: list[str], removes: list[str],
                 written: dict, caller_condition: ConditionBase | None = None, *,
                 version: int | None = None) -> Planned:
        """A journaled state write: bumps the version, records its write id, trims the journal.
        ``written``: the section attributes it sets, by name, as stored (``_REMOVED``: removes)."""
        name = expr.name
        write = WriteId.new(self.now)
        next_version = device.version if version is None else version
        journal_removes, newest_dropped = trimming(expr, item, JOURNAL_KEEP - 1, self.now)
        journaled, next_placeholder = name(write.attribute), expr.number(next_version)
        sets = [*sets, f"{name(schema.VERSION)} = {next_placeholder}", f"{journaled} = {next_placeholder}"]
        # The stream processor tells replaced from updated by it (created and deleted by the
        # images): stored only when replaced, it costs the item nothing on every other write.
        if outcome == REPLACED:
            sets.append(f"{name(schema.LAST_WRITE)} = {expr.value({'S': outcome})}")
        else:
            removes = [*removes, name(schema.LAST_WRITE)]
        if self.seen_by == device_id and outcome != DELETED:
            sets.append(f"{name(schema.LAST_SEEN)} = {expr.number(int(self.now * 1000))}")
        if outcome != DELETED:
            # What this write leaves, with what grows from write to write (versions, the
            # outcome's name) at its largest: a state accepted once fits again later.
            written = {**written, **{schema.CHANGED_ATTRIBUTES[section]: _LARGEST_VERSION for section in DEVICE_SECTIONS
                                     if section in written}}
            left = {**schema.state_key(device_id), **_without_bookkeeping(item, self._connectivity_attribute()),
                    **written,
                    schema.VERSION: _LARGEST_VERSION, write.attribute: number(next_version),
                    schema.CREATED_AT: {"S": device.created_at}, schema.UPDATED_AT: {"S": device.updated_at},
                    schema.LAST_WRITE: {"S": _LONGEST_OUTCOME}, schema.ITEM_BYTES: number(MAX_ITEM_BYTES)}
            size = _checked_size({name: value for name, value in left.items() if value is not _REMOVED}, device)
            sets.append(f"{name(schema.ITEM_BYTES)} = {expr.number(size)}")
            if self.raced is not None:
                marks, unmarked = contention.changes(item, self.now, self.raced, room=MAX_STATE_ITEM_BYTES - size)
                sets += [f"{name(mark)} = {expr.value(value)}" for mark, value in marks.items()]
                removes = [*removes, *map(name, unmarked)]
        else:
            removes = [*removes, *map(name, contention.present(item))]
        # The version condition makes this write's view exact, so it folds what compiled patches
        # added into its own watermark.
        folded = max(newest_dropped, max(trimmed_stamps(item), default=0))
        if folded > watermark(item):
            sets.append(f"{name(schema.JOURNAL_TRIMMED)} = {expr.number(folded)}")
        if schema.JOURNAL_TRIMMED_STAMPS in (item or {}):
            removes = [*removes, name(schema.JOURNAL_TRIMMED_STAMPS)]
        update = "SET " + ", ".join(sets)
        if removes or journal_removes:
            update += " REMOVE " + ", ".join(removes + journal_removes)
        expression = f"{condition} AND attribute_not_exists({journaled})"
        if outcome != CHECKED:
            expression += " AND " + self.fence.condition(device_id, expr, self.now)
        if caller_condition is not None:
            expression += " AND " + expr.condition(caller_condition)
        return self._update(device_id, update, expression, expr, write, outcome, device, expected_version)



def lease_instant(seconds: float) -> float:
    """Epoch seconds to the millisecond, as leases store and compare them."""
    return round(seconds, 3)


def _without_bookkeeping(item: dict | None, connectivity_attribute: str | None = None) -> dict:
    """The item without what ``BOOKKEEPING_BYTES`` keeps room for (journal, lease holder,
    connectivity, with its index attribute and, when no other index holds the device, the
    shard)."""
    kept = {name: value for name, value in (item or {}).items()
            if not name.startswith(schema.JOURNAL_PREFIX) and name not in schema.BOOKKEEPING_ATTRIBUTES
            and name != connectivity_attribute}
    if not any(name.startswith(schema.INDEX_ATTRIBUTE_PREFIX) for name in kept):
        kept.pop(schema.SHARD_ATTRIBUTE, None)
    return kept


def _checked_size(item: dict, device: Device) -> int:
    """The state item's size after a write, bookkeeping aside; ItemTooLarge unless it
    leaves the bookkeeping room and its change item (what the feed writes for this
    version) fits too."""
    size = item_size(item)
    if size > MAX_STATE_ITEM_BYTES:
        raise ItemTooLarge(f"the device item would be about {size} bytes; the limit is {MAX_STATE_ITEM_BYTES} "
                           f"(DynamoDB's {MAX_ITEM_BYTES} less {BOOKKEEPING_BYTES} kept for leases, the write "
                           "journal and its change record)")
    change_size = change_item_size(device, {name: item[name] for name in schema.SECTION_ATTRIBUTES if name in item})
    if change_size > MAX_ITEM_BYTES:
        raise ItemTooLarge(f"the change record of this version would be about {change_size} bytes; DynamoDB's "
                           f"limit is {MAX_ITEM_BYTES}")
    return size


def _most_added(compiled) -> int:
    """The most a compiled patch can add to the item, bookkeeping aside (its journal entry
    is in ``BOOKKEEPING_BYTES``): every member it names and every value it sets, as if all
    were new."""
    added = sum(1 + len(member.encode()) for member in compiled.members)
    added += sum(1 + _value_size(value) for value in compiled.attribute_values)
    return added + COMPILED_EXTRA_BYTES


def _value_size(attribute: dict) -> int:
    return item_size({"": attribute})


def _one_entry_per_leaf(expr: Expression, compiled, map_type: str) -> list[str]:
    """The conditions under which a compiled section patch leaves one metadata entry per
    leaf, and none of a removed one: no member it sets or removes is an object (the entries
    of its leaves would outlive them: read-modify-write replaces or removes it), and every
    object it removes members from keeps one (an object left empty becomes a leaf, which
    read-modify-write dates). An increment's own condition keeps its member a number."""
    conditions, removed_from = [], Counter()
    for parts, effect, _ in compiled.effects:
        if effect != INCREMENT:
            conditions.append(f"NOT attribute_type({expr.path(compiled.section, *parts)}, {map_type})")
        if effect == REMOVED and len(parts) > 1:
            removed_from[parts[:-1]] += 1
    return conditions + [f"size({expr.path(compiled.section, *parent)}) > {expr.number(count)}"
                         for parent, count in removed_from.items()]


def _index_sets(expr: Expression, indexed: dict, written: dict) -> list[str]:
    """SET clauses of index attributes (``fleet_index``); what they write goes into ``written``."""
    written.update(indexed)
    return [f"{expr.name(attribute)} = {expr.value(value)}" for attribute, value in indexed.items()]


def _holds_exactly(expr: Expression, members: list[str]) -> str:
    """The condition that the item's connections are exactly ``members`` (none: no set)."""
    connections = expr.name(schema.CONNECTIONS)
    if not members:
        return f"attribute_not_exists({connections})"
    return "(" + " AND ".join([f"size({connections}) = {expr.number(len(members))}"] + [
        f"contains({connections}, {expr.value({'S': entry})})" for entry in members]) + ")"


def _status_sets(expr: Expression, desired: dict, entries: dict, sets: list, removes: list, written: dict) -> None:
    """SET or REMOVE clauses of desired's statuses and of the clear-pending mark."""
    statuses = entries.get(STATUS) or {}
    if statuses:
        written[schema.STATUS_DESIRED] = to_attribute(statuses)
        sets.append(f"{expr.name(schema.STATUS_DESIRED)} = {expr.value(written[schema.STATUS_DESIRED])}")
    else:
        written[schema.STATUS_DESIRED] = _REMOVED
        removes.append(expr.name(schema.STATUS_DESIRED))
    if desires.clear_pending(desired, entries):
        written[schema.CLEAR_PENDING] = {"BOOL": True}
        sets.append(f"{expr.name(schema.CLEAR_PENDING)} = {expr.value({'BOOL': True})}")
    else:
        written[schema.CLEAR_PENDING] = _REMOVED
        removes.append(expr.name(schema.CLEAR_PENDING))


def _held_sets(expr: Expression, item: dict, documents: dict, entries: dict, changed: set, keep_cleared: bool,
               sets: list, removes: list, written: dict) -> None:
    """What a write at the version leaves beside the documents, as the size formula counts
    it: one metadata entry per leaf of desired and reported (a section it does not change
    sheds entries that read-free writes left: at members since removed, or at an object they
    set), desired's statuses as ``desires.kept`` keeps them, and the clear-pending mark. It
    sets ``entries`` so, and adds the clauses that store what changed."""
    for section in DEVICE_SECTIONS:
        if section in changed:
            continue
        held = leaf_entries(documents[section], entries.get(section, {}))  # its entries are the stored ones
        if held != entries.get(section, {}):
            meta = schema.META_ATTRIBUTES[section]
            entries[section], written[meta] = held, to_attribute(held)
            sets.append(f"{expr.name(meta)} = {expr.value(written[meta])}")
    statuses = desires.kept(documents[DESIRED], entries, keep_cleared)
    entries.pop(STATUS, None)
    if statuses:
        entries[STATUS] = statuses
    stored = from_attribute(item[schema.STATUS_DESIRED]) if schema.STATUS_DESIRED in item else {}
    if statuses != stored or (schema.CLEAR_PENDING in item) != desires.clear_pending(documents[DESIRED], entries):
        _status_sets(expr, documents[DESIRED], entries, sets, removes, written)


def _section_sets(expr: Expression, documents: dict, entries: dict, version: int, written: dict) -> list[str]:
    """SET clauses writing desired/reported documents, their metadata and changed marks
    (at ``version``); what they write goes into ``written``, by attribute."""
    sets = []
    for section, document in documents.items():
        meta = schema.META_ATTRIBUTES[section]
        written[section], written[meta] = to_attribute(document), to_attribute(entries.get(section, {}))
        sets += [f"{expr.name(section)} = {expr.value(written[section])}",
                 f"{expr.name(meta)} = {expr.value(written[meta])}",
                 f"{expr.name(schema.CHANGED_ATTRIBUTES[section])} = {expr.number(version)}"]
    return sets


def expect(device_id: str, item: dict | None, expected_version: int | None, now: float) -> dict:
    """The live item, checked against the version the caller expects (if any)."""
    if not schema.is_live_state(item, now):
        raise DeviceNotFound(device_id)
    if expected_version is not None:
        current = Device.from_item(item)
        if current.version != expected_version:
            raise VersionConflict(device_id, expected_version, current)
    return item

