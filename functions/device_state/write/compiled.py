"""Read-free writes of a device's state item: a patch compiled to one UpdateItem
(``model.patches.CompiledUpdate``), with no read and no version condition; its write id alone
keeps any copy of it from applying twice."""

from __future__ import annotations

from collections import Counter

from ..errors import InvalidValue
from ..fleet.index import compiled_attributes, shard_of
from ..item import schema
from ..item.journal import JOURNAL_KEEP, TRIMMED_STAMPS_KEEP, WriteId, trimmed_stamp, trimmed_stamps, trimming
from ..item.room import LONGEST_NUMBER_BYTES, MAX_STATE_ITEM_BYTES, most_added, value_size
from ..model.patches import INCREMENT, REMOVED
from ..model.sections import (MAX_POINTER_BYTES, REPORTED, STATE, VERSION_SPAN, check_pointer, longest_leaf_pointer,
                              pack, pointer_bytes)
from ..model.times import time_attribute
from .expressions import Expression, live, number
from .plan import UPDATED, PlanContext, Planned, index_sets


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
            # each metadata entry it sets and the section's changed mark, all as if new
            growth += sum(1 + len(leaf.encode()) + value_size(number(pack(VERSION_SPAN - 1, self.now)))
                          for leaf in renewed)
            growth += 1 + len(schema.CHANGED_ATTRIBUTES[section]) + value_size(number(VERSION_SPAN - 1))
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
