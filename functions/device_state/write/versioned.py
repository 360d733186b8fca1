"""Versioned writes of a device's state item: each planned from the item read, at its
version, with a journal entry (``item/journal``), the lease fence, the caller's condition and
the size check (``item/room``): create, write sections (replace, patch, report, desire),
acknowledge desires, delete, and a transaction's check."""

from __future__ import annotations

import copy
from typing import Callable

from boto3.dynamodb.conditions import ConditionBase

from ..errors import DeviceAlreadyExists, InvalidDeviceId, ItemTooLarge, JobAlreadyWritten, TooManyJobs
from ..fleet.index import connectivity_attributes
from ..item import contention, job_marks, schema
from ..item.credentials import ProvisionedIdentity
from ..item.journal import JOURNAL_KEEP, WriteId, trimmed_stamps, trimming, watermark
from ..item.room import LARGEST_VERSION, MAX_STATE_ITEM_BYTES, checked_size, without_bookkeeping
from ..model import desires
from ..model.device import Device
from ..model.sections import (
    ALL,
    DESIRED,
    DEVICE_SECTIONS,
    REPORTED,
    STATE,
    STATUS,
    SectionWrite,
    leaf_entries,
    next_entries,
    pack,
    touched_by,
)
from ..model.times import time_attribute, timestamp
from ..model.updates import UpdateFn
from ..model.values import MAX_ITEM_BYTES, check_new_id, check_state, from_attribute, to_attribute
from .expressions import Expression, not_live, number
from .plan import CHECKED, CREATED, DELETED, REPLACED, UPDATED, PlanContext, Planned, index_sets

_REMOVED = None  # an attribute a write removes, among those it writes (sized as absent)
_LONGEST_OUTCOME = max((CREATED, REPLACED, UPDATED), key=len)  # lastWrite, as sized for the item's budget


