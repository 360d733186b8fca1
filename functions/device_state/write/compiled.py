"""Read-free writes of a device's state item: a patch compiled to one UpdateItem
(``compile_patch``, a ``CompiledUpdate``), with no read and no version condition; its write id
alone keeps any copy of it from applying twice (``CompiledPatches.compiled``). A patch that
does not compile, or that DynamoDB refuses, is applied by read-modify-write instead."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

import jsonpointer

from ..errors import InvalidValue
from ..fleet.index import compiled_attributes, shard_of
from ..item import job_marks, schema
from ..item.journal import JOURNAL_KEEP, TRIMMED_STAMPS_KEEP, WriteId, trimmed_stamp, trimmed_stamps, trimming
from ..item.room import LONGEST_NUMBER_BYTES, MAX_STATE_ITEM_BYTES, most_added, value_size
from ..model import desires
from ..model.patches import INCREMENT, REMOVED, SET, JsonPatch, MergePatch, exact
from ..model.sections import (
    MAX_POINTER_BYTES,
    REPORTED,
    STATE,
    VERSION_SPAN,
    check_pointer,
    longest_leaf_pointer,
    pack,
    pointer,
    pointer_bytes,
)
from ..model.times import time_attribute
from ..model.updates import Compilable
from ..model.values import canonical, check_state, check_text, to_attribute
from .expressions import Expression, live, number
from .plan import UPDATED, PlanContext, Planned, index_sets


def compile_patch(update_fn, section: str = STATE) -> "CompiledUpdate | None":
    """``update_fn`` as one UpdateItem of ``section`` that needs no read, or None when it
    cannot be one (the write then reads and applies it). The library's patches compile where
    every operation is an increment, add, replace or remove of an object member (a desired or
    reported merge patch member by member into objects that exist, too); any other update
    function may compile itself (``model.updates.Compilable``)."""
    nested = section != STATE
    if isinstance(update_fn, MergePatch):
        if not update_fn.patch:
            return None
        return _compiled(lambda compiled: _compile_merge_patch(update_fn.patch, compiled, nested), section)
    if isinstance(update_fn, JsonPatch):
        if not update_fn.operations:
            return None
        return _compiled(lambda compiled: _compile_json_patch(update_fn.operations, compiled), section)
    if isinstance(update_fn, Compilable):
        return update_fn.compile(section=section, nested=nested)
    return None


@dataclass
class CompiledUpdate:
    """A patch as one DynamoDB update of a section's members, with the conditions that make
    it mean what the patch means. Its placeholders come from ``expression``, which the
    planner goes on building the request with; its values are stored exactly as a state
    write stores them (``check_state``). When DynamoDB refuses it (a guard false, a parent
    missing, a member of the wrong type), the caller falls back to read-modify-write, which
    then applies the patch or raises the patch's own error."""

    section: str = STATE  # the attribute of the section it changes
    expression: Expression = field(default_factory=Expression)
    sets: list[str] = field(default_factory=list)
    removes: list[str] = field(default_factory=list)
    conditions: list[str] = field(default_factory=list)
    members: list[str] = field(default_factory=list)  # each member name as often as it is named
    values: dict = field(default_factory=dict)  # placeholder: the value as the patch gives it
    attribute_values: list[dict] = field(default_factory=list)  # each value as stored, as often as used
    # What it does to each member, for the fleet index: (parts, SET and the value, INCREMENT
    # and the SET operand, or REMOVED and None).
    effects: list[tuple] = field(default_factory=list)
    _paths: list[tuple] = field(default_factory=list)

    @property
    def root(self) -> str:
        """The placeholder of the section it changes."""
        return self.expression.name(self.section)

    @property
    def pointers(self) -> list[str]:
        """The JSON Pointers (inside the section) of the members it sets or removes."""
        return [pointer(parts) for parts in self._paths]

    @property
    def removed(self) -> list[str]:
        """The JSON Pointers of the members it removes."""
        return [pointer(parts) for parts, effect, _ in self.effects if effect == REMOVED]

    def path(self, parts: tuple) -> str | None:
        """The placeholder path of state member ``parts``, or None when it overlaps one
        already used (DynamoDB refuses overlapping paths in one update) or is not valid
        Unicode (read-modify-write then refuses it with the state's own check)."""
        if any(not isinstance(part, str) or not _is_text(part) for part in parts):
            return None
        for used in self._paths:
            if used[: len(parts)] == parts or parts[: len(used)] == used:
                return None
        self._paths.append(parts)
        return self.placeholder_path(parts)

    def placeholder_path(self, parts: tuple) -> str:
        """The placeholder path of ``parts``, not recorded as a changed member."""
        self.members.extend(parts)
        return self.expression.path(self.section, *parts)

    def value(self, value) -> str:
        """The placeholder of ``value``; InvalidValue (or TypeError) when no state could
        hold it exactly."""
        check_state({"values": [value]})
        attribute = to_attribute(value)
        self.attribute_values.append(attribute)
        placeholder = self.expression.value(attribute)
        self.values[placeholder] = value
        return placeholder


