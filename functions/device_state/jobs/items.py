"""A job's items on the table, each in a partition no device can take (device ids hold no
``~``), and their attributes, named once here.

- ``~job#<id>`` holds the job: ``job`` (its spec, status and times), ``run`` (the runner's
  lease, position and totals), ``c#<n>`` (``COUNTER_SHARDS`` counters that add up to the
  job's counts), ``t#<page>`` (its target pages: up to ``PAGE_SIZE`` device ids each, and what
  the job's write made of each: 0 until written, then the version and when, packed) and
  ``x#<device id>`` (an execution once it is final).
- ``~jobs`` lists every job by creation time (``<ms>#<id>``: its status), ``~jobs-open`` the
  jobs with work left, ``~job-keys`` the ``Idempotency-Key`` each job was created with.

Every item of a job expires (TTL) ``RETENTION_SECONDS`` after the job's end: the job and its
listing entry once it is done, its other items at the latest time it can be done.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..item import schema
from ..model.sections import VERSION_SPAN
from ..model.times import timestamp
from ..model.values import dumps, loads
from .spec import CANCELED, EXECUTION_STATES, FINAL_STATES, IN_PROGRESS, QUEUED, JobSpec

JOB_PARTITION_PREFIX = "~job#"
LISTING_PARTITION = "~jobs"
OPEN_PARTITION = "~jobs-open"
KEYS_PARTITION = "~job-keys"
JOB_SK, RUN_SK = "job", "run"
COUNTER_PREFIX, PAGE_PREFIX, EXECUTION_PREFIX = "c#", "t#", "x#"
# One query of the job's partition below this sort key reads the job, its run and its counters.
HEAD_END = "s"
COUNTER_SHARDS = 8  # counters the job's counts are spread over, so that writers seldom meet
PAGE_SIZE = 100
RETENTION_SECONDS = 30 * 24 * 60 * 60
KEY_SECONDS = 24 * 60 * 60  # an Idempotency-Key names its job this long

# The job's item.
SPEC, STATUS, CREATED_MS, COMPLETED_MS, ABORTED_BY, LISTED = (
    "spec", "status", "createdMs", "completedMs", "abortedBy", "listedAs")
# The run's item.
OWNER, UNTIL, PAGES, TOTAL, QUERY_CURSOR, TARGETED, AT, SENT, STARTED, BATCH, WRITTEN, SWEEP, STOP, FORCE, \
    STOPPED, CANCELED_QUEUED, REQUERY_AT, FORCED, FORCE_LEFT, CHECKED, WAKE = (
        "owner", "runnerUntil", "pages", "total", "queryCursor", "targeted", "at", "sent", "startedMs", "batch",
        "written", "sweep", "stop", "force", "stoppedMs", "canceledQueued", "requeryMs", "forced", "forceLeft",
        "checked", "wakeMs")
# A counter: finals of written executions, and finals by state.
FINAL_WRITTEN, FINAL_PREFIX = "fw", "f:"
# A target page.
IDS, WRITES = "ids", "writes"
# An execution.
STATE, VERSION, AT_MS, CODE, REASON, WAS_WRITTEN = "state", "version", "atMs", "code", "reason", "wasWritten"
# Listing, open and key entries.
JOB_ID, FINGERPRINT = "jobId", "fingerprint"
# Why a job stopped queuing.
STOP_CANCEL, STOP_ABORT, STOP_END = "cancel", "abort", "end"


def key(partition: str, sort_key: str) -> dict:
    return {schema.PARTITION_KEY: {"S": partition}, schema.SORT_KEY: {"S": sort_key}}


def job_partition(job_id: str) -> str:
    return JOB_PARTITION_PREFIX + job_id


def job_key(job_id: str) -> dict:
    return key(job_partition(job_id), JOB_SK)


def run_key(job_id: str) -> dict:
    return key(job_partition(job_id), RUN_SK)


def counter_key(job_id: str, shard: int) -> dict:
    return key(job_partition(job_id), f"{COUNTER_PREFIX}{shard}")


def page_key(job_id: str, page: int) -> dict:
    return key(job_partition(job_id), f"{PAGE_PREFIX}{page:08d}")


def execution_key(job_id: str, device_id: str) -> dict:
    return key(job_partition(job_id), EXECUTION_PREFIX + device_id)


def listing_sort_key(created_ms: int, job_id: str) -> str:
    return f"{created_ms:013d}#{job_id}"


def open_key(job_id: str) -> dict:
    return key(OPEN_PARTITION, job_id)


def key_entry(scope: str, idempotency_key: str) -> dict:
    digest = hashlib.sha256(f"{scope}\n{idempotency_key}".encode("utf-8", "surrogatepass")).hexdigest()
    return key(KEYS_PARTITION, digest)


def retire_at(spec: JobSpec) -> int:
    """The latest a job can end (its last write at ``endsAt``, tracked for its window), plus
    the retention: when its items expire."""
    return int(spec.ends_at) + spec.window_seconds + RETENTION_SECONDS


def pack_write(written_ms: int, version: int) -> int:
    return written_ms * VERSION_SPAN + version


def unpack_write(packed: int) -> tuple[int, int]:
    """(version, written ms) of a page entry; (0, 0) while not written."""
    written_ms, version = divmod(int(packed), VERSION_SPAN)
    return version, written_ms


def _number(item: dict, name: str, default: int = 0) -> int:
    value = item.get(name)
    return int(value["N"]) if value and "N" in value else default


def _text(item: dict, name: str) -> str | None:
    value = item.get(name)
    return value["S"] if value and "S" in value else None


@dataclass(frozen=True)
class JobRecord:
    spec: JobSpec
    status: str
    completed_ms: int | None = None
    aborted_by: dict | None = None

    @classmethod
    def from_item(cls, item: dict) -> "JobRecord":
        aborted = _text(item, ABORTED_BY)
        return cls(JobSpec.from_stored(_text(item, SPEC)), _text(item, STATUS),
                   _number(item, COMPLETED_MS) if COMPLETED_MS in item else None,
                   loads(aborted) if aborted else None)

    def item(self) -> dict:
        spec = self.spec
        created_ms = round(spec.created_at * 1000)
        return {**job_key(spec.job_id), SPEC: {"S": spec.stored()}, STATUS: {"S": self.status},
                CREATED_MS: {"N": str(created_ms)}, LISTED: {"S": listing_sort_key(created_ms, spec.job_id)},
                schema.TTL_ATTRIBUTE: {"N": str(retire_at(spec))}}


@dataclass(frozen=True)
class RunState:
    """The runner's item: its lease, how far targeting and writing got, and why it stopped."""

    owner: str | None = None
    until_ms: int = 0
    pages: int = 0  # target pages written
    total: int = 0  # devices targeted
    query_cursor: str | None = None  # where targeting goes on in the fleet query
    targeted: bool = False  # targeting reached the end of the query (or the list)
    at: int = 0  # the next position to write: page * PAGE_SIZE + index
    sent: int = 0  # devices claimed for writing (an upper bound of those written: what the rollout counts)
    started_ms: int = 0  # the first claim's time
    batch: tuple[int, int] | None = None  # positions claimed for writing, not yet recorded
    written: int = 0  # positions before ``at`` whose device holds the job's write
    sweep: int = 0  # positions before this are final or swept
    stop: str | None = None  # why queuing stops (cancel, abort, end), once asked
    force: bool = False
    stopped_ms: int | None = None  # queued executions were canceled then
    canceled_queued: int = 0
    requery_ms: int = 0  # a continuous job's next query
    forced: int = 0  # positions before this had their desire removed by a forced cancel,
    force_left: tuple[int, ...] = ()  # but for these, whose removal did not apply (a lease, DynamoDB failing)
    checked: bool = False  # a listed job's devices were checked to exist
    wake_ms: int | None = None  # when the job has work due next (an idle runner's word to the schedule)

    @classmethod
    def from_item(cls, item: dict | None) -> "RunState":
        if not item:
            return cls()
        batch = item.get(BATCH)
        return cls(_text(item, OWNER), _number(item, UNTIL), _number(item, PAGES), _number(item, TOTAL),
                   _text(item, QUERY_CURSOR), TARGETED in item, _number(item, AT), _number(item, SENT),
                   _number(item, STARTED), tuple(int(entry["N"]) for entry in batch["L"]) if batch else None,
                   _number(item, WRITTEN), _number(item, SWEEP), _text(item, STOP), FORCE in item,
                   _number(item, STOPPED) if STOPPED in item else None, _number(item, CANCELED_QUEUED),
                   _number(item, REQUERY_AT), _number(item, FORCED),
                   tuple(int(entry["N"]) for entry in item[FORCE_LEFT]["L"]) if FORCE_LEFT in item else (),
                   CHECKED in item, _number(item, WAKE) if WAKE in item else None)


