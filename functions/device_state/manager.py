"""DeviceStateManager: the library's façade. It checks its arguments and hands each call to
the part that does it: every write goes plan (``write.planner``) → send (``write.pipeline``,
through ``write.store``, the one door) → classify (``write.outcomes``), inside the one retry
loop (``write.retry``; ``write.writer`` runs it); keyed writes add their idempotency record in
the same transaction (``write.keyed``); reads, listings and queries go to ``fleet``, the
change log to ``feed``, leases to ``leases``."""

from __future__ import annotations

import copy
import functools
import logging
import random
import time
from typing import TYPE_CHECKING, Callable

from boto3.dynamodb.conditions import ConditionBase

from .errors import CredentialRevoked, DeviceNotFound
from .feed.log import ChangeLog
from .fleet.cursors import CursorSeal
from .fleet.index import FleetIndex
from .identity.assertions import use_once
from .identity.credentials import CredentialRecord, Credentials
from .identity.enrollments import MAX_LIMIT as MAX_ENROLLMENTS_LIMIT, Enrollment, Enrollments
from .identity.provisioning import Provisioned, Provisioning
from .item import schema
from .item.credentials import Holder
from .item.fencing import Fence
from .leases.limits import DEFAULT_TTL_SECONDS
from .model.desires import Ack, DesireOptions, check_acks
from .model.device import Device
from .model.sections import DESIRED, STATE, check_section, check_sections, replacing
from .model.updates import UpdateFn
from .model.values import check_state, validate_device_id
from .restore import random_generator
from .runtime import NULL_OBSERVER, Backoff, Runtime, UpdateObserver
from .write.connections import Connections
from .write.keyed import IdempotencyKey, RecordedAnswers
from .write.pipeline import DEFAULT_SETTLE_SECONDS, WritePipeline
from .write.plan import CREATED, DEFAULT_TOMBSTONE_SECONDS, REPLACED, UPDATED, Planned, expect
from .write.planner import Planner
from .write.retry import RetryLoop
from .write.store import Store
from .write.transactions import Operation, TransactionRunner
from .write.writer import DeviceWriter

if TYPE_CHECKING:
    from .fleet.query import FleetQuery
    from .jobs.runner import Due, JobRunner
    from .jobs.service import JobService
    from .jobs.tracker import JobTracker
    from .leases import LeaseQueue

logger = logging.getLogger("device_state")

DEFAULT_MAX_ATTEMPTS = 25
DEFAULT_BUDGET_SECONDS = 5.0

