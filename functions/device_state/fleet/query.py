"""Find and count devices by their state on the fleet index (``fleet_index``).

A filter is planned into *scans*: ranges of one declared field's index (``eq`` a value,
a bound, a prefix, or the whole index). ``and`` takes its cheapest coverable branch (an
equality before a prefix before a range before a whole index) and applies the rest as a
filter; ``or`` and ``in`` take one scan per branch; a filter with a branch that no declared
field covers is refused (``UnindexedFilter``) rather than read the whole fleet.

A page reads each scan's ``SHARDS`` partitions side by side, merges them in the index's
order, then reads the devices it found from the table, strongly consistent, and keeps
those the whole filter matches now: a device in the answer matches as it is, with its
current document. (DynamoDB updates global secondary indexes asynchronously: on AWS a
device written a moment ago, typically under a second, can be missed by a query; never
shown when it no longer matches.) A device that a later scan finds again is skipped
where an earlier scan covers it, so each matching device comes once. A page reads the
index at most ``MAX_ROUNDS_PER_PAGE`` times (each shard's Query at most the devices the
page still needs) and the items of what those rounds found.

Counts read only the indexes when every predicate is on a declared field (the index
holds each device's value: exact as of the index); otherwise they read the candidates'
items too. A count reads at most ``MAX_COUNT_INDEX_ENTRIES`` index entries and the items of
at most ``MAX_COUNT_ITEMS`` devices; one that would read more is refused (``FilterTooBroad``).
"""

from __future__ import annotations

import heapq
import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from ..errors import (
    FilterTooBroad,
    IndexBuilding,
    InvalidCursor,
    InvalidFilter,
    InvalidValue,
    RequestRefused,
    UnindexedFilter,
)
from ..item import schema
from ..model.connectivity import CONNECTIVITY, connectivity_of
from ..model.device import Device
from ..model.values import DEVICE_ID_PATTERN, MAX_PAGE_BYTES, check_number, item_size
from ..write.expressions import Expression
from . import rql
from .cursors import CURSOR_REFUSED, CursorSeal
from .limits import MAX_COUNT_INDEX_ENTRIES, MAX_COUNT_ITEMS, MAX_LIMIT
from .index import MAX_STRING_BYTES, MISSING, SHARDS, Field, FleetIndex
from .reindex import building, has_devices, mark_ready, progress

# Index entries one Query call reads when a count reads a whole range: each call stays short
# (DynamoDB Local takes about 0.4 ms an entry), so none nears the client's 3 s read timeout
# while the 16 shards are read side by side; on DynamoDB the smaller calls cost the same units.
INDEX_PAGE = 500
MAX_SCANS = 100  # index ranges one filter may read (a count reads each whole, 16 shards each)
MAX_ROUNDS_PER_PAGE = 8  # index reads per page: a page may hold fewer devices while a cursor remains
# What one count may read: index entries (``INDEX_PAGE`` a Query call; the ids of a conjunction
# are held in memory to intersect), and the items of the devices it must judge itself (a filter
# on an undeclared path, a delta, connectivity: 100 a BatchGetItem). Past either it is refused
# (``FilterTooBroad``) rather than read on.
_RANKS = {"eq": 1, "prefix": 10, "gt": 30, "ge": 30, "lt": 30, "le": 30, "all": 100}
_KEY_OPERATORS = {"eq": "=", "gt": ">", "ge": ">=", "lt": "<", "le": "<="}
_ORDERED_TYPES = {"string": ("S",), "number": ("N",), "boolean": ("N",)}