@dataclass(frozen=True)
class Counts:
    """The job's counts from its counters: the finals of written executions, and each final
    state's count."""

    final_written: int = 0
    finals: dict = field(default_factory=dict)

    @classmethod
    def from_items(cls, items) -> "Counts":
        final_written = 0
        finals = dict.fromkeys(FINAL_STATES, 0)
        for item in items:
            final_written += _number(item, FINAL_WRITTEN)
            for state in FINAL_STATES:
                finals[state] += _number(item, FINAL_PREFIX + state)
        return cls(final_written, finals)

    @property
    def finals_unwritten(self) -> int:
        """Executions final without a write (removed, failed, canceled before their write)."""
        return sum(self.finals.values()) - self.final_written

    def by_state(self, run: RunState) -> dict:
        """Each execution state's count. A device whose write landed counts as written from the
        first of its page's record and its final state (either may be written first)."""
        written = max(run.written, self.final_written)
        finals_unwritten = self.finals_unwritten
        counts = {state: self.finals.get(state, 0) for state in FINAL_STATES}
        counts[CANCELED] += run.canceled_queued
        counts[IN_PROGRESS] = written - self.final_written
        counts[QUEUED] = max(0, run.total - written - finals_unwritten - run.canceled_queued)
        return {state: counts[state] for state in EXECUTION_STATES}


