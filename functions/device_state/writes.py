"""Pure write planners, the write journal, and how a refused write is classified.

Every state write is planned here from the item read (or none): the request with all
its conditions (version or liveness, lease fence, caller condition, write identity),
and the device it leaves. Nothing here talks to DynamoDB.

The write journal answers "did my write land?" when a write's answer was lost. Every
state write carries a fresh ``WriteId`` and records, in the same request, the
attribute ``w:<write id>`` holding the version it produced; it also requires that
attribute to be absent, so no copy of the same write can ever apply twice. Every write
keeps the newest ``JOURNAL_KEEP`` entries, and every entry younger than
``JOURNAL_KEEP_SECONDS`` (up to ``JOURNAL_MAX``): a writer whose answer was lost settles
within a round trip or two, and on a hot device more than ``JOURNAL_KEEP`` other writes
can land in that time. A write that drops entries raises a watermark to at least the
newest stamp it dropped, so an absent entry is proof of "never applied" only while the
watermarks are older than the write's own stamp: ``journalTrimmed``, SET by the writes
that read the item (their version condition makes it exact), and the highest of
``journalTrimmedStamps``, a number set to which compiled patches ADD the newest stamp
they dropped. Compiled patches read nothing and drop what their container last saw of
the journal; a set union is the same in whatever order containers apply it, so the
highest stamp is exact however many trim at once (an ADD to a number from each one's view
added up, and once stood decades ahead, turning every later settle into a 504). A patch
that sees ``TRIMMED_STAMPS_KEEP`` stamps DELETEs all but the highest it saw (never the
highest of all: nobody sees a higher one) and drops only entries the set already covers;
a write that reads the item folds the set into ``journalTrimmed`` and removes it.
"""

from __future__ import annotations

import copy
import secrets
from dataclasses import dataclass
from typing import Callable

from boto3.dynamodb.conditions import ConditionBase

from . import table
from .device import Device, timestamp
from .changes import change_item_size
from .errors import (ConditionFailed, DeviceAlreadyExists, DeviceNotFound, InvalidValue, ItemTooLarge,
                     VersionConflict)
from .expressions import LIVE, NOT_LIVE, and_condition, names_in, number
from .fencing import Fence
from .idempotency import CHECKED, CREATED, DELETED, REPLACED, UPDATED
from .retry import Moved
from .sections import (ALL, CHANGED_ATTRIBUTES, DESIRED, DEVICE_SECTIONS, META_ATTRIBUTES, REPORTED, STATE,
                       VERSION_SPAN, SectionWrite, check_pointer, next_entries, pack, touched_by)
from .values import MAX_ITEM_BYTES, check_state, item_size, to_attribute

UpdateFn = Callable[[dict], dict]

JOURNAL_KEEP = 8  # the newest entries every write leaves on the item
JOURNAL_KEEP_SECONDS = 1.0  # and the entries younger than this (by the trimming writer's clock)...
JOURNAL_MAX = 16  # ...up to this many entries in all
TRIMMED_STAMPS_KEEP = 4  # a compiled patch that sees this many trimmed stamps prunes them instead of adding one
SETTLED_KEEP_SECONDS = 60  # a "never applied" marker outlives any copy of its write by far
STUB_SECONDS = 24 * 60 * 60  # a settle stub on a device that never existed expires after this
DEFAULT_TOMBSTONE_SECONDS = 30 * 24 * 60 * 60
# Room a state write leaves on the item for what later requests add without a state change:
# journal entries (up to 16, ~25 bytes each) and the trimmed stamps, settle marks, and the
# lease holder (~120).
BOOKKEEPING_BYTES = 768
MAX_STATE_ITEM_BYTES = MAX_ITEM_BYTES - BOOKKEEPING_BYTES  # the most a state write may leave on the item
COMPILED_EXTRA_BYTES = 8  # a compiled patch's version gaining a digit, lastWrite becoming "updated"
# What a state write stores and its change record copies: the sections and their metadata.
SECTION_ATTRIBUTES = (table.STATE, table.DESIRED, table.REPORTED, table.META_DESIRED, table.META_REPORTED)
BOOKKEEPING_ATTRIBUTES = frozenset({table.JOURNAL_TRIMMED, table.JOURNAL_TRIMMED_STAMPS, table.LEASE_TOKEN, table.LEASE_KEY, table.LEASE_UNTIL})

