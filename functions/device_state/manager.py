"""DeviceStateManager: the library's façade. Every write goes plan (``planning``) → send
(``pipeline``, through ``store``, the one door) → classify (``refusals``, ``pipeline``),
inside the one retry loop (``retry``); keyed writes add their idempotency record in the
same transaction."""

from __future__ import annotations

import copy
import logging
import random
import time
from typing import Callable

from boto3.dynamodb.conditions import ConditionBase

from .model import connectivity
from .item import schema
from .feed.log import ChangeLog, InvalidSince
from .model.desires import Ack, DesireOptions, check_acks
from .model.device import Device
from .fleet.cursors import CURSOR_REFUSED, CursorSeal
from .errors import ConditionFailed, DeviceNotFound, InvalidCursor, TooManyConnections
from .write.expressions import Expression, live
from .item.fencing import Fence
from .fleet.index import FleetIndex
from .fleet.query import FleetQuery
from .write.keyed import IdempotencyKey
from .write.plan import CREATED, REPLACED, UPDATED
from .leases.handle import Lease
from .leases.queue import DEFAULT_TTL_SECONDS, LeaseQueue
from .runtime import NULL_OBSERVER, UpdateObserver
from .write.pipeline import DEFAULT_SETTLE_SECONDS, WritePipeline
from .write.plan import CONNECTED, DEFAULT_TOMBSTONE_SECONDS, Planned, expect
from .write.planner import Planner
from .fleet.reindex import reindex
from .write.keyed import RecordedAnswers
from .restore import random_generator
from .write.retry import RetryLoop
from .runtime import Backoff, Runtime
from .model.sections import DESIRED, STATE, check_section, check_sections, replacing
from .write.store import Store
from .write.transactions import Operation, TransactionRunner
from .model.updates import UpdateFn
from .model.values import check_state, validate_device_id
from .write.writer import DeviceWriter

logger = logging.getLogger("device_state")

DEFAULT_MAX_ATTEMPTS = 25
DEFAULT_BUDGET_SECONDS = 5.0
MAX_LIST_LIMIT = 100
MAX_SCAN_CALLS_PER_PAGE = 4  # a listing page never costs more than this many Scan calls
MAX_SCAN_ITEMS_PER_CALL = 1000  # items one of them reads at most (and 1 MB, DynamoDB's own bound)
SCAN_GROWTH = 4  # a Scan call after calls that found no device reads this many times what they read
LISTING_SCOPE = ["devices"]  # the plain listing's cursors (a fleet query's name its filter and sort)
DISCONNECT_ATTEMPTS = 8  # reads and conditional writes while other connections of the device change