@dataclass(frozen=True)
class Scan:
    """One range of one field's index: ``op`` ``eq``/``gt``/``ge``/``lt``/``le`` a value,
    ``prefix`` (strings), or ``all``."""

    field: Field
    op: str
    value: object = None

    def key_condition(self, expr: Expression, shard: int) -> str:
        condition = f"{expr.name(schema.SHARD_ATTRIBUTE)} = {expr.number(shard)}"
        if self.op == "all":
            return condition
        sort_key = expr.name(self.field.attribute)
        if self.op == "prefix":
            return f"{condition} AND begins_with({sort_key}, {expr.value(self.field.encode(self.value))})"
        return f"{condition} AND {sort_key} {_KEY_OPERATORS[self.op]} {expr.value(self.field.encode(self.value))}"

    def covers(self, documents: dict) -> bool:
        """Whether a device with these documents lies in this scan's range."""
        value = self.field.value_in(documents)
        if value is MISSING:
            return False
        node = rql.Exists(_path(self.field)) if self.op == "all" else (
            rql.Like(_path(self.field), self.value) if self.op == "prefix"
            else rql.Compare(self.op, _path(self.field), self.value))
        return rql.matches(node, documents)


def _path(field: Field) -> rql.Path:
    return rql.Path(field.section, field.parts, field.path)


@dataclass(frozen=True)
class Sort:
    field: Field
    descending: bool