def _compiled(compile_into, section: str) -> CompiledUpdate | None:
    """``compile_into`` a new CompiledUpdate of ``section``; None when it does not compile
    or holds a value no state could store (read-modify-write then decides)."""
    try:
        return compile_into(CompiledUpdate(section))
    except (InvalidValue, TypeError, ArithmeticError):
        return None


def _is_text(part: str) -> bool:
    try:
        check_text(part)
    except InvalidValue:
        return False
    return True


# |current| <= 9E+125 and |delta| <= 9E+124 keep |current + delta| under 9.99E+125.
_COMPILED_VALUE_LIMIT = Decimal("9E+125")
_COMPILED_DELTA_LIMIT = Decimal("9E+124")


def _member_parts(pointer: str) -> tuple | None:
    """The object-member names of a JSON Pointer, or None where it may touch an array."""
    if not pointer:
        return None
    parts = tuple(jsonpointer.JsonPointer(pointer).parts)
    if any(part == "-" or part.isdigit() or not part for part in parts):
        return None
    return parts


def _compile_json_patch(operations: list, compiled: CompiledUpdate) -> CompiledUpdate | None:
    for operation in operations:
        op, parts = operation["op"], _member_parts(operation["path"])
        if parts is None or op not in ("increment", "add", "replace", "remove"):
            return None
        path = compiled.path(parts)
        if path is None:
            return None
        if op == "remove":
            compiled.removes.append(path)
            compiled.effects.append((parts, REMOVED, None))
            compiled.conditions.append(f"attribute_exists({path})")
            continue
        if op in ("add", "replace"):
            compiled.sets.append(f"{path} = {compiled.value(operation['value'])}")
            compiled.effects.append((parts, SET, operation["value"]))
            if op == "replace":
                compiled.conditions.append(f"attribute_exists({path})")
            continue
        delta = canonical(Decimal(operation["value"]))
        if abs(delta) > _COMPILED_DELTA_LIMIT:
            return None
        low, high = operation.get("min"), operation.get("max")
        # DynamoDB refuses (ValidationException, measured on DynamoDB Local) a sum that needs
        # more than 38 digits rather than round it; the caller then falls back to
        # read-modify-write, which refuses it with the precision limit: both paths agree.
        incremented = f"if_not_exists({path}, {compiled.value(Decimal(0))}) + {compiled.value(delta)}"
        compiled.sets.append(f"{path} = {incremented}")
        compiled.effects.append((parts, INCREMENT, incremented))
        # Keep the result inside DynamoDB's range on every engine (moto does not check).
        compiled.conditions.append(
            f"(attribute_not_exists({path}) OR (attribute_type({path}, {compiled.value('N')}) AND "
            f"{path} BETWEEN {compiled.value(-_COMPILED_VALUE_LIMIT)} AND {compiled.value(_COMPILED_VALUE_LIMIT)}))")
        if low is None and high is None:
            continue
        # Only where no clamping is needed: otherwise DynamoDB refuses and the caller clamps.
        # The bounds moved by delta, exactly; one that DynamoDB cannot hold is left to
        # read-modify-write (a rounded guard would let the result pass the bound).
        guards = []
        try:
            if low is not None:
                guards.append(f"{path} >= {compiled.value(exact(Decimal.__sub__, low, delta))}")
            if high is not None:
                guards.append(f"{path} <= {compiled.value(exact(Decimal.__sub__, high, delta))}")
        except InvalidValue:
            return None
        guard = " AND ".join(guards)
        missing_fits = (low is None or delta >= low) and (high is None or delta <= high)
        compiled.conditions.append(f"(attribute_not_exists({path}) OR ({guard}))" if missing_fits else f"({guard})")
    return compiled