class DeviceStateManager:
    """Reads and writes device state items with version-based optimistic locking.

    Takes its DynamoDB (low-level) client and table name; holds no global state. The
    client should not retry on its own (``dynamodb_client`` makes one that does not).
    ``clock``, ``monotonic``, ``sleep`` and ``rng`` are there so tests can drive time.
    ``cursor_key`` (at least 32 bytes) seals listings' cursors; every manager of one service
    takes the same one (without it, a random key of this manager's own: its cursors are good
    only with it).
    Contending read-modify-writes race under the version check with jittered backoff
    (``retry.py``), whether they share this manager or not.
    """

    def __init__(
        self,
        client,
        table_name: str,
        *,
        observer: UpdateObserver = NULL_OBSERVER,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        budget_seconds: float = DEFAULT_BUDGET_SECONDS,
        backoff: Backoff = Backoff(),
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        tombstone_seconds: int = DEFAULT_TOMBSTONE_SECONDS,
        settle_seconds: float = DEFAULT_SETTLE_SECONDS,
        fleet_index: FleetIndex = FleetIndex(),
        cursor_key: bytes | None = None,
    ):
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.table_name = table_name
        self.max_attempts = max_attempts
        self.budget_seconds = budget_seconds
        self.runtime = Runtime(clock, monotonic, sleep, rng or random_generator(), backoff, observer)
        self.store = Store(client, table_name, self.runtime)
        self.pipeline = WritePipeline(self.store, self.runtime, settle_seconds=settle_seconds,
                                      tombstone_seconds=tombstone_seconds, fleet_index=fleet_index)
        history = ChangeLog(client, table_name, clock=clock, monotonic=monotonic, sleep=sleep)
        self._answers = RecordedAnswers(self.store, history, self.runtime)
        self._writer = DeviceWriter(self.pipeline, self._answers)
        self.fence = Fence()
        self.seen_by: str | None = None  # the device whose own writes these are (``as_device``)
        self.cursors = CursorSeal(cursor_key)
        self.fleet = FleetQuery(self.store, fleet_index, clock, self.cursors)

    @property
    def client(self):
        return self.store.client

    @property
    def observer(self) -> UpdateObserver:
        return self.runtime.observer

    @property
    def clock(self) -> Callable[[], float]:
        return self.runtime.clock

    def fenced(self, tokens: dict) -> "DeviceStateManager":
        """This manager, writing under lease fencing tokens: ``{device_id: token}`` (an
        int, or a ``Lease``, which also refuses once it is lost). A write to a device
        with an active lease must present that lease's token, and a write that presents
        a token succeeds only while that lease is the active one."""
        view = copy.copy(self)
        view.fence = self.fence.with_tokens(tokens)
        return view

    def as_device(self, device_id: str) -> "DeviceStateManager":
        """This manager, writing as the device ``device_id`` itself: its writes to itself
        also record it as seen (``lastSeen``, in the same request)."""
        view = copy.copy(self)
        view.seen_by = device_id
        return view

    def lease(self, device_id: str, ttl_seconds: float = DEFAULT_TTL_SECONDS, wait_seconds: float = 0, *,
              owner: str | None = None):
        """A FIFO lease on the device (not yet acquired): use it as a context manager
        (acquires, heartbeats in the background, releases on exit) or call
        ``acquire()``, ``heartbeat()`` and ``release()``. See ``leases.py``."""
        return Lease(self.lease_queue(), self, device_id, ttl_seconds, wait_seconds, owner)

    def lease_queue(self) -> LeaseQueue:
        """The lease protocol by lease id, for callers that hold no ``Lease`` object (HTTP)."""
        return LeaseQueue(self.pipeline)

    # ----------------------------------------------------------------- reads

    def get(self, device_id: str) -> Device:
        """Strongly consistent read of a device; ``DeviceNotFound`` when absent, deleted or expired."""
        item = self.live_state(device_id)
        if item is None:
            raise DeviceNotFound(device_id)
        return Device.from_item(item, with_connectivity=True)

    def live_state(self, device_id: str) -> dict | None:
        """The device's live state item as stored (strongly consistent), or None."""
        validate_device_id(device_id)
        return self.store.get_live_state(device_id, self.clock())

    def wait_for_sections(self, device_id: str, since: int, wait_seconds: float,
                          first_delay: float = 0.05, max_delay: float = 0.5) -> Device:
        """The device once a write after version ``since`` has changed its desired or
        reported (at once when one already has), or as it is when ``wait_seconds`` pass.
        Polls the state item (strongly consistent), so it never trails the writes."""
        monotonic = self.runtime.monotonic
        deadline = monotonic() + max(wait_seconds, 0.0)
        delay = first_delay
        while True:
            item = self.live_state(device_id)
            if item is None:
                raise DeviceNotFound(device_id)
            if since > int(item[schema.VERSION]["N"]):
                raise InvalidSince(f"since ({since}) is past the device's current version ({item[schema.VERSION]['N']})")
            changed = max((int(item[attribute]["N"]) for attribute in schema.CHANGED_ATTRIBUTES.values()
                           if attribute in item), default=0)
            left = deadline - monotonic()
            if changed > since or left <= 0:
                return Device.from_item(item, with_connectivity=True)
            self.runtime.sleep(min(delay, left))
            delay = min(delay * 2, max_delay)

    def list_devices(self, limit: int = 50, cursor: str | None = None) -> tuple[list[Device], str | None]:
        """One page of devices and the cursor of the next page (None at the end).

        The table holds more than the devices' state items (their change items, lease rows,
        keyed-write records and tombstones, WebSocket connections, the fleet index's
        bookkeeping): a page reads past them and shows devices only. It makes at most
        ``MAX_SCAN_CALLS_PER_PAGE`` Scan calls, the first of ``limit`` items, each later one sized
        by what the page still needs and how many devices the items read so far held (at most
        ``MAX_SCAN_ITEMS_PER_CALL`` items, and 1 MB, DynamoDB's own bound). So a page may hold
        fewer than ``limit`` devices, even none, while a cursor remains: it then read all it
        may, and its cursor is past everything it read. A full page's cursor is its last device
        (or past what it read, when nothing it read after that device was one).
        """
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValueError(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}")
        start_key = _listing_key(self.cursors.open(LISTING_SCOPE, cursor)) if cursor is not None else None
        devices: list[Device] = []
        read = 0  # items the page's Scan calls read
        for _ in range(MAX_SCAN_CALLS_PER_PAGE):
            need = limit - len(devices)
            expr = Expression()
            state_item = f"{expr.name(schema.SORT_KEY)} = {expr.value({'S': schema.STATE_SK})}"
            request = {
                "Limit": _scan_size(need, read, len(devices)),
                "ConsistentRead": True,
                "FilterExpression": f"{state_item} AND {live(expr, int(self.clock()))}",
                **expr.attributes(),
            }
            if start_key:
                request["ExclusiveStartKey"] = start_key
            page = self.store.send("scan", **request)
            read += page.get("ScannedCount", 0)
            found = page.get("Items", [])
            devices.extend(Device.from_item(item, with_connectivity=True) for item in found[:need])
            if len(found) > need:  # the page is full before the end of what this call read
                return devices, self._listing_cursor(found[need - 1])
            start_key = page.get("LastEvaluatedKey")
            if not start_key:
                return devices, None
            if len(devices) == limit:
                break
        return devices, self._listing_cursor(start_key)

    def _listing_cursor(self, key: dict) -> str:
        """The plain listing's cursor: the scan resumes after this key (an item's, or its key)."""
        return self.cursors.seal(LISTING_SCOPE, [key[schema.PARTITION_KEY]["S"], key[schema.SORT_KEY]["S"]])

    def query_devices(self, filter: str, limit: int = 50, cursor: str | None = None,
                      sort: str | None = None) -> tuple[list[Device], str | None]:
        """One page of the devices the RQL ``filter`` matches on the fleet index, and the
        cursor of the next page (None at the end); ``sort`` ``+path`` or ``-path`` on a
        declared field. See ``fleet_query``."""
        return self.fleet.page(filter, limit, cursor, sort)

    def count_devices(self, filter: str, group_by: str | None = None) -> dict:
        """``{"count": n}`` of the devices ``filter`` matches, with ``groups`` by a declared
        field's value when ``group_by`` names one."""
        return self.fleet.count(filter, group_by)

    def reindex(self, *, budget_seconds: float | None = None, report=lambda progress: None) -> bool:
        """Backfill the index attributes of declared fields not yet ready (``reindex``)."""
        return reindex(self.pipeline, self.fleet.fleet_index, budget_seconds=budget_seconds, report=report)

    # ---------------------------------------------------------- connectivity

    def connected(self, device_id: str, connection_id: str, until: float) -> bool:
        """Records a WebSocket connection of the device's own credentials, open until
        ``until`` at the latest (one write, no read); False when there is no such device.
        ``TooManyConnections`` when it has ``MAX_CONNECTIONS`` open, counting after the
        connections whose close never arrived are forgotten."""
        validate_device_id(device_id)
        opened = connectivity.member(connection_id, until)
        try:
            return self._send_connectivity(lambda planner: planner.connect(device_id, opened))
        except ConditionFailed:
            ended = connectivity.ended_members(self.live_state(device_id), self.clock())
            if not ended:
                raise TooManyConnections(device_id, connectivity.MAX_CONNECTIONS) from None
        self._send_connectivity(lambda planner: planner.disconnect(device_id, ended))
        try:
            return self._send_connectivity(lambda planner: planner.connect(device_id, opened))
        except ConditionFailed:
            raise TooManyConnections(device_id, connectivity.MAX_CONNECTIONS) from None

    def disconnected(self, device_id: str, connection_id: str, until: float) -> None:
        """Forgets a connection ``connected`` recorded: one read and one write, each write
        conditioned on the connections read, so that the last one open, whoever closes it
        and whenever, leaves the device disconnected and takes with it those whose close
        never came."""
        validate_device_id(device_id)
        closing = connectivity.member(connection_id, until)
        for _ in range(DISCONNECT_ATTEMPTS):
            item = self.live_state(device_id)
            if item is None:
                return
            held = connectivity.members(item)
            if closing not in held and schema.CONNECTED_SINCE not in item:
                return  # forgotten already (a resend, or a connect that was never recorded)
            others = [entry for entry in connectivity.open_members(item, self.clock()) if entry != closing]
            if others:
                sent = self._send_connectivity(lambda planner: planner.disconnect(device_id, [closing], held))
            else:
                sent = self._send_connectivity(lambda planner: planner.all_disconnected(device_id, held))
            if sent:
                return
        logger.warning("disconnect not recorded: the connections kept changing", extra={"device_id": device_id})

    def saw(self, device: Device) -> None:
        """After the device's own read of itself (``device``, read with its connectivity):
        seen now, unless it was within ``connectivity.SEEN_EVERY_SECONDS``."""
        if device.presence is not None and connectivity.seen_recently(device.presence, self.clock()):
            return
        self._send_connectivity(lambda planner: planner.seen(device.device_id))

    def _send_connectivity(self, plan: Callable[[Planner], Planned]) -> bool:
        """One connectivity change; False when the device is not there, or the change's
        condition says it is not needed (seen recently, a connect meanwhile)."""
        planned = plan(self.pipeline.planner())
        try:
            self.pipeline.send(self.pipeline.planner(), planned)
        except DeviceNotFound:
            return False
        except ConditionFailed:
            if planned.outcome == CONNECTED:
                raise
            return False
        return True

    # ---------------------------------------------------------------- writes
    #
    # Every write takes an optional ``idempotency`` key. Without one it is a conditional
    # UpdateItem per attempt. With one, the change and its idempotency record go in one
    # TransactWriteItems, and a write whose record exists is answered from the record
    # (``Device.replayed`` is then True) without touching the device.

    def create(self, device_id: str, state: dict, *, sections: dict | None = None,
               idempotency: IdempotencyKey | None = None) -> Device:
        """Create a device at version 1 (or, over a deleted one's tombstone, at its last
        version + 1); ``DeviceAlreadyExists`` if it exists. ``sections``: its ``desired``
        and ``reported`` (each ``{}`` when absent)."""
        validate_device_id(device_id)
        check_state(state)
        check_sections(sections)
        # A create meets a live device only to be refused: it has no turn to wait for.
        return self._write(device_id, lambda planner, item: planner.create(device_id, state, item, sections),
                           idempotency, holds=False)[0]

    def put(self, device_id: str, state: dict, *, sections: dict | None = None,
            idempotency: IdempotencyKey | None = None) -> tuple[Device, bool]:
        """Create the device or replace its whole state (and the ``sections`` given, the
        others unchanged); returns (device, created)."""
        validate_device_id(device_id)
        check_state(state)
        check_sections(sections)

        def plan(planner: Planner, item):
            if schema.is_live_state(item, planner.now):
                return planner.write_sections(item, replacing(state, sections), None, REPLACED)
            return planner.create(device_id, state, item, sections)

        device, outcome = self._write(device_id, plan, idempotency, created_may_move=True)
        return device, outcome == CREATED

    def replace(self, device_id: str, state: dict, expected_version: int | None = None, *,
                sections: dict | None = None, idempotency: IdempotencyKey | None = None) -> Device:
        """Replace the whole state (and the ``sections`` given). With ``expected_version``
        only at that version; without it a deliberate clobber (DynamoDBMapper's CLOBBER)
        that still bumps the version by exactly one."""
        validate_device_id(device_id)
        check_state(state)
        check_sections(sections)
        return self._write(device_id, lambda planner, item: planner.write_sections(
            expect(device_id, item, expected_version, planner.now), replacing(state, sections), None, REPLACED),
            idempotency, expected_version=expected_version)[0]

    def replace_section(self, device_id: str, section: str, document: dict, expected_version: int | None = None,
                        *, idempotency: IdempotencyKey | None = None, desire: DesireOptions | None = None) -> Device:
        """Replace one section (``state``, ``desired`` or ``reported``) whole. ``desire``:
        how the leaves of a desired write live on (``desires.DesireOptions``)."""
        validate_device_id(device_id)
        check_section(section)
        check_state(document)
        options = _desire_options(section, desire)
        return self._write(device_id, lambda planner, item: planner.replace_state(
            expect(device_id, item, expected_version, planner.now), lambda _: document, None, REPLACED, section,
            options), idempotency, expected_version=expected_version)[0]

    def update(self, device_id: str, update_fn: UpdateFn, expected_version: int, *,
               condition: ConditionBase | None = None, idempotency: IdempotencyKey | None = None,
               section: str = STATE, desire: DesireOptions | None = None) -> Device:
        """One conditional change (the ``If-Match`` path): apply ``update_fn`` to the
        state (or ``section``) at ``expected_version``; ``VersionConflict`` if the device
        is elsewhere."""
        validate_device_id(device_id)
        check_section(section)
        options = _desire_options(section, desire)
        return self._write(device_id, lambda planner, item: planner.replace_state(
            expect(device_id, item, expected_version, planner.now), update_fn, condition, UPDATED, section, options),
            idempotency, expected_version=expected_version, counted=True)[0]

    def acknowledge(self, device_id: str, acks: list[Ack], *, idempotency: IdempotencyKey | None = None) -> Device:
        """Record the device's answers to desires (``desires.Ack``: applied, in progress,
        refused, failed) in one write; ``DesireMoved`` when one answers a desire that is
        not its leaf's current one, and then nothing is written."""
        validate_device_id(device_id)
        check_acks(acks)
        return self._write(device_id, lambda planner, item: planner.acknowledge(
            expect(device_id, item, None, planner.now), acks), idempotency)[0]

    def update_with_retry(self, device_id: str, update_fn: UpdateFn, *, condition: ConditionBase | None = None,
                          max_attempts: int | None = None, budget_seconds: float | None = None,
                          idempotency: IdempotencyKey | None = None, section: str = STATE,
                          desire: DesireOptions | None = None) -> Device:
        """Read, apply the pure ``update_fn`` to a copy of the state, and write it under
        ``version = :expected``; when another writer got there first, re-apply it to
        the newer state: at once to the item the failed write returned after a first
        conflict, and after a full-jitter backoff and a fresh read after later ones (a
        returned item is stale once we have slept). Gives up with ``RetriesExhausted``,
        having written nothing, after ``max_attempts`` or when the next sleep would cross
        ``budget_seconds``.

        A patch that compiles to one UpdateItem (``write.compiled.compile_patch``) is written that
        way first: no read, no version condition, so no conflict.

        ``condition`` (boto3 ``Attr(...)`` conditions, e.g. ``Attr("state.online").eq(True)``)
        is ANDed with the version check; when it is false ``ConditionFailed`` is raised
        at once. An exception from ``update_fn`` propagates at once, nothing written.
        ``section``: the section the patch applies to (``state`` unless named).
        """
        validate_device_id(device_id)
        check_section(section)
        options = _desire_options(section, desire)
        # a caller's condition, or a desire's options (statuses per leaf), keep read-modify-write
        if idempotency is None and condition is None and not options:
            compiled = self._writer.compiled(self.fence, device_id, update_fn, section, self.seen_by)
            if compiled is not None:
                return compiled
        return self._write(device_id, lambda planner, item: planner.replace_state(
            expect(device_id, item, None, planner.now), update_fn, condition, UPDATED, section, options),
            idempotency, max_attempts=max_attempts, budget_seconds=budget_seconds, counted=True)[0]

    def delete(self, device_id: str, expected_version: int | None = None, *,
               idempotency: IdempotencyKey | None = None) -> Device:
        """Delete a device (version-checked when ``expected_version`` is given) and return
        it as it was. It leaves a tombstone holding its version for ``tombstone_seconds``,
        so a device created again continues at the next version."""
        validate_device_id(device_id)
        return self._write(device_id, lambda planner, item: planner.delete(
            expect(device_id, item, expected_version, planner.now)),
            idempotency, expected_version=expected_version)[0]

    def transact(self, operations: list[Operation], *, idempotency: IdempotencyKey | None = None,
                 max_attempts: int | None = None, budget_seconds: float | None = None) -> list[Device]:
        """All-or-nothing changes to up to 100 devices (99 with an idempotency key). See
        ``transactions.TransactionRunner``."""
        return TransactionRunner(self.pipeline, self._loop(max_attempts, budget_seconds),
                                 self.recorded_results, self.fence).run(list(operations), idempotency)

    # ------------------------------------------------------------ idempotency

    def recorded(self, device_id: str, idempotency: IdempotencyKey) -> tuple[Device, str] | None:
        """The recorded result of a keyed write (device, outcome) if it happened, else None;
        ``IdempotencyKeyReused`` if the key was used for a different request."""
        validate_device_id(device_id)
        results = self.recorded_results(device_id, idempotency)
        return results[0] if results else None

    def recorded_results(self, partition: str, idempotency: IdempotencyKey) -> list[tuple[Device, str]] | None:
        """Every (device, outcome) a keyed write recorded in ``partition`` (a transaction's
        first device), or None."""
        return self._answers.results(partition, idempotency)

    # ------------------------------------------------------------ internals

    def planner(self) -> Planner:
        """Plans writes now, under this manager's lease fence."""
        return self.pipeline.planner(self.fence)

    def _loop(self, max_attempts: int | None = None, budget_seconds: float | None = None) -> RetryLoop:
        return RetryLoop(max_attempts or self.max_attempts,
                         self.budget_seconds if budget_seconds is None else budget_seconds, self.runtime)

    def _write(self, device_id: str, plan: Callable[[Planner, dict | None], Planned],
               idempotency: IdempotencyKey | None, *, max_attempts: int | None = None,
               budget_seconds: float | None = None, **how) -> tuple[Device, str]:
        """One write in the retry loop (``writer.DeviceWriter.write``), under this manager's fence."""
        return self._writer.write(self._loop(max_attempts, budget_seconds), self.fence, device_id, plan,
                                  idempotency, seen_by=self.seen_by, **how)


def _desire_options(section: str, desire: DesireOptions | None) -> DesireOptions | None:
    if desire and section != DESIRED:
        raise ValueError("expiry and clear on confirm are options of desired writes")
    return desire or None


def _scan_size(need: int, read: int, found: int) -> int:
    """How many items a listing page's next Scan call reads: ``need`` devices at the rate the
    page's earlier calls found them (``found`` in ``read`` items), growing while they found none."""
    if not read:
        return need
    wanted = read * SCAN_GROWTH if not found else max(need, -(-need * read // found))
    return min(wanted, MAX_SCAN_ITEMS_PER_CALL)


def _listing_key(position) -> dict:
    """The scan's start key a plain listing's cursor holds (its seal vouches for it)."""
    if not (isinstance(position, list) and len(position) == 2 and all(isinstance(part, str) for part in position)):
        raise InvalidCursor(CURSOR_REFUSED)
    return {schema.PARTITION_KEY: {"S": position[0]}, schema.SORT_KEY: {"S": position[1]}}
