"""What callers do with jobs: create one (checked whole; its Idempotency-Key kept beside it), read
it (or wait for its counts to move), list jobs and a job's executions, cancel, and list a device's
jobs. No HTTP here; the API's routes call these."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..errors import DeviceNotFound, IdempotencyKeyReused, JobNotFound, StorageUnavailable
from ..fleet.cursors import CursorSeal
from ..item import job_marks, schema
from ..item.credentials import Holder
from ..model.values import dumps
from ..write.expressions import Expression
from ..write.keyed import IdempotencyKey
from ..write.outcomes import Refusals
from ..write.pipeline import WritePipeline
from . import items
from .items import PAGE_SIZE, Execution, Head
from .spec import CANCELED, IN_PROGRESS, QUEUED, parse
from .store import JobStore

logger = logging.getLogger("device_state.jobs")

POLL_SECONDS = 0.5  # a waiting read looks at the job's counts this often
_KEY, _JOB = "key", "job"

# A list filtered by status or state stops after so many reads (as the fleet query does): a page may
# then hold fewer items than asked, with a cursor, rather than read a large job's whole list at once.
MAX_READS_PER_PAGE = 10
# A page of jobs as JSON, in bytes: a job shows its desired (8 KB stored, up to 6 times that
# escaped), its filter and its settings, so 100 could pass the 6 MB a Lambda may answer (7 MB
# measured). Escaped again in Lambda's response object, 2 MB at most doubles. The page stops
# before the job that would pass it (its first job is always taken), with a cursor to the rest.
MAX_PAGE_JSON_BYTES = 2 * 1024 * 1024


class JobService:
    def __init__(self, pipeline: WritePipeline, fleet_query, cursors: CursorSeal):
        self._pipeline = pipeline
        self._runtime = pipeline.runtime
        self._store = pipeline.store
        self._jobs = JobStore(pipeline)
        self._query = fleet_query
        self._cursors = cursors

    # ------------------------------------------------------------ create

    def create(self, body, key: IdempotencyKey | None = None) -> tuple[Head, bool]:
        """The job ``body`` asks for, created; (its head, whether it was created before with the same
        key and body: a replay). ``InvalidJob`` (or the fleet query's ``InvalidFilter``) when the body
        cannot be run, ``JobExists``, ``IdempotencyKeyReused``."""
        spec = parse(body, self._runtime.clock())
        if spec.filter is not None:
            self._query.parse(spec.filter)
        return self._keyed(key, spec.job_id, lambda entry: self._jobs.create(spec, entry))

    def _keyed(self, key: IdempotencyKey | None, job_id: str, write, again: bool = False) -> tuple[Head, bool]:
        """``write(entry)`` of a write on the job ``job_id`` under ``key``, returning the job's head as
        it wrote it: the entry is the key's, for the write to put in its own transaction (only while
        absent: a refusal names the part "key").
        (The job's head, False) once written; (its head, True) when the key names a write of the same
        request already (a replay, before or at the same moment); ``IdempotencyKeyReused`` when it
        names another request."""
        if key is not None:
            replayed = self._replayed(key)
            if replayed is not None:
                return replayed, True
        entry = None
        if key is not None:
            entry = {**items.key_entry(key.scope, key.key), items.JOB_ID: {"S": job_id},
                     items.FINGERPRINT: {"S": key.fingerprint},
                     schema.TTL_ATTRIBUTE: {"N": str(int(self._runtime.clock()) + items.KEY_SECONDS)}}
        try:
            written = write(entry)
        except Refusals as refused:
            if key is not None and _KEY in refused.refused:  # the same key, at the same moment
                replayed = self._replayed(key)
                if replayed is not None:
                    return replayed, True
                if not again:  # the key lapsed since it refused: it is free
                    return self._keyed(key, job_id, write, again=True)
            raise
        try:
            return self.head(job_id), False
        except StorageUnavailable as error:  # it applied: answered with the head as written, never a 503
            logger.warning("job head not read after its write: answered as written",
                           extra={"job_id": job_id, "reason": str(error)})
            return written, False

    def _replayed(self, key: IdempotencyKey) -> Head | None:
        found = self._store.get(items.key_entry(key.scope, key.key))
        if found is None or int(found[schema.TTL_ATTRIBUTE]["N"]) <= self._runtime.clock():
            return None
        if found[items.FINGERPRINT]["S"] != key.fingerprint:
            raise IdempotencyKeyReused(None, key.key)
        return self.head(found[items.JOB_ID]["S"])

    # -------------------------------------------------------------- read

    def head(self, job_id: str) -> Head:
        head = self._jobs.head(job_id)
        if head is None:
            raise JobNotFound(job_id)
        return head

    def wait(self, job_id: str, seen: Callable[[str], bool] | None, seconds: float) -> Head:
        """The job once ``seen`` (the ETags the caller saw) no longer matches its ETag (its
        counts, status or total moved), or as it is when ``seconds`` have passed."""
        deadline = self._runtime.monotonic() + seconds
        while True:
            head = self.head(job_id)
            left = deadline - self._runtime.monotonic()
            if seen is None or not seen(head.etag()) or left <= 0:
                return head
            self._runtime.sleep(min(POLL_SECONDS, left))

    def list(self, status: str | None = None, limit: int = 50, cursor: str | None = None) -> tuple[list[dict], str | None]:
        """Jobs, newest first (``status``: only those), each as ``GET /jobs/{id}`` shows it, at
        most ``MAX_PAGE_JSON_BYTES`` of them as JSON (the first always)."""
        scope = ["jobs", status]
        after = self._cursors.open(scope, cursor) if cursor else None
        found: list[dict] = []
        expr = Expression()
        request = {"KeyConditionExpression": f"{expr.name(schema.PARTITION_KEY)} = "
                                             f"{expr.value({'S': items.LISTING_PARTITION})}",
                   "ScanIndexForward": False, "ConsistentRead": True}
        if status is not None:
            request["FilterExpression"] = f"{expr.name(items.STATUS)} = {expr.value({'S': status})}"
        request.update(expr.attributes())
        if after is not None:
            request["ExclusiveStartKey"] = items.key(items.LISTING_PARTITION, str(after))  # sealed by us: ours
        size, last = 0, None  # the page's bytes as JSON; the last job's key read
        for _ in range(MAX_READS_PER_PAGE):
            if len(found) >= limit:
                break
            page = self._store.send("query", **{**request, "Limit": limit - len(found)})
            for entry in page.get("Items", []):
                head = self._jobs.head(entry[items.JOB_ID]["S"])
                if head is not None:
                    shown = head.as_dict()
                    size += len(dumps(shown).encode())
                    if found and size > MAX_PAGE_JSON_BYTES:  # the next page starts at this job
                        return found, self._cursors.seal(scope, last)
                    found.append(shown)
                last = entry[schema.SORT_KEY]["S"]
            if "LastEvaluatedKey" not in page:
                return found, None
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
            last = page["LastEvaluatedKey"][schema.SORT_KEY]["S"]
        return found, self._cursors.seal(scope, last)

    def executions(self, job_id: str, state: str | None = None, limit: int = 50,
                   cursor: str | None = None) -> tuple[list[dict], str | None]:
        """The job's executions in target order (``state``: only those): the final ones from their
        items, the others from their page (in progress once written, queued or canceled before)."""
        head = self.head(job_id)
        run, scope = head.run, ["executions", job_id, state]
        position = self._cursors.open(scope, cursor) if cursor else 0
        if not isinstance(position, int) or isinstance(position, bool) or position < 0:
            position = 0
        found: list[dict] = []
        for _ in range(MAX_READS_PER_PAGE):
            if position >= run.pages * PAGE_SIZE or len(found) >= limit:
                break
            page = self._jobs.page(job_id, position // PAGE_SIZE)
            index = position % PAGE_SIZE
            if page is None or index >= len(page.ids):
                position = (position // PAGE_SIZE + 1) * PAGE_SIZE
                continue
            ids = list(page.ids[index:])
            finals = {execution.device_id: execution for execution in self._finals(job_id, ids)}
            for offset, device_id in enumerate(ids):
                execution = finals.get(device_id) or self._open(page.writes[index + offset], device_id, run)
                position = page.position(index + offset) + 1
                if state is None or execution.state == state:
                    found.append(execution.as_dict())
                    if len(found) == limit:
                        break
            if position - page.position(0) >= len(page.ids):  # the page read to its end (it may be short)
                position = page.position(0) + PAGE_SIZE
        more = position < run.pages * PAGE_SIZE
        return found, self._cursors.seal(scope, position) if more else None

    def _finals(self, job_id: str, device_ids: list[str]) -> list[Execution]:
        keys = [items.execution_key(job_id, device_id) for device_id in device_ids]
        return [Execution.from_item(item) for item in self._store.batch_get(keys).values()]

    @staticmethod
    def _open(packed: int, device_id: str, run) -> Execution:
        if packed:
            version, written_ms = items.unpack_write(packed)
            return Execution(device_id, IN_PROGRESS, version, written_ms)
        return Execution(device_id, CANCELED if run.stopped_ms is not None else QUEUED, 0, run.stopped_ms)

    def device_jobs(self, device_id: str, holder: Holder | None = None, limit: int = 50,
                    cursor: str | None = None) -> tuple[list[dict], str | None]:
        """The jobs whose write reached the device, while it keeps their mark (``item/job_marks``),
        by job id, ``limit`` at a time after ``cursor``: each job's id, status and the device's
        execution. ``holder``: the device's own read, checked on its state item (``Holder.check``)."""
        scope = ["device-jobs", device_id]
        after = self._cursors.open(scope, cursor) if cursor else None  # a job id: sealed by us, ours
        item = self._store.get_state(device_id)
        if holder is not None:
            holder.check(device_id, item, self._store.runtime.clock())
        if not schema.is_live_state(item, self._store.runtime.clock()):
            raise DeviceNotFound(device_id)  # as every other route of a device that is not there
        found, last = [], None
        for job_id, packed in sorted(job_marks.marks(item).items()):
            if after is not None and job_id <= after:
                continue
            if len(found) == limit:
                return found, self._cursors.seal(scope, last)
            last = job_id
            head = self._jobs.head(job_id)
            if head is None:
                continue
            final = self._store.get(items.execution_key(job_id, device_id))
            version, deadline_ms = job_marks.unpack(packed)
            written_ms = deadline_ms - head.record.spec.window_seconds * 1000  # the mark's: when the write was made
            execution = Execution.from_item(final) if final else Execution(device_id, IN_PROGRESS, version, written_ms)
            found.append({"jobId": job_id, "status": head.record.status, "execution": execution.as_dict()})
        return found, None

    # ------------------------------------------------------------ cancel

    def cancel(self, job_id: str, force: bool = False, key: IdempotencyKey | None = None) -> tuple[Head, bool]:
        """Stops queuing (what is queued is CANCELED, never written); ``force``: the job's leaves
        also leave the devices still in progress where the job still owns them. (The job's head,
        whether ``key`` named this cancel already: a replay, answered as the first was, whatever
        the job's status now.) ``JobEnded`` once the job ended (a forced cancel of a job canceled
        already goes on), ``IdempotencyKeyReused``."""
        return self._keyed(key, job_id, lambda entry: self._jobs.stop(job_id, items.STOP_CANCEL, CANCELED,
                                                                      force=force, key_entry=entry))