def _compile_merge_patch(patch: dict, compiled: CompiledUpdate, nested: bool,
                         parent: tuple = ()) -> CompiledUpdate | None:
    if parent:
        if not _is_text_path(parent):
            return None
        compiled.conditions.append(
            f"attribute_type({compiled.placeholder_path(parent)}, {compiled.value('M')})")
    for key, value in patch.items():
        if not key:
            return None
        if isinstance(value, dict):
            # Merging into an object DynamoDB cannot express without knowing it, except
            # member by member into an object that exists (the condition says so).
            if not nested or not value or _compile_merge_patch(value, compiled, nested, parent + (key,)) is None:
                return None
            continue
        path = compiled.path(parent + (key,))
        if path is None:
            return None
        if value is None:
            compiled.removes.append(path)
            compiled.effects.append((parent + (key,), REMOVED, None))
        else:
            compiled.sets.append(f"{path} = {compiled.value(value)}")
            compiled.effects.append((parent + (key,), SET, value))
    return compiled


def _is_text_path(parts: tuple) -> bool:
    return all(isinstance(part, str) and _is_text(part) for part in parts)


class CompiledPatches(PlanContext):
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
        growth = most_added(compiled)
        version, one = name(schema.VERSION), expr.number(1)
        sets = list(compiled.sets)
        conditions = list(compiled.conditions)
        indexed, operands, unindexed = compiled_attributes(self.fleet_index.in_sections((section,)), compiled.effects)
        if indexed or operands:
            indexed[schema.SHARD_ATTRIBUTE] = {"N": str(shard_of(device_id))}
        sets += index_sets(expr, indexed, {})
        sets += [f"{name(attribute)} = {operand}" for attribute, operand in operands.items()]
        # each index attribute as if new (an increment's number at DynamoDB's longest)
        growth += sum(1 + len(attribute.encode()) + value_size(value) for attribute, value in indexed.items())
        growth += sum(1 + len(attribute.encode()) + LONGEST_NUMBER_BYTES for attribute in operands)
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
            else:
                conditions += _no_confirmation_superseded(expr, compiled)
            # each metadata entry it sets and the section's changed mark, all as if new
            growth += sum(1 + len(leaf.encode()) + value_size(number(pack(VERSION_SPAN - 1, self.now)))
                          for leaf in renewed)
            growth += 1 + len(schema.CHANGED_ATTRIBUTES[section]) + value_size(number(VERSION_SPAN - 1))
        if self.job is not None:  # the job's mark, once: ``item/job_marks``
            marks, map_type = name(schema.JOB_MARKS), expr.value({"S": "M"})
            ours = f"{marks}.{name(self.job.job_id)}"
            sets.append(f"{ours} = {version} + {expr.number(job_marks.pack(self.job.deadline_ms(self.now), 1))}")
            conditions += [f"attribute_type({marks}, {map_type})", f"attribute_not_exists({ours})",
                           f"size({marks}) < {expr.number(job_marks.MAX_JOB_MARKS)}"]
            growth += job_marks.mark_bytes(self.job.job_id)
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
                                   self.fence.condition(device_id, expr, self.now),
                                   *self._holder_condition(expr, device_id), *conditions])
        return self._update(device_id, update, expression, expr, write, UPDATED, ReturnValues="ALL_NEW")


def _no_confirmation_superseded(expr: Expression, compiled) -> list[str]:
    """The conditions under which a compiled desired patch supersedes no kept confirmation of a
    cleared desire (``desires.cleared``), which it would leave behind to be shown again once the
    member is removed: none at a member it sets, and none below an object at all (the item
    has no ``clearedNested``). One above it is gone by then: a member is set below an object that
    exists, and what set that object dropped it. Refused, read-modify-write drops what is
    superseded. Two operators a member: DynamoDB takes 300 in a condition."""
    set_at = [pointer(parts) for parts, effect, _ in compiled.effects if effect != REMOVED]
    if not set_at:
        return []
    return [f"attribute_not_exists({expr.name(schema.CLEARED_NESTED)})"] + [
        f"attribute_not_exists({expr.name(schema.STATUS_DESIRED)}.{expr.name(leaf)}.{expr.name(desires.CONFIRMED)})"
        for leaf in set_at]


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