_LARGEST_VERSION = number(VERSION_SPAN - 1)  # a version or changed mark, as sized for the item's budget
_LONGEST_OUTCOME = max((CREATED, REPLACED, UPDATED), key=len)  # lastWrite, as sized for the item's budget

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_STAMP_WIDTH = 9  # base 36 milliseconds, good past the year 5000


@dataclass(frozen=True)
class WriteId:
    """One write's identity: when it was planned (ms, its writer's clock) and a nonce."""

    stamp_ms: int
    nonce: str

    @classmethod
    def new(cls, now: float) -> "WriteId":
        return cls(int(now * 1000), secrets.token_hex(4))

    @property
    def attribute(self) -> str:
        stamp, digits = self.stamp_ms, ""
        while stamp:
            stamp, digit = divmod(stamp, 36)
            digits = _DIGITS[digit] + digits
        return f"{table.JOURNAL_PREFIX}{digits.rjust(_STAMP_WIDTH, '0')}{self.nonce}"

    @classmethod
    def parse(cls, attribute: str) -> "WriteId | None":
        body = attribute[len(table.JOURNAL_PREFIX):]
        if not attribute.startswith(table.JOURNAL_PREFIX) or len(body) <= _STAMP_WIDTH:
            return None
        try:
            return cls(int(body[:_STAMP_WIDTH], 36), body[_STAMP_WIDTH:])
        except ValueError:
            return None


def journal(item: dict | None) -> list[tuple[WriteId, int]]:
    """The journal entries on an item: (write id, version it produced; 0 = never applied)."""
    entries = []
    for name, value in (item or {}).items():
        write = WriteId.parse(name) if name.startswith(table.JOURNAL_PREFIX) else None
        if write is not None and "N" in value:
            entries.append((write, int(value["N"])))
    return entries


def written_version(item: dict | None, write: WriteId) -> int | None:
    """The version ``write`` produced per the item's journal, 0 if it was settled as
    never applied, None if the journal does not name it."""
    value = (item or {}).get(write.attribute)
    return int(value["N"]) if value and "N" in value else None


def trimmed_stamp(item: dict | None) -> int:
    """The newest write-id stamp the journal may have dropped: the highest watermark."""
    return max(_number(item, table.JOURNAL_TRIMMED), max(trimmed_stamps(item), default=0))


def trimmed_stamps(item: dict | None) -> list[int]:
    """The stamps compiled patches added to ``journalTrimmedStamps``, lowest first."""
    value = (item or {}).get(table.JOURNAL_TRIMMED_STAMPS)
    return sorted(int(stamp) for stamp in value["NS"]) if value else []


def _number(item: dict | None, name: str) -> int:
    value = (item or {}).get(name)
    return int(value["N"]) if value else 0