class VersionedWrites(PlanContext):
    def create(self, device_id: str, state: dict, item: dict | None, sections: dict | None = None,
               identity: ProvisionedIdentity | None = None) -> Planned:
        """Create over nothing, a settle stub, or a tombstone (its version continues).
        ``sections``: the device's desired and reported (each ``{}`` when absent); ``identity``:
        a device an enrollment provisions holds its first credential from the start."""
        if schema.is_live_state(item, self.now):
            raise DeviceAlreadyExists(device_id, Device.from_item(item))
        check_new_id("deviceId", device_id, InvalidDeviceId)
        check_state(state)
        previous = schema.StateItem.of(item).version if item and schema.VERSION in item else 0
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
        if identity is not None:
            sets += [f"{name(schema.CREDENTIALS)} = {expr.value(identity.credentials())}",
                     f"{name(schema.ENROLLMENT)} = {expr.value(identity.enrollment())}"]
        removes = [name(attribute) for attribute in schema.GONE_ON_CREATE]
        indexed, unindexed = self.fleet_index.attributes(device_id, {STATE: state, **documents})
        # a new device is not connected, and a query for the disconnected finds it
        indexed.update(connectivity_attributes(self.fleet_index, device_id, False))
        sets += index_sets(expr, indexed, written)
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
        sets += index_sets(expr, indexed, written)
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
        written[schema.CHANGED_ATTRIBUTES[DESIRED]] = LARGEST_VERSION
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
        expression = " AND ".join([self._at_version(expr, current.version),
                                   *self._holder_condition(expr, current.device_id)])
        if condition is not None:
            expression += " AND " + expr.condition(condition)
        request = {"ConditionCheck": {
            "TableName": self.table_name, "Key": schema.state_key(current.device_id),
            "ConditionExpression": expression, **expr.attributes(),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }}
        return Planned(current.device_id, request, current, CHECKED, current.version)

    def _job_marks(self, expr: Expression, device_id: str, item: dict | None, version: int,
                   sets: list[str]) -> dict | None:
        """The job marks this write leaves (``item/job_marks``): those still kept, and the mark of
        the job whose write it is (``self.job``), at ``version``; None when they are as stored (an
        item without the map gets an empty one).
        ``JobAlreadyWritten`` when the item holds that job's mark, ``TooManyJobs`` when it keeps
        ``MAX_JOB_MARKS`` others."""
        stored, kept = job_marks.marks(item), job_marks.kept(item, self.now)
        if self.job is not None:
            if self.job.job_id in stored:
                raise JobAlreadyWritten(device_id, self.job.job_id, job_marks.unpack(stored[self.job.job_id])[0])
            if len(kept) >= job_marks.MAX_JOB_MARKS:
                raise TooManyJobs(device_id, job_marks.MAX_JOB_MARKS)
            kept[self.job.job_id] = self.job.packed(self.now, version)
        if kept == stored and schema.JOB_MARKS in (item or {}):
            return None
        # Kept even when empty, so that a job's write to the device can be compiled (read-free).
        sets.append(f"{expr.name(schema.JOB_MARKS)} = "
                    f"{expr.value({'M': {job_id: number(packed) for job_id, packed in kept.items()}})}")
        return kept

    @staticmethod
    def _making_room(plan: Callable[[bool], Planned]) -> Planned:
        """``plan(True)``; when that write does not fit beside the confirmations of cleared
        desires the item keeps, ``plan(False)``: they are history, and a write that needs
        their room takes it (a write that fits on a fresh device fits here too)."""
        try:
            return plan(True)
        except ItemTooLarge:
            return plan(False)

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
            marks = self._job_marks(expr, device_id, item, next_version, sets)
            if marks is not None:  # sized with each mark at its largest
                written = {**written, schema.JOB_MARKS: {"M": {job_id: {"N": "9" * 38} for job_id in marks}}}
            # What this write leaves, with what grows from write to write (versions, the
            # outcome's name) at its largest: a state accepted once fits again later.
            written = {**written, **{schema.CHANGED_ATTRIBUTES[section]: LARGEST_VERSION for section in DEVICE_SECTIONS
                                     if section in written}}
            left = {**schema.state_key(device_id), **without_bookkeeping(item, self._connectivity_attribute()),
                    **written,
                    schema.VERSION: LARGEST_VERSION, write.attribute: number(next_version),
                    schema.CREATED_AT: {"S": device.created_at}, schema.UPDATED_AT: {"S": device.updated_at},
                    schema.LAST_WRITE: {"S": _LONGEST_OUTCOME}, schema.ITEM_BYTES: number(MAX_ITEM_BYTES)}
            size = checked_size({name: value for name, value in left.items() if value is not _REMOVED}, device)
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
        if outcome != CREATED:
            expression = " AND ".join([expression, *self._holder_condition(expr, device_id)])
        if caller_condition is not None:
            expression += " AND " + expr.condition(caller_condition)
        return self._update(device_id, update, expression, expr, write, outcome, device, expected_version)


def _apply(update_fn: UpdateFn, document: dict) -> dict:
    new_state = update_fn(copy.deepcopy(document))
    if new_state is None:
        raise TypeError("update_fn must return the new state")
    return new_state


def _status_sets(expr: Expression, desired: dict, entries: dict, sets: list, removes: list, written: dict) -> None:
    """SET or REMOVE clauses of desired's statuses, of the mark of nested kept confirmations
    and of the clear-pending mark."""
    statuses = entries.get(STATUS) or {}
    if statuses:
        written[schema.STATUS_DESIRED] = to_attribute(statuses)
        sets.append(f"{expr.name(schema.STATUS_DESIRED)} = {expr.value(written[schema.STATUS_DESIRED])}")
    else:
        written[schema.STATUS_DESIRED] = _REMOVED
        removes.append(expr.name(schema.STATUS_DESIRED))
    if desires.nested_confirmations(statuses):
        written[schema.CLEARED_NESTED] = {"BOOL": True}
        sets.append(f"{expr.name(schema.CLEARED_NESTED)} = {expr.value({'BOOL': True})}")
    else:
        written[schema.CLEARED_NESTED] = _REMOVED
        removes.append(expr.name(schema.CLEARED_NESTED))
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
    if (statuses != stored or (schema.CLEAR_PENDING in item) != desires.clear_pending(documents[DESIRED], entries)
            or (schema.CLEARED_NESTED in item) != desires.nested_confirmations(statuses)):  # kept from before the mark
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