class DeviceStateManager:
    """Reads and writes device state items with version-based optimistic locking.

    Takes its DynamoDB (low-level) client and table name; holds no global state. The
    client should not retry on its own (``dynamodb_client`` makes one that does not).
    ``clock``, ``monotonic``, ``sleep`` and ``rng`` are there so tests can drive time.
    ``cursor_key`` (at least 32 bytes) seals listings' cursors; every manager of one service
    takes the same one (without it, a random key of this manager's own: its cursors are good
    only with it).
    Contending read-modify-writes race under the version check with jittered backoff
    (``write/retry.py``), whether they share this manager or not.
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
        self._runtime = Runtime(clock, monotonic, sleep, rng or random_generator(), backoff, observer)
        self._store = Store(client, table_name, self._runtime)
        self._pipeline = WritePipeline(self._store, self._runtime, settle_seconds=settle_seconds,
                                      tombstone_seconds=tombstone_seconds, fleet_index=fleet_index)
        history = ChangeLog(client, table_name, clock=clock, monotonic=monotonic, sleep=sleep)
        self._answers = RecordedAnswers(self._store, history, self._runtime)
        self._writer = DeviceWriter(self._pipeline, self._answers)
        self.fence = Fence()
        self.seen_by: str | None = None  # the device whose own writes these are (``as_device``)
        self._holder: Holder | None = None  # the credential they come with
        self._cursors = CursorSeal(cursor_key)
        self._fleet_index = fleet_index
        self._connections = Connections(self._pipeline, clock)
        self._credentials = Credentials(self._pipeline, self._runtime)
        self._enrollments = Enrollments(self._store, self._runtime)
        self._provisioning = Provisioning(self._pipeline, self._runtime)

    @functools.cached_property
    def _fleet(self) -> FleetQuery:
        from .fleet.query import FleetQuery

        return FleetQuery(self._store, self._fleet_index, self.clock, self._cursors)

    @property
    def client(self):
        return self._store.client

    @property
    def observer(self) -> UpdateObserver:
        return self._runtime.observer

    @property
    def clock(self) -> Callable[[], float]:
        return self._runtime.clock

    def fenced(self, tokens: dict) -> "DeviceStateManager":
        """This manager, writing under leases: ``{device_id: lease}``, a ``Lease`` (which also
        refuses once it is lost) or its lease token (``Lease.lease_token``, the text a grant
        answers; never the fencing token, a number that only orders leases). A write to a device
        with an active lease must present that lease's token, and a write that presents a token
        succeeds only while that lease is the active one."""
        view = copy.copy(self)
        view.fence = self.fence.with_tokens(tokens)
        return view

    def as_device(self, device_id: str, holder: Holder | None = None) -> "DeviceStateManager":
        """This manager, acting as the device ``device_id`` itself: its writes to itself also
        record it as seen (``lastSeen``, in the same request). ``holder``: the credential the
        device's requests come with (``item.credentials``); every read and write of the device
        then finds it on the item or raises ``CredentialRevoked``, at no extra request."""
        view = copy.copy(self)
        view.seen_by, view._holder = device_id, holder
        return view

    def check_holder(self, device_id: str) -> None:
        """For a request of the device's own that reads and writes nothing of its state item (a
        keyed write replayed from its record): one read of the item, to find the credential it
        comes with there (``Holder.check``)."""
        holder = self._holder_of(device_id)
        if holder is not None:
            validate_device_id(device_id)
            holder.check(device_id, self._store.get_state(device_id), self.clock())

    def _holder_of(self, device_id: str) -> Holder | None:
        return self._holder if self.seen_by == device_id else None

    def lease(self, device_id: str, ttl_seconds: float = DEFAULT_TTL_SECONDS, wait_seconds: float = 0, *,
              owner: str | None = None):
        """A FIFO lease on the device (not yet acquired): use it as a context manager
        (acquires, heartbeats in the background, releases on exit) or call
        ``acquire()``, ``heartbeat()`` and ``release()``. See ``leases/``."""
        from .leases import Lease

        return Lease(self.lease_queue(), self, device_id, ttl_seconds, wait_seconds, owner,
                     self._holder_of(device_id))

    def lease_queue(self) -> LeaseQueue:
        """The lease protocol by lease id, for callers that hold no ``Lease`` object (HTTP)."""
        from .leases import LeaseQueue

        return LeaseQueue(self._pipeline)

    # ----------------------------------------------------------------- reads

    def get(self, device_id: str) -> Device:
        """Strongly consistent read of a device; ``DeviceNotFound`` when absent, deleted or expired."""
        item = self.live_state(device_id)
        if item is None:
            raise DeviceNotFound(device_id)
        return Device.from_item(item, with_connectivity=True)

    def live_state(self, device_id: str) -> dict | None:
        """The device's live state item as stored (strongly consistent), or None;
        ``CredentialRevoked`` when the device reads itself with a credential it no longer holds."""
        validate_device_id(device_id)
        now = self.clock()
        item = self._store.get_live_state(device_id, now)
        holder = self._holder_of(device_id)
        if item is not None and holder is not None and not holder.admits(item, now):
            raise CredentialRevoked(device_id)
        return item

    def wait_for_sections(self, device_id: str, since: int, wait_seconds: float) -> Device:
        """The device once a write after version ``since`` has changed its desired or
        reported (at once when one already has), or as it is when ``wait_seconds`` pass
        (``feed.delta``)."""
        validate_device_id(device_id)
        from .feed.delta import wait_for_sections

        return wait_for_sections(lambda: self.live_state(device_id), self._runtime, device_id, since, wait_seconds)

    def list_devices(self, limit: int = 50, cursor: str | None = None) -> tuple[list[Device], str | None]:
        """One page of devices and the cursor of the next page (None at the end); a page may
        hold fewer than ``limit`` while a cursor remains (``fleet.listing``)."""
        from .fleet.listing import Listing

        return Listing(self._store, self._cursors, self.clock).page(limit, cursor)


    def query_devices(self, filter: str, limit: int = 50, cursor: str | None = None,
                      sort: str | None = None) -> tuple[list[Device], str | None]:
        """One page of the devices the RQL ``filter`` matches on the fleet index, and the
        cursor of the next page (None at the end); ``sort`` ``+path`` or ``-path`` on a
        declared field. See ``fleet_query``."""
        return self._fleet.page(filter, limit, cursor, sort)

    def count_devices(self, filter: str, group_by: str | None = None) -> dict:
        """``{"count": n}`` of the devices ``filter`` matches, with ``groups`` by a declared
        field's value when ``group_by`` names one."""
        return self._fleet.count(filter, group_by)

    def reindex(self, *, budget_seconds: float | None = None, report=lambda progress: None) -> bool:
        """Backfill the index attributes of declared fields not yet ready (``reindex``)."""
        from .fleet.reindex import reindex

        return reindex(self._pipeline, self._fleet_index, budget_seconds=budget_seconds, report=report)

    # ---------------------------------------------------------- connectivity

    def connected(self, device_id: str, connection_id: str, until: float,
                  closed: Callable[[list[str]], set[str]] | None = None) -> bool:
        """Records a WebSocket connection of the device's own credentials, open until
        ``until`` at the latest; False when there is no such device; ``TooManyConnections``
        past ``MAX_CONNECTIONS``. At the cap, ``closed`` (given the held connections' ids,
        returning those known closed) lets it forget connections whose close never reached the
        device's item (``write.connections``)."""
        return self._connections.connected(device_id, connection_id, until, self._holder_of(device_id), closed)

    def disconnected(self, device_id: str, connection_id: str, until: float) -> None:
        """Forgets a connection ``connected`` recorded (``write.connections``)."""
        self._connections.disconnected(device_id, connection_id, until)

    def saw(self, device: Device) -> None:
        """After the device's own read of itself: seen now, at most once a minute."""
        self._connections.saw(device)


    # --------------------------------------------------------------- identity

    def add_credential(self, device_id: str, record: CredentialRecord) -> CredentialRecord:
        """Registers a credential for the device (``identity.credentials``)."""
        validate_device_id(device_id)
        return self._credentials.add(device_id, record)

    def credentials(self, device_id: str) -> list[CredentialRecord]:
        """The device's registered, unexpired credentials."""
        validate_device_id(device_id)
        return self._credentials.listed(device_id)

    def revoke_credential(self, device_id: str, credential_id: str) -> None:
        """Revokes one credential: the next request of every token issued for it is refused."""
        validate_device_id(device_id)
        self._credentials.revoke(device_id, credential_id)

    def credential(self, device_id: str, credential_id: str) -> tuple[CredentialRecord | None, dict | None]:
        """A credential's record and the device's state item, read together (``None`` where absent)."""
        validate_device_id(device_id)
        return self._credentials.of(device_id, credential_id)

    def spend_assertion(self, device_id: str, jti: str, until: int) -> None:
        """Records an assertion's ``jti`` as used (``AssertionReplayed`` when it was)."""
        validate_device_id(device_id)
        use_once(self._store, device_id, jti, until)

    def create_enrollment(self, enrollment: Enrollment) -> Enrollment:
        return self._enrollments.create(enrollment)

    def enrollment(self, enrollment_id: str) -> Enrollment:
        return self._enrollments.get(enrollment_id)

    def enrollments(self, limit: int = MAX_ENROLLMENTS_LIMIT, cursor: str | None = None
                    ) -> tuple[list[Enrollment], str | None]:
        """A page of enrollments not deleted, by id (``Enrollments.page``), and the cursor of the next
        page (None at the end); ``InvalidCursor`` for a cursor this service did not issue for it."""
        scope = ["enrollments"]
        found, last = self._enrollments.page(limit, self._cursors.open(scope, cursor) if cursor else None)
        return found, None if last is None else self._cursors.seal(scope, last)

    def delete_enrollment(self, enrollment_id: str) -> None:
        self._enrollments.delete(enrollment_id)

    def provision(self, device_id: str, enrollment: Enrollment, credential: Callable[[str], CredentialRecord],
                  jti: str, jti_until: int) -> Provisioned:
        """Provisions the device by ``enrollment`` (``identity.provisioning``)."""
        validate_device_id(device_id)
        return self._provisioning.provision(device_id, enrollment, credential, jti, jti_until)

    # ---------------------------------------------------------------- writes
    #
    # Every write takes an optional ``idempotency`` key. Without one it is a conditional
    # UpdateItem per attempt. With one, the change and its idempotency record go in one
    # TransactWriteItems, and a write whose record exists is answered from the record
    # (``Device.replayed`` is then True) without touching the device.

    def jobs(self) -> JobService:
        """Jobs as callers see them (``jobs/service``): create, read, wait, list, cancel."""
        from .jobs.service import JobService  # (jobs load on first use: the cold start of other requests)

        return JobService(self._pipeline, self._fleet, self._cursors)

    def job_runner(self, **options) -> JobRunner:
        """A job runner (``jobs/runner``) over this manager's pipeline and fleet query."""
        from .jobs.runner import JobRunner

        return JobRunner(self._pipeline, self._fleet, **options)

    def due_jobs(self) -> Due:
        """The open jobs a runner should take now (``jobs/runner.due_jobs``)."""
        from .jobs.runner import due_jobs
        from .jobs.store import JobStore

        return due_jobs(JobStore(self._pipeline), self._runtime.clock())

    def job_tracker(self) -> JobTracker:
        """The stream processor's part of jobs (``jobs/tracker``), over this manager's pipeline."""
        from .jobs.tracker import JobTracker

        return JobTracker(self._pipeline)

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
        refused_item = None
        if idempotency is None and condition is None and not options:
            compiled, refused_item = self._writer.compiled(self.fence, device_id, update_fn, section, self.seen_by,
                                                           self._holder_of(device_id))
            if compiled is not None:
                return compiled
        return self._write(device_id, lambda planner, item: planner.replace_state(
            expect(device_id, item, None, planner.now), update_fn, condition, UPDATED, section, options),
            idempotency, max_attempts=max_attempts, budget_seconds=budget_seconds, counted=True,
            first_item=refused_item)[0]

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
                 max_attempts: int | None = None, budget_seconds: float | None = None,
                 answer_fits: Callable[[list[Device]], bool] | None = None) -> list[Device]:
        """All-or-nothing changes to up to 100 devices (99 with an idempotency key); with
        ``answer_fits``, refused (``AnswerTooLarge``) before anything is written when the devices
        it would return do not fit. See ``transactions.TransactionRunner``."""
        return TransactionRunner(self._pipeline, self._loop(max_attempts, budget_seconds), self.recorded_results,
                                 self.fence, self.seen_by, self._holder, answer_fits).run(list(operations), idempotency)

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


    def _loop(self, max_attempts: int | None = None, budget_seconds: float | None = None) -> RetryLoop:
        return RetryLoop(max_attempts or self.max_attempts,
                         self.budget_seconds if budget_seconds is None else budget_seconds, self._runtime)

    def _write(self, device_id: str, plan: Callable[[Planner, dict | None], Planned],
               idempotency: IdempotencyKey | None, *, max_attempts: int | None = None,
               budget_seconds: float | None = None, **how) -> tuple[Device, str]:
        """One write in the retry loop (``writer.DeviceWriter.write``), under this manager's fence."""
        return self._writer.write(self._loop(max_attempts, budget_seconds), self.fence, device_id, plan,
                                  idempotency, seen_by=self.seen_by, holder=self._holder_of(device_id), **how)


def _desire_options(section: str, desire: DesireOptions | None) -> DesireOptions | None:
    if desire and section != DESIRED:
        raise ValueError("expiry and clear on confirm are options of desired writes")
    return desire or None