@dataclass(frozen=True)
class Head:
    """What one query of the job's partition head reads: the job, its run, its counts."""

    record: JobRecord
    run: RunState
    counts: Counts

    @classmethod
    def from_items(cls, items: list[dict]) -> "Head | None":
        by_key = {item[schema.SORT_KEY]["S"]: item for item in items}
        if JOB_SK not in by_key:
            return None
        counters = [item for sort_key, item in by_key.items() if sort_key.startswith(COUNTER_PREFIX)]
        return cls(JobRecord.from_item(by_key[JOB_SK]), RunState.from_item(by_key.get(RUN_SK)),
                   Counts.from_items(counters))

    def due(self, now_ms: int) -> bool:
        """Whether a runner should take the job now: it is not complete, no runner holds it, and
        it has work due (a stop to carry out, or its wake time reached: a runner left it idle
        until then; a runner that died left no wake)."""
        run = self.run
        if self.record.completed_ms is not None or (run.owner is not None and run.until_ms >= now_ms):
            return False
        # a removal left (a lease, throttling) waits for the wake its runner set: tried again once a minute
        stopping = run.stop is not None and (run.stopped_ms is None or (run.force and run.forced < run.at))
        return stopping or run.wake_ms is None or run.wake_ms <= now_ms or self.completable() or self.abortable()

    def completable(self) -> bool:
        """Every execution is final and no more will come: the runner that takes the job completes
        it. The stream makes the last executions final with no word to the runner, whose wake may
        lie days ahead (the executions' deadline), so this alone makes the job due. No more will
        come once targeting reached the end of the query or a stop was carried out (which ends
        targeting wherever it was)."""
        counts, run = self.counts_by_state, self.run
        return ((run.targeted or run.stopped_ms is not None) and counts[QUEUED] == 0 and counts[IN_PROGRESS] == 0
                and (not self.record.spec.continuous or run.stopped_ms is not None) and not run.force_left)

    def abortable(self) -> bool:
        """An abort criterion is met and nothing stopped the job yet: the runner that takes it
        aborts it. The stream makes the executions final that meet it, with no word to the
        runner, whose wake may lie days ahead, so this alone makes the job due."""
        if self.run.stop is not None or self.record.status != IN_PROGRESS:
            return False
        counts = self.counts_by_state
        return any(criterion.met(counts) for criterion in self.record.spec.abort)

    def overdue_ms(self, now_ms: int) -> int:
        """How long the job has been due with no runner at it (0: it is not)."""
        if not self.due(now_ms):
            return 0
        return max(0, now_ms - max(self.run.wake_ms or 0, self.run.until_ms))

    @property
    def counts_by_state(self) -> dict:
        return self.counts.by_state(self.run)

    @property
    def targeting(self) -> bool:
        """Whether more devices may be added to the total: targeting has not reached the end of
        the query, and no stop ended it (no runner targets a stopped job)."""
        return not self.run.targeted and self.run.stop is None

    def etag(self) -> str:
        """Changes whenever what the job shows changes (its status, counts, total, end)."""
        # "g" holds what the run's targeted held before a stop hid targeting: the ETags stayed as they were
        shown = dumps({"s": self.record.status, "c": self.counts_by_state, "t": self.run.total,
                       "e": self.record.completed_ms, "g": not self.targeting})
        return hashlib.sha256(shown.encode()).hexdigest()[:20]

    def as_dict(self) -> dict:
        record, run = self.record, self.run
        shown = {**record.spec.as_dict(), "status": record.status, "counts": self.counts_by_state,
                 "total": run.total}
        if self.targeting:
            shown["targeting"] = True
        if record.completed_ms is not None:
            shown["completedAt"] = timestamp(record.completed_ms / 1000)
        if record.aborted_by is not None:
            shown["abortedBy"] = record.aborted_by
        return shown