class FleetQuery:
    """Fleet queries and counts on one table (its ``Store``) under one declaration."""

    def __init__(self, store, fleet_index: FleetIndex, clock, cursors: CursorSeal, *,
                 max_count_index_entries: int = MAX_COUNT_INDEX_ENTRIES, max_count_items: int = MAX_COUNT_ITEMS):
        self.store = store
        self.fleet_index = fleet_index
        self.clock = clock
        self.cursors = cursors
        self.max_count_index_entries = max_count_index_entries
        self.max_count_items = max_count_items
        self._ready: set[str] = set()
        self._holds_devices = False  # the table was found to hold devices while a field was not ready

    # ------------------------------------------------------------- parsing

    def parse(self, text: str):
        """The filter tree, checked against the declaration."""
        node = rql.parse(text)
        for path in rql.paths_of(node):
            field = self.fleet_index.field(path.section, path.parts)
            if field is None:
                continue
            for value in _literals(node, path):
                if field.holds(value):
                    continue
                if isinstance(value, str) and field.type == "string":
                    raise InvalidFilter(f"{field.path} indexes strings of up to {MAX_STRING_BYTES} bytes of UTF-8; "
                                        f"{_shown(value)} is longer, so no device is found by it")
                raise InvalidFilter(f"{field.path} is declared {field.type}; {_shown(value)} is not a {field.type}")
        self.scans(node)
        return node

    def sort(self, text: str | None) -> Sort | None:
        if text is None:
            return None
        direction, path = text[:1].replace(" ", "+"), text[1:]  # an unencoded + in a query is a space
        if direction not in "+-" or not direction:
            raise InvalidFilter("sort is +path or -path, e.g. sort=-reported/battery")
        field = self._declared(path, "sort")
        return Sort(field, direction == "-")

    def group_field(self, path: str) -> Field:
        return self._declared(path, "groupBy")

    def _declared(self, path: str, what: str) -> Field:
        field = next((field for field in self.fleet_index.fields if field.path == path), None)
        if field is None:
            raise InvalidFilter(f"{what} takes a declared field; {path!r} is not one ({self._declared_list()})")
        return field

    def _declared_list(self) -> str:
        if not self.fleet_index:
            return "none is declared: set FLEET_INDEX, e.g. FLEET_INDEX=reported/firmware:string"
        return "declared: " + ", ".join(field.path for field in self.fleet_index.fields)

    # ------------------------------------------------------------ planning

    def scans(self, node) -> list[Scan]:
        scans = self._cover(node)
        if scans is not None and len(scans) > MAX_SCANS:
            raise InvalidFilter(f"the filter reads {len(scans)} ranges of the indexes (an or branch or an in value "
                                f"each); at most {MAX_SCANS}")
        if scans is None:
            uncovered = sorted({path.text for path in rql.paths_of(node)
                                if self.fleet_index.field(path.section, path.parts) is None})
            raise UnindexedFilter(
                "every branch of the filter needs a predicate on a declared field (answering it otherwise "
                f"would read the whole fleet); not declared: {', '.join(uncovered) or 'none'}; "
                f"{self._declared_list()}. Declare a field in FLEET_INDEX (CDK context fleetIndex) as path:type, "
                "or combine the branch with and(…) and a declared field", uncovered)
        return scans

    def _cover(self, node) -> list[Scan] | None:
        if isinstance(node, rql.And):
            covers = [cover for cover in map(self._cover, node.children) if cover is not None]
            return min(covers, key=lambda scans: sum(_RANKS[scan.op] for scan in scans), default=None)
        if isinstance(node, rql.Or):
            covers = [self._cover(child) for child in node.children]
            return None if any(cover is None for cover in covers) else [scan for cover in covers for scan in cover]
        if isinstance(node, rql.Not) or node.path.section == rql.DELTA:
            return None
        field = self.fleet_index.field(node.path.section, node.path.parts)
        if field is None:
            return None
        if isinstance(node, rql.Exists) or (isinstance(node, rql.Compare) and node.op == "ne"):
            return [Scan(field, "all")]
        if isinstance(node, rql.In):
            distinct = []
            for value in node.values:
                if not any(rql.matches(rql.Compare("eq", node.path, seen), {node.path.section: _nest(node.path, value)})
                           for seen in distinct):
                    distinct.append(value)
            return [Scan(field, "eq", value) for value in distinct]
        if isinstance(node, rql.Like):
            return [Scan(field, "prefix", node.prefix)]
        return [Scan(field, node.op, node.value)]

    # -------------------------------------------------------------- pages

    def page(self, text: str, limit: int = 50, cursor: str | None = None,
             sort_text: str | None = None) -> tuple[list[Device], str | None]:
        """One page of the devices ``text`` matches, and the opaque cursor of the next page
        (None at the end). A page reads the index at most ``MAX_ROUNDS_PER_PAGE`` times, and
        holds at most ``MAX_PAGE_BYTES`` of devices, so it may hold fewer than ``limit`` devices
        while a cursor remains."""
        found, next_cursor = self.page_items(text, limit, cursor, sort_text, max_bytes=MAX_PAGE_BYTES)
        return [Device.from_item(item, with_connectivity=True) for item in found], next_cursor

    def page_items(self, text: str, limit: int = 50, cursor: str | None = None,
                   sort_text: str | None = None, max_limit: int = MAX_LIMIT,
                   max_bytes: int | None = None) -> tuple[list[dict], str | None]:
        """``page`` as the devices' state items, as stored (what a job's targeting reads, in
        pages of up to ``max_limit``: larger than a caller's, so that each of its reads of the
        16 shards serves more devices); with ``max_bytes``, the page stops before the device
        that would take its items past that many bytes (its first is always taken)."""
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= max_limit:
            raise ValueError(f"limit must be an integer from 1 to {max_limit}")
        node, sort = self.parse(text), self.sort(sort_text)
        scans = self.scans(node)
        if sort is not None and not (len(scans) == 1 and scans[0].field == sort.field):
            # the sort field's whole index in order, then what matches without the field
            scans = [Scan(sort.field, "all"), *scans]
        # A cursor belongs to its filter and sort, under the declaration that planned its scans.
        spelled = None if sort is None else ("-" if sort.descending else "+") + sort_text[1:]  # " x" is "+x"
        scope = ["query", text, spelled, self.fleet_index.declaration]
        at, positions = _positions(self.cursors.open(scope, cursor), scans) if cursor else (0, [None] * SHARDS)
        self._check_ready({scan.field for scan in scans})  # the whole request checked before any read
        descending = sort is not None and sort.descending
        found: list[dict] = []
        size, full = 0, False
        for _ in range(MAX_ROUNDS_PER_PAGE):
            if at >= len(scans) or len(found) >= limit or full:
                break
            scan = scans[at]
            entries, pages = self._round(scan, positions, limit - len(found), descending)
            items = {}
            for start in range(0, len(entries), MAX_LIMIT):  # a batch read takes up to 100
                chunk = entries[start:start + MAX_LIMIT]
                items.update(self.store.batch_get_states([device_id for device_id, _, _ in chunk]))
            now, taken = self.clock(), len(entries)
            for index, (device_id, _, _) in enumerate(entries):
                item = items.get(device_id)
                if not schema.is_live_state(item, now):
                    continue
                device = Device.from_item(item, with_connectivity=True)
                documents = _documents(device)
                if self._matches(node, documents) and not any(earlier.covers(documents) for earlier in scans[:at]):
                    if max_bytes is not None:
                        size += item_size(item)
                        if found and size > max_bytes:  # the next page starts at this device
                            taken, full = index, True
                            break
                    found.append(item)
            _advance(positions, pages, entries[:taken])
            if all(position == _DONE for position in positions):
                at, positions = at + 1, [None] * SHARDS
        next_cursor = None if at >= len(scans) else self.cursors.seal(scope, _cursor_body(at, positions))
        return found, next_cursor

    def _round(self, scan: Scan, positions: list, need: int, descending: bool) -> tuple[list[tuple], list[tuple]]:
        """Up to ``need`` index entries of ``scan`` after ``positions`` (per shard), merged
        in index order, as ``(device id, value, shard)``, and what each shard's read found
        (for ``_advance``, once the caller knows how many it takes). Each shard is read for a
        share of ``need`` (twice its even share), not all of it: what the shards read holds
        every entry up to the nearest of their last ones, so the merge stops there (a round may
        then return fewer), where reading ``need`` from each of 16 shards read 16 times what a
        round returns."""
        live = [shard for shard in range(SHARDS) if positions[shard] != _DONE]
        share = min(need, 2 * -(-need // max(len(live), 1)))

        def read(shard):
            expr = Expression()
            request = {"IndexName": scan.field.index_name, "KeyConditionExpression": scan.key_condition(expr, shard),
                       "Limit": share, "ScanIndexForward": not descending, **expr.attributes()}
            if positions[shard] is not None:
                request["ExclusiveStartKey"] = _start_key(scan.field, shard, positions[shard])
            try:
                page = self.store.send("query", **request)
            except RequestRefused:  # a start key DynamoDB will not take
                raise InvalidCursor(CURSOR_REFUSED) from None
            entries = [(schema.StateItem.of(item).device_id, scan.field.decode(item[scan.field.attribute]), shard)
                       for item in page.get("Items", [])]
            return shard, entries, "LastEvaluatedKey" not in page

        with ThreadPoolExecutor(max_workers=len(live) or 1) as pool:
            pages = list(pool.map(read, live))
        key = (lambda entry: _order_key(entry[1]))
        merged = list(heapq.merge(*(entries for _, entries, _ in pages), key=key, reverse=descending))
        unread = [key(entries[-1]) for _, entries, exhausted in pages if not exhausted and entries]
        if unread:  # a shard not read to its end may hold entries after its last one read: none before
            nearest = max(unread) if descending else min(unread)
            merged = [entry for entry in merged if (key(entry) >= nearest if descending else key(entry) <= nearest)]
        return merged[:need], pages

    # ------------------------------------------------------------- counts

    def count(self, text: str, group_by: str | None = None) -> dict:
        """``{"count": n}``, with ``groups`` (``[{"value": v, "count": n}, …]``, most
        frequent first; ``value`` null for devices without the field) when ``group_by``."""
        node = self.parse(text)
        read: dict = {}  # each scan read once per count
        group = self.group_field(group_by) if group_by is not None else None
        ranges = len(self._count_reads(node) | ({Scan(group, "all")} if group else set()))
        if ranges > MAX_SCANS:  # a page reads its cheapest cover; a count every declared predicate's
            raise InvalidFilter(f"counting this filter reads {ranges} ranges of the indexes (each declared predicate "
                                f"of an and, each or branch and in value, and a groupBy field); at most {MAX_SCANS}")
        self._check_ready(self._declared_in(node) | ({group} if group else set()))
        budget = _Budget(self.max_count_index_entries, self._judged_on_items(node))
        if group is None and (fast := self._single_scan_count(node, budget)) is not None:
            return {"count": fast}
        ids, exact = self._ids(node, read, budget)
        values = None
        if not exact:
            if len(ids) > self.max_count_items:
                raise FilterTooBroad(
                    f"counting this filter would read the items of {len(ids)} devices to judge "
                    f"{', '.join(budget.fields)} on each (the indexes cannot); a count reads at most "
                    f"{self.max_count_items}. Narrow the filter with a declared field (and(…) with an eq, a prefix "
                    "or a range), declare the field in FLEET_INDEX, or page through GET /devices?filter=…",
                    "count-items", budget.fields)
            items, now = self._items(ids), self.clock()
            documents = {device_id: _documents(Device.from_item(item, with_connectivity=True))
                         for device_id, item in items.items()
                         if schema.is_live_state(item, now)}
            ids = {device_id for device_id, docs in documents.items() if self._matches(node, docs)}
            if group is not None:
                values = {device_id: group.value_in(documents[device_id]) for device_id in ids}
        answer = {"count": len(ids)}
        if group is not None:
            if values is None:
                indexed = dict(self._entries(Scan(group, "all"), read, budget))
                values = {device_id: indexed.get(device_id, MISSING) for device_id in ids}
            counts = Counter(_group_key(value) for value in values.values())
            answer["groups"] = [{"value": value, "count": count}
                                for value, count in sorted(counts.items(), key=lambda pair: (-pair[1], repr(pair[0])))]
        return answer

    def _count_reads(self, node) -> set:
        """The ranges of the indexes ``_ids`` reads for ``node`` (each once)."""
        if isinstance(node, rql.Or):
            return set().union(*map(self._count_reads, node.children))
        if isinstance(node, rql.And):
            return set().union(*(self._count_reads(child.child if isinstance(child, rql.Not) else child)
                                 for child in node.children))
        return set() if isinstance(node, rql.Not) else set(self._cover(node) or ())

    def _judged_on_items(self, node) -> list[str]:
        """The paths of a filter that a count judges on each device's item: those not
        declared (a delta among them), and connectivity (its index may hold ended connections)."""
        return sorted({path.text for path in rql.paths_of(node)
                       if self.fleet_index.field(path.section, path.parts) is None or path.section == CONNECTIVITY})

    def _single_scan_count(self, node, budget: "_Budget") -> int | None:
        """A predicate one scan answers exactly (not ``ne``): DynamoDB counts it."""
        if isinstance(node, (rql.And, rql.Or, rql.Not)) or isinstance(node, rql.In):
            return None
        if isinstance(node, rql.Compare) and node.op == "ne":
            return None
        scans = self._cover(node)
        if scans is None or len(scans) != 1:
            return None
        scan = scans[0]
        if scan.field.section == CONNECTIVITY:  # its index may hold connections that ended unclosed
            return None

        def count(shard):
            expr = Expression()
            return sum(page.get("Count", 0) for page in self._index_pages(
                {"IndexName": scan.field.index_name, "KeyConditionExpression": scan.key_condition(expr, shard),
                 "Select": "COUNT", **expr.attributes()}, budget))

        with ThreadPoolExecutor(max_workers=SHARDS) as pool:
            return sum(pool.map(count, range(SHARDS)))

    def _ids(self, node, read: dict, budget: "_Budget") -> tuple[set | None, bool]:
        """The devices the filter can match, from the indexes alone, and whether exactly
        those (False: a superset, to be judged on the items)."""
        if isinstance(node, rql.Or):
            parts = [self._ids(child, read, budget) for child in node.children]
            if any(ids is None for ids, _ in parts):
                return None, False
            return set().union(*(ids for ids, _ in parts)), all(exact for _, exact in parts)
        if isinstance(node, rql.And):
            known, exact = [], True
            for child in node.children:
                if isinstance(child, rql.Not):
                    continue
                ids, child_exact = self._ids(child, read, budget)
                exact = exact and child_exact
                if ids is not None:
                    known.append(ids)
            if not known:
                return None, False
            ids = set.intersection(*known)
            for child in node.children:
                if isinstance(child, rql.Not):
                    excluded, excluded_exact = self._ids(child.child, read, budget)
                    if excluded is not None and excluded_exact:
                        ids -= excluded
                    else:
                        exact = False
            return ids, exact
        scans = None if isinstance(node, rql.Not) else self._cover(node)
        if scans is None:
            return None, False
        field = scans[0].field
        ids = set()
        for scan in scans:
            ids.update(device_id for device_id, value in self._entries(scan, read, budget)
                       if rql.matches(node, {field.section: _nest(_path(field), value)}))
        # connectivity's index may hold connections that ended unclosed: the items judge it
        return ids, field.section != CONNECTIVITY

    def _entries(self, scan: Scan, read: dict, budget: "_Budget") -> list[tuple[str, object]]:
        """Every (device id, indexed value) of a scan, all shards (once per ``read``)."""
        if scan not in read:
            read[scan] = self._read_scan(scan, budget)
        return read[scan]

    def _read_scan(self, scan: Scan, budget: "_Budget") -> list[tuple[str, object]]:
        def read(shard):
            expr = Expression()
            request = {"IndexName": scan.field.index_name, "KeyConditionExpression": scan.key_condition(expr, shard),
                       **expr.attributes()}
            return [(schema.StateItem.of(item).device_id, scan.field.decode(item[scan.field.attribute]))
                    for page in self._index_pages(request, budget) for item in page.get("Items", [])]

        with ThreadPoolExecutor(max_workers=SHARDS) as pool:
            return [entry for entries in pool.map(read, range(SHARDS)) for entry in entries]

    def _index_pages(self, request: dict, budget: "_Budget"):
        """Every page of an index Query, ``INDEX_PAGE`` entries a call, each counted against the
        count's ``budget`` (which refuses the count once it is spent)."""
        request = {**request, "Limit": INDEX_PAGE}
        while True:
            page = self.store.send("query", **request)
            budget.spend(page.get("Count", 0))
            yield page
            if "LastEvaluatedKey" not in page:
                return
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _items(self, ids) -> dict[str, dict]:
        ordered = sorted(ids)
        chunks = [ordered[at:at + 100] for at in range(0, len(ordered), 100)]
        found: dict[str, dict] = {}
        with ThreadPoolExecutor(max_workers=4) as pool:
            for items in pool.map(self.store.batch_get_states, chunks):
                found.update(items)
        return found

    # ------------------------------------------------------------- common

    def _declared_in(self, node) -> set[Field]:
        """The declared fields a filter names (a count reads the index of each)."""
        return {field for path in rql.paths_of(node)
                if (field := self.fleet_index.field(path.section, path.parts)) is not None}

    def _matches(self, node, documents: dict) -> bool:
        return rql.matches(node, documents, self._holds)

    def _holds(self, path: rql.Path, value) -> bool:
        field = self.fleet_index.field(path.section, path.parts)
        return field is None or field.holds(value)

    def _check_ready(self, fields) -> None:
        waiting = [field for field in fields if field.attribute not in self._ready]
        if not waiting:
            return
        not_ready = {field.attribute for field in building(self.store, FleetIndex(tuple(waiting)))}
        if not_ready and not self._holds_devices:
            if has_devices(self.store):
                self._holds_devices = True  # checked once: a table that held devices needs the backfill
            else:  # declared on a table without devices: nothing to backfill
                mark_ready(self.store, [field for field in waiting if field.attribute in not_ready])
                not_ready = set()
        self._ready.update(field.attribute for field in waiting if field.attribute not in not_ready)
        if not_ready:
            raise IndexBuilding(sorted(field.path for field in waiting if field.attribute in not_ready),
                                progress(self.store))


_DONE = 0  # a shard position: nothing left


class _Budget:
    """The index entries a count may still read, shared by the shards it reads side by side."""

    def __init__(self, entries: int, judged_on_items: list[str]):
        self.left = entries
        self.fields = judged_on_items
        self._limit = entries
        self._lock = threading.Lock()

    def spend(self, entries: int) -> None:
        with self._lock:
            self.left -= entries
            if self.left < 0:
                raise FilterTooBroad(
                    f"counting this filter reads more than {self._limit} entries of the fleet index, as many as a "
                    "count may. A count reads each declared predicate's range in full, so another predicate "
                    "and(…)ed to it does not lessen that: narrow the broad predicate itself (an eq, a longer prefix "
                    "or a tighter range), or page through GET /devices?filter=…", "count-index-entries", self.fields)


def _documents(device: Device) -> dict:
    """What a filter judges: the sections, and the delta as the device is asked to act on it."""
    now = time.time()
    return {"state": device.state, "desired": device.desired, "reported": device.reported,
            rql.DELTA: device.delta(now), CONNECTIVITY: connectivity_of(device.presence or {}, now)}


def _nest(path: rql.Path, value) -> dict:
    """The section document holding only ``value`` at ``path``."""
    document = value
    for part in reversed(path.parts):
        document = {part: document}
    return document


def _literals(node, path: rql.Path) -> list:
    if isinstance(node, (rql.And, rql.Or)):
        return [value for child in node.children for value in _literals(child, path)]
    if isinstance(node, rql.Not):
        return _literals(node.child, path)
    if node.path != path:
        return []
    if isinstance(node, rql.In):
        return list(node.values)
    if isinstance(node, rql.Like):
        return [node.prefix]
    return [node.value] if isinstance(node, rql.Compare) else []


def _shown(value) -> str:
    return str(value) if isinstance(value, Decimal) else json.dumps(value, ensure_ascii=False)


def _order_key(value):
    """The index's order: strings by their UTF-8 bytes, numbers by value."""
    return value.encode() if isinstance(value, str) else value


def _group_key(value):
    return None if value is MISSING else value


def _advance(positions: list, pages: list[tuple], taken: list[tuple]) -> None:
    """Moves each shard's position past the entries of a round's ``taken`` (a prefix of its
    merged entries) that are its own; a shard read to its end whose entries were all taken is done."""
    for shard, entries, exhausted in pages:
        own = [entry for entry in taken if entry[2] == shard]
        if own:
            positions[shard] = (own[-1][0], own[-1][1])
        if exhausted and len(own) == len(entries):
            positions[shard] = _DONE


def _start_key(field: Field, shard: int, position: tuple) -> dict:
    device_id, value = position
    return {schema.PARTITION_KEY: {"S": device_id}, schema.SORT_KEY: {"S": schema.STATE_SK},
            schema.SHARD_ATTRIBUTE: {"N": str(shard)}, field.attribute: field.encode(value)}


def _cursor_body(at: int, positions: list) -> dict:
    return {"s": at, "p": [position if position in (None, _DONE) else [position[0], _json_value(position[1])]
                           for position in positions]}


def _json_value(value):
    return str(value) if isinstance(value, Decimal) or (isinstance(value, int) and not isinstance(value, bool)) \
        else value


def _positions(body, scans: list[Scan]) -> tuple[int, list]:
    """The scan and per-shard positions of a cursor's body (its seal vouches that this query
    issued it; the shape is checked still, so that a cursor of another release of this code
    is refused rather than misread)."""
    try:
        at, raw = body["s"], body["p"]
        if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at < len(scans) \
                or not isinstance(raw, list) or len(raw) != SHARDS:
            raise ValueError
        return at, [_position(scans[at], position) for position in raw]
    except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError):
        raise InvalidCursor(CURSOR_REFUSED) from None


def _position(scan: Scan, raw):
    """A shard's position: a device id and its value, inside the scan's range (DynamoDB
    refuses a start key outside the key condition)."""
    if raw is None or (raw == _DONE and not isinstance(raw, bool)):
        return raw
    device_id, value = raw
    if not isinstance(device_id, str) or not DEVICE_ID_PATTERN.fullmatch(device_id):
        raise ValueError
    field = scan.field
    if field.type == "number":
        if not isinstance(value, str):
            raise ValueError
        try:
            value = check_number(Decimal(value))
        except (InvalidOperation, InvalidValue):
            raise ValueError from None
    if field.encode(value) is None or not scan.covers({field.section: _nest(_path(field), value)}):
        raise ValueError
    return device_id, value