@dataclass(frozen=True)
class Planned:
    """One write, ready to send alone or in a transaction (TransactWriteItems form)."""

    request: dict
    device: Device | None  # after the write (a delete: as it was; a compiled patch: unknown)
    outcome: str
    expected_version: int | None = None
    write: WriteId | None = None


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

    # ---------------------------------------------------------------- planners

    def create(self, device_id: str, state: dict, item: dict | None, sections: dict | None = None) -> Planned:
        """Create over nothing, a settle stub, or a tombstone (its version continues).
        ``sections``: the device's desired and reported (each ``{}`` when absent)."""
        if table.is_live_state(item, self.now):
            raise DeviceAlreadyExists(device_id, Device.from_item(item))
        check_state(state)
        previous = int(item[table.VERSION]["N"]) if item and table.VERSION in item else 0
        stamp = timestamp(self.now)
        documents = {section: (sections or {}).get(section) or {} for section in DEVICE_SECTIONS}
        entries = {section: next_entries(documents[section], {}, (ALL,), pack(previous + 1, self.now))
                   for section in DEVICE_SECTIONS}
        device = Device(device_id, previous + 1, state, stamp, stamp, desired=documents[DESIRED],
                        reported=documents[REPORTED], entries=entries)
        values = {":state": to_attribute(state), ":now": {"S": stamp}}
        if previous:
            condition = f"#version = :expected AND {NOT_LIVE}"
            values[":expected"] = number(previous)
        else:
            condition = "attribute_not_exists(#version)"
        sets = ["#state = :state", "#createdAt = :now", "#updatedAt = :now"]
        sets += _section_sets(documents, entries, values)
        removes = ["#deletedAt", "#expiresAt", "#leaseToken", "#leaseKey", "#leaseUntil"]
        return self._planned(device_id, item, device, CREATED, previous or None, condition, sets, removes, values)

    def replace_state(self, item: dict, update_fn: UpdateFn, condition: ConditionBase | None,
                      outcome: str, section: str = STATE) -> Planned:
        """``update_fn(state)`` (or of another section) written over the live ``item``, at its version."""
        return self.write_sections(item, [SectionWrite(section, update_fn, None)], condition, outcome)

    def write_sections(self, item: dict, writes: list[SectionWrite], condition: ConditionBase | None,
                       outcome: str) -> Planned:
        """Each ``SectionWrite``'s update function applied to its section of the live
        ``item``, all in one write at its version; desired and reported renew the
        metadata of the leaves each write touched."""
        current = Device.from_item(item)
        documents = {STATE: current.state, DESIRED: current.desired, REPORTED: current.reported}
        entries = dict(current.entries)
        stamp = timestamp(self.now)
        version = current.version + 1
        values = {":now": {"S": stamp}, ":expected": number(current.version)}
        for write in writes:
            touched = write.touched if write.touched is not None else touched_by(write.update_fn,
                                                                                 documents[write.section])
            new_document = _apply(write.update_fn, documents[write.section])
            check_state(new_document)
            documents[write.section] = new_document
            if write.section != STATE:
                entries[write.section] = next_entries(new_document, entries.get(write.section, {}),
                                                      touched, pack(version, self.now))
        changed = {write.section for write in writes}
        sets = ["#updatedAt = :now"]
        if STATE in changed:
            sets.insert(0, "#state = :state")
            values[":state"] = to_attribute(documents[STATE])
        sets += _section_sets({section: documents[section] for section in DEVICE_SECTIONS if section in changed},
                              entries, values)
        device = Device(current.device_id, version, documents[STATE], current.created_at, stamp,
                        desired=documents[DESIRED], reported=documents[REPORTED], entries=entries)
        return self._planned(current.device_id, item, device, outcome, current.version,
                             f"#version = :expected AND {LIVE}", sets, [], values, condition)

    def delete(self, item: dict) -> Planned:
        """The device becomes a tombstone: its version goes on (so it never repeats), its
        state goes, and it expires after ``tombstone_seconds``."""
        current = Device.from_item(item)
        stamp = timestamp(self.now)
        values = {":now": {"S": stamp}, ":expected": number(current.version),
                  ":tombstoneExpires": number(int(self.now) + self.tombstone_seconds)}
        return self._planned(current.device_id, item, current, DELETED, current.version,
                             f"#version = :expected AND {LIVE}",
                             ["#deletedAt = :now", "#updatedAt = :now", "#expiresAt = :tombstoneExpires"],
                             ["#state", "#leaseToken", "#leaseKey", "#leaseUntil", "#desired", "#reported",
                              "#metaDesired", "#metaReported", "#changedDesired", "#changedReported"],
                             values, version=current.version + 1)

    def check(self, item: dict, condition: ConditionBase | None) -> Planned:
        current = Device.from_item(item)
        names = names_in(LIVE + "#version")
        values = {":expected": number(current.version), ":nowEpoch": number(self.now)}
        expression = and_condition(f"#version = :expected AND {LIVE}", names, values, condition)
        request = {"ConditionCheck": {
            "TableName": self.table_name, "Key": table.state_key(current.device_id),
            "ConditionExpression": expression, "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values, "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }}
        return Planned(request, current, CHECKED, current.version)

    def compiled(self, device_id: str, compiled, seen: dict | None = None, section: str = STATE) -> Planned | None:
        """A patch compiled to one UpdateItem: no read, no version condition; its write id
        alone keeps any copy of it from applying twice. A desired or reported patch sets the
        metadata of the members it changes in the same request (``sections.pack``). It also
        drops the journal entries that ``seen`` (the item as this container last saw it, if
        it did) shows beyond the journal's keep: entries written since are newer still, so
        the newest stay. It ADDs the newest stamp it drops to ``journalTrimmedStamps``, or,
        when it saw ``TRIMMED_STAMPS_KEEP`` of them, prunes the set and drops only what the
        set covers (see the module's docstring). None when its values or the metadata keys
        of its members (``check_pointer``) cannot be stored (read-modify-write then decides)."""
        try:
            check_state({"values": list(compiled.values.values())})
            values = {key: to_attribute(value) for key, value in compiled.values.items()}
            if section != STATE:
                for leaf in compiled.pointers:
                    check_pointer(leaf)
        except (InvalidValue, TypeError, ArithmeticError):
            return None
        write = WriteId.new(self.now)
        stamps = trimmed_stamps(seen)
        pruning = len(stamps) >= TRIMMED_STAMPS_KEEP
        journal_removes, newest_dropped, journal_names = _trimming(
            seen, JOURNAL_KEEP - 1, self.now, covered=trimmed_stamp(seen) if pruning else None)
        adds_stamp = not pruning and newest_dropped > trimmed_stamp(seen)
        trimmed = {"NS": [str(newest_dropped)]}
        growth = _most_added(compiled.names, values)
        values.update({":one": number(1), ":now": {"S": timestamp(self.now)}, ":nowEpoch": number(self.now),
                       ":lastWrite": {"S": UPDATED}})
        sets = list(compiled.sets)
        conditions = list(compiled.conditions)
        names = {}
        if section != STATE:
            meta = "#" + META_ATTRIBUTES[section]
            values[":metaStamp"] = number(pack(1, self.now))
            for index, leaf in enumerate(compiled.pointers):
                names[f"#m{index}"] = leaf
                sets.append(f"{meta}.#m{index} = #version + :metaStamp")
            sets.append(f"#{CHANGED_ATTRIBUTES[section]} = #version + :one")
            conditions += [f"attribute_type({compiled.root}, :mapType)", f"attribute_type({meta}, :mapType)"]
            values[":mapType"] = {"S": "M"}
            # each leaf's metadata entry and the section's changed mark, all as if new
            growth += sum(1 + len(leaf.encode()) + _value_size(number(pack(VERSION_SPAN - 1, self.now)))
                          for leaf in compiled.pointers)
            growth += 1 + len(CHANGED_ATTRIBUTES[section]) + _value_size(number(VERSION_SPAN - 1))
        values.update({":growth": number(growth), ":roomFor": number(MAX_STATE_ITEM_BYTES - growth)})
        update = "SET " + ", ".join(sets + [
            "#version = #version + :one", "#updatedAt = :now", "#w = #version + :one", "#lastWrite = :lastWrite",
            "#itemBytes = #itemBytes + :growth"])
        conditions.insert(0, "#itemBytes <= :roomFor")
        names.update({**names_in(" ".join([LIVE, update, *compiled.removes, *conditions])), "#w": write.attribute,
                      **compiled.names})
        if compiled.removes or journal_removes:
            update += " REMOVE " + ", ".join(compiled.removes + journal_removes)
            names.update(journal_names)
        if pruning:
            update += " DELETE #trimmedStamps :prunedStamps"
            values[":prunedStamps"] = {"NS": [str(stamp) for stamp in stamps[:-1]]}
        elif adds_stamp:
            update += " ADD #trimmedStamps :trimmedStamp"
            values[":trimmedStamp"] = trimmed
        if pruning or adds_stamp:
            names["#trimmedStamps"] = table.JOURNAL_TRIMMED_STAMPS
        expression = " AND ".join([LIVE, "attribute_not_exists(#w)",
                                   self.fence.condition(device_id, names, values), *conditions])
        request = {"Update": {
            "TableName": self.table_name, "Key": table.state_key(device_id),
            "UpdateExpression": update, "ConditionExpression": expression,
            "ExpressionAttributeNames": names, "ExpressionAttributeValues": values,
            "ReturnValues": "ALL_NEW", "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }}
        return Planned(request, None, UPDATED, None, write)

    # --------------------------------------------------------------- internals

    def _planned(self, device_id: str, item: dict | None, device: Device, outcome: str,
                 expected_version: int | None, condition: str, sets: list[str], removes: list[str],
                 values: dict, caller_condition: ConditionBase | None = None, *,
                 version: int | None = None) -> Planned:
        """A journaled state write: bumps the version, records its write id, trims the journal."""
        write = WriteId.new(self.now)
        next_version = device.version if version is None else version
        values = {**values, ":next": number(next_version), ":nowEpoch": number(self.now)}
        journal_removes, newest_dropped, journal_names = _trimming(item, JOURNAL_KEEP - 1, self.now)
        sets = [*sets, "#version = :next", "#w = :next", "#lastWrite = :lastWrite"]
        if outcome != DELETED:
            # What this write leaves, with what grows from write to write (versions, the
            # outcome's name) at its largest: a state accepted once fits again later.
            written = {attribute: values[f":{attribute}"] for attribute in SECTION_ATTRIBUTES
                       if f":{attribute}" in values}
            written.update({CHANGED_ATTRIBUTES[section]: _LARGEST_VERSION for section in DEVICE_SECTIONS
                            if f":{section}" in values})
            values[":itemBytes"] = number(_checked_size(
                {**table.state_key(device_id), **_without_bookkeeping(item), **written,
                 table.VERSION: _LARGEST_VERSION, write.attribute: number(next_version),
                 table.CREATED_AT: {"S": device.created_at}, table.UPDATED_AT: {"S": device.updated_at},
                 table.LAST_WRITE: {"S": _LONGEST_OUTCOME}, table.ITEM_BYTES: number(MAX_ITEM_BYTES)}, device))
            sets.append("#itemBytes = :itemBytes")
        values[":lastWrite"] = {"S": outcome}  # the stream processor tells updated from replaced by it
        # The version condition makes this write's view exact, so it folds what compiled patches
        # added into its own watermark.
        folded = max(newest_dropped, max(trimmed_stamps(item), default=0))
        if folded > _number(item, table.JOURNAL_TRIMMED):
            sets.append("#trimmed = :trimmed")
            values[":trimmed"] = number(folded)
        if table.JOURNAL_TRIMMED_STAMPS in (item or {}):
            removes = [*removes, "#trimmedStamps"]
        update = "SET " + ", ".join(sets)
        if removes or journal_removes:
            update += " REMOVE " + ", ".join(removes + journal_removes)
        names = names_in(update + condition, {"#w": write.attribute, **journal_names})
        expression = f"{condition} AND attribute_not_exists(#w)"
        if outcome != CHECKED:
            expression += " AND " + self.fence.condition(device_id, names, values)
        expression = and_condition(expression, names, values, caller_condition)
        request = {"Update": {
            "TableName": self.table_name, "Key": table.state_key(device_id),
            "UpdateExpression": update, "ConditionExpression": expression,
            "ExpressionAttributeNames": names, "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }}
        return Planned(request, device, outcome, expected_version, write)



def _without_bookkeeping(item: dict | None) -> dict:
    """The item without what ``BOOKKEEPING_BYTES`` keeps room for (journal, lease holder)."""
    return {name: value for name, value in (item or {}).items()
            if not name.startswith(table.JOURNAL_PREFIX) and name not in BOOKKEEPING_ATTRIBUTES}


def _checked_size(item: dict, device: Device) -> int:
    """The state item's size after a write, bookkeeping aside; ItemTooLarge unless it
    leaves the bookkeeping room and its change item (what the feed writes for this
    version) fits too."""
    size = item_size(item)
    if size > MAX_STATE_ITEM_BYTES:
        raise ItemTooLarge(f"the device item would be about {size} bytes; the limit is {MAX_STATE_ITEM_BYTES} "
                           f"(DynamoDB's {MAX_ITEM_BYTES} less {BOOKKEEPING_BYTES} kept for leases, the write "
                           "journal and its change record)")
    change_size = change_item_size(device, {name: item[name] for name in SECTION_ATTRIBUTES if name in item})
    if change_size > MAX_ITEM_BYTES:
        raise ItemTooLarge(f"the change record of this version would be about {change_size} bytes; DynamoDB's "
                           f"limit is {MAX_ITEM_BYTES}")
    return size


def _most_added(names: dict, values: dict) -> int:
    """The most a compiled patch can add to the item, bookkeeping aside (its journal entry
    is in ``BOOKKEEPING_BYTES``): every member it names and every value it sets, as if all
    were new."""
    added = sum(1 + len(name.encode()) for name in names.values())
    added += sum(1 + _value_size(value) for value in values.values())
    return added + COMPILED_EXTRA_BYTES


def _value_size(attribute: dict) -> int:
    return item_size({"": attribute})


def _section_sets(documents: dict, entries: dict, values: dict) -> list[str]:
    """SET clauses (and their values) writing desired/reported documents and their metadata."""
    sets = []
    for section, document in documents.items():
        meta = META_ATTRIBUTES[section]
        values[f":{section}"] = to_attribute(document)
        values[f":{meta}"] = to_attribute(entries.get(section, {}))
        sets += [f"#{section} = :{section}", f"#{meta} = :{meta}", f"#{CHANGED_ATTRIBUTES[section]} = :next"]
    return sets


def _trimming(item: dict | None, keep: int, now: float, covered: int | None = None) -> tuple[list[str], int, dict]:
    """Journal entries to drop so that the newest ``keep`` applied ones remain, and those
    younger than ``JOURNAL_KEEP_SECONDS`` up to ``JOURNAL_MAX`` in all (``keep`` and the
    maximum count the write's own entry); never-applied markers go once they are old.
    ``covered``: drop only applied entries stamped at or before it. Returns the names to
    REMOVE, the newest stamp of an applied entry dropped (0: none) and the name map."""
    entries = journal(item)
    applied = sorted(((version, write) for write, version in entries if version > 0),
                     key=lambda entry: entry[0], reverse=True)
    young_after = (now - JOURNAL_KEEP_SECONDS) * 1000
    kept = applied[:keep] + [entry for entry in applied[keep:] if entry[1].stamp_ms > young_after]
    kept = kept[:JOURNAL_MAX - (JOURNAL_KEEP - keep)]
    kept_writes = {write for _, write in kept}
    dropped = [write for _, write in applied
               if write not in kept_writes and (covered is None or write.stamp_ms <= covered)]
    old_markers = [write for write, version in entries
                   if version == 0 and write.stamp_ms < (now - SETTLED_KEEP_SECONDS) * 1000]
    newest_dropped = max((write.stamp_ms for write in dropped), default=0)
    names = {f"#j{index}": write.attribute for index, write in enumerate(dropped + old_markers)}
    return list(names), newest_dropped, names


def settle_request(device_id: str, write: WriteId, on_versioned_item: bool, now: float) -> dict:
    """An UpdateItem that marks ``write`` as never applied unless it already did: once
    it lands, no copy of the write can land any more (each requires its entry absent).
    On an item without a version (a device that never existed) it leaves a stub that
    reads as absent and expires."""
    values = {":never": number(0)}
    if on_versioned_item:
        update, condition = "SET #w = :never", "attribute_not_exists(#w) AND attribute_exists(#version)"
    else:
        update = "SET #w = :never, #expiresAt = :stubExpires"
        condition = "attribute_not_exists(#w) AND attribute_not_exists(#version)"
        values[":stubExpires"] = number(int(now) + STUB_SECONDS)
    return {"Key": table.state_key(device_id), "UpdateExpression": update, "ConditionExpression": condition,
            "ExpressionAttributeNames": names_in(update + condition, {"#w": write.attribute}),
            "ExpressionAttributeValues": values,
            "ReturnValues": "ALL_NEW", "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}

def refusal(planned: Planned, device_id: str, old: dict | None, fence: Fence, now: float) -> Exception:
    """Why a planned write's condition failed, from the item as it was (ALL_OLD): a typed
    error, or ``Moved`` when planning again from ``Moved.item`` may succeed."""
    live = old if table.is_live_state(old, now) else None
    fenced = fence.error(device_id, live, now) if planned.outcome != CHECKED else None
    if planned.outcome == CREATED:
        if live is not None:
            return DeviceAlreadyExists(device_id, Device.from_item(live))
        return fenced or Moved(old)
    if live is None:
        return DeviceNotFound(device_id)
    if fenced is not None:
        return fenced
    current = Device.from_item(live)
    if current.version != planned.expected_version:
        return Moved(live)
    return ConditionFailed(device_id, current)


def expect(device_id: str, item: dict | None, expected_version: int | None, now: float) -> dict:
    """The live item, checked against the version the caller expects (if any)."""
    if not table.is_live_state(item, now):
        raise DeviceNotFound(device_id)
    if expected_version is not None:
        current = Device.from_item(item)
        if current.version != expected_version:
            raise VersionConflict(device_id, expected_version, current)
    return item