@dataclass(frozen=True)
class Page:
    number: int
    ids: tuple[str, ...]
    writes: tuple[int, ...]  # packed (written ms, version) per id; 0: not written

    @classmethod
    def from_item(cls, item: dict) -> "Page":
        number = int(item[schema.SORT_KEY]["S"][len(PAGE_PREFIX):])
        return cls(number, tuple(entry["S"] for entry in item[IDS]["L"]),
                   tuple(int(entry["N"]) for entry in item[WRITES]["L"]))

    def item(self, job_id: str, expires: int) -> dict:
        return {**page_key(job_id, self.number), IDS: {"L": [{"S": device_id} for device_id in self.ids]},
                WRITES: {"L": [{"N": str(packed)} for packed in self.writes]}, schema.TTL_ATTRIBUTE: {"N": str(expires)}}

    def position(self, index: int) -> int:
        return self.number * PAGE_SIZE + index


@dataclass(frozen=True)
class Execution:
    """A device's execution as listed: its state, the version the job's write made (0: none),
    since when, and a failure's code and reason."""

    device_id: str
    state: str
    version: int = 0
    at_ms: int | None = None
    code: int | None = None
    reason: str | None = None
    written: bool = False

    @classmethod
    def from_item(cls, item: dict) -> "Execution":
        return cls(item[schema.SORT_KEY]["S"][len(EXECUTION_PREFIX):], _text(item, STATE), _number(item, VERSION),
                   _number(item, AT_MS), _number(item, CODE) if CODE in item else None, _text(item, REASON),
                   WAS_WRITTEN in item)

    def item(self, job_id: str, expires: int) -> dict:
        stored = {**execution_key(job_id, self.device_id), STATE: {"S": self.state},
                  VERSION: {"N": str(self.version)}, AT_MS: {"N": str(self.at_ms)},
                  schema.TTL_ATTRIBUTE: {"N": str(expires)}}
        if self.code is not None:
            stored[CODE] = {"N": str(self.code)}
        if self.reason is not None:
            stored[REASON] = {"S": self.reason}
        if self.written:
            stored[WAS_WRITTEN] = {"BOOL": True}
        return stored

    def as_dict(self) -> dict:
        shown = {"deviceId": self.device_id, "state": self.state, "version": self.version,
                 "updatedAt": timestamp(self.at_ms / 1000) if self.at_ms else None}
        if self.code is not None:
            shown["code"] = self.code
        if self.reason is not None:
            shown["reason"] = self.reason
        return shown
