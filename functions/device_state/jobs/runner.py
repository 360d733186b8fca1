"""The job runner: one worker at a time per job (a lease on the job's run item), resumable from
what the table holds, so a worker that dies or is killed loses nothing and repeats nothing (each
device's mark refuses a second write of the job: ``device_write``).

``run(job_id, budget_seconds)`` takes steps until nothing is due or its time is up; each step
reads the job's head (job, run, counters: one query) and does the one thing due first:

- a stop: ``endsAt`` passed or an abort criterion is met (the job ``ABORTED``); once a stop is
  asked (those, or a cancel), a batch a runner claimed and never recorded is found on the devices
  (their marks), what of it is on none is ``CANCELED``, then what is still queued is counted
  ``CANCELED``, once, never written; a forced cancel then removes the job's leaves where the job
  still owns them;
- a listed job's devices checked first: one that does not exist is ``REMOVED`` at once;
- targeting: the next page of the fleet query (up to ``TARGET_PAGES`` target pages of devices),
  each device once (``_target_page``), is added when none waits to be written, and beside each
  batch's writes while fewer than two batches' worth wait; a continuous job queries again every
  ``requery_seconds`` once every target is written, adding the devices that match now and hold no
  execution of the job;
- writing: the next devices (the rest of a page, or up to ``BATCH_PAGES`` pages in a job with no
  rollout nor abort criteria) are claimed on the run item (``batch``, and ``sent``, which the
  rollout counts), written side by side (none begun once a stop is seen, or the lease nears its
  end), recorded on their pages, and the run moves past them with its count of those written,
  on condition that the batch is still the one claimed (a late or second copy changes nothing).
  A paced job's write ``j`` goes no earlier than ``60 j / maxPerMinute`` seconds after its
  first, so at no moment more than ``maxPerMinute × elapsed / 60 + 1`` were sent. A device whose write's outcome is not known
  keeps the batch claimed: the next step writes it again (its mark answers if it landed);
- sweeping: written executions whose deadline passed unconfirmed are judged on their device's item
  (``TIMED_OUT``, or what the item shows if the stream has not told it yet); while the job still
  writes or targets, once a minute, so that each is final before its device's mark may go;
- completing: nothing queued or in progress (a continuous job: and stopped).
"""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from ..errors import (
    AnswerLost,
    ConditionNotMet,
    DeviceLocked,
    DeviceNotFound,
    IndexBuilding,
    InvalidCursor,
    InvalidFilter,
    JobEnded,
    LeaseNotHeld,
    OutcomeUnknown,
    RetriesExhausted,
    StorageUnavailable,
)
from ..item import job_marks, schema
from ..model.desires import without_leaves
from ..model.device import Device
from ..model.patches import MergePatch
from ..model.sections import DESIRED
from ..write.outcomes import Moved
from ..write.pipeline import WritePipeline
from ..write.plan import UPDATED
from ..write.retry import RetryLoop
from . import items
from .device_write import JobWrites, Outcome
from .executions import Verdict, judge, owns_leaves
from .finals import Final, Finals
from .items import PAGE_SIZE, Head, Page
from .spec import ABORTED, CANCELED, IN_PROGRESS, QUEUED, REMOVED, JobSpec
from .store import JobStore, RunLost

logger = logging.getLogger("device_state.jobs")

LEASE_SECONDS = 30  # renewed at every change of the run; a runner that stops renewing loses it after this
BATCH_SECONDS = 10  # a paced batch claims what the rollout allows over this long
STOP_POLL_SECONDS = 1.0  # a batch being written looks for a stop at least this often,
STOP_CHECK_WRITES = 64  # and again after every so many writes begun (one read of the run item each)
IDLE_AFTER_SECONDS = 30  # a paced job whose next write is further off than this waits for the schedule
DEFAULT_CONCURRENCY = 16
# A forced cancel's removal that did not apply (the device leased, DynamoDB failing) is tried
# again this much later, by the schedule.
FORCE_RETRY_SECONDS = 60
BATCH_PAGES = 4  # a batch of a job with no rollout nor abort criteria: so many target pages (writers seldom idle)
TARGET_PAGES = 4  # target pages from one page of the fleet query (its 16 shards read once for 400 devices)
DEFAULT_REQUERY_SECONDS = 60
SWEEP_EVERY_SECONDS = 60  # while a job still writes or targets, its due executions are swept this often
DONE, IDLE, BUSY, HELD = "done", "idle", "busy", "held"


@dataclass(frozen=True)
class Progress:
    """What a ``run`` came to: ``DONE`` (the job is complete), ``IDLE`` (nothing due before
    ``wake_ms``; None: only a cancel can change that), ``BUSY`` (its time ran out with work due:
    run again at once), ``HELD`` (another runner holds the job)."""

    status: str
    wake_ms: int | None = None


class StopWatch:
    """A batch's look-out for a stop (a cancel, an abort, ``endsAt``) or its run taken by another
    runner: it looks (``look``: True when the batch must stop) after every ``STOP_CHECK_WRITES``
    writes begun, and at least every ``STOP_POLL_SECONDS``, so after a cancel about that many
    writes begin, and those begun while the look is answered (those in flight land), however fast
    the batch writes. A look that fails is taken again at the next turn. ``stopped`` is set once it
    saw one; the batch calls ``finish`` when it ends."""

    def __init__(self, look: Callable[[], bool]):
        self._look = look
        self.stopped, self.finished, self._due = threading.Event(), threading.Event(), threading.Event()
        self._begun = itertools.count(1)

    def began_write(self) -> None:
        if next(self._begun) % STOP_CHECK_WRITES == 0:
            self._due.set()

    def finish(self) -> None:
        """The batch ended: the watch ends at once."""
        self.finished.set()
        self._due.set()

    def run(self) -> None:
        while not self.finished.is_set():
            self._due.wait(STOP_POLL_SECONDS)
            self._due.clear()
            if self.finished.is_set():
                return
            try:
                stop = self._look()
            except Exception:  # noqa: BLE001 - a look that failed is taken again, never the end of the watch
                logger.warning("a look for a job's stop failed; looking again", exc_info=True)
                continue
            if stop:
                self.stopped.set()
                return


class JobRunner:
    def __init__(self, pipeline: WritePipeline, fleet_query=None, *, owner: str | None = None,
                 concurrency: int = DEFAULT_CONCURRENCY, requery_seconds: float = DEFAULT_REQUERY_SECONDS,
                 lease_seconds: float = LEASE_SECONDS):
        self._pipeline = pipeline
        self._store = pipeline.store
        self._runtime = pipeline.runtime
        self._jobs = JobStore(pipeline)
        self._finals = Finals(pipeline)
        self._query = fleet_query
        self.owner = owner or uuid.uuid4().hex
        self.concurrency = concurrency
        self.requery_seconds = requery_seconds
        self.lease_seconds = lease_seconds
        self._swept_at: float | None = None  # (monotonic) when this runner last swept before the writes ended

    def run(self, job_id: str, budget_seconds: float) -> Progress:
        monotonic = self._runtime.monotonic
        deadline = monotonic() + budget_seconds
        head = self._jobs.head(job_id)
        if head is None or head.record.completed_ms is not None:
            return Progress(DONE)
        if not self._jobs.take_lease(job_id, self.owner, self.lease_seconds):
            return Progress(HELD)
        writes = JobWrites(self._pipeline, head.record.spec)
        try:
            attempt = 0
            while monotonic() < deadline:
                head = self._jobs.head(job_id)
                if head.run.owner != self.owner:
                    return Progress(HELD)
                try:
                    step = self._step(head, writes, deadline)
                    attempt = 0
                except RunLost:
                    return Progress(HELD)
                except (AnswerLost, ConditionNotMet, StorageUnavailable) as error:  # the next read decides
                    attempt += 1
                    logger.warning("job %s: step not known to have applied (%s); reading again", job_id, error)
                    self._runtime.pause(min(attempt, 6))
                    continue
                if step is not None:
                    return step
            return Progress(BUSY)
        finally:
            self._jobs.release_lease(job_id, self.owner)

    def _step(self, head: Head, writes: JobWrites, deadline: float) -> Progress | None:
        spec, run, now = head.record.spec, head.run, self._runtime.clock()
        job_id = spec.job_id
        if run.stop is None and self._stopping(head, now):
            return None
        if run.stop is not None and run.stopped_ms is None:
            self._reconcile(head) if run.batch is not None else self._cancel_queued(head)
            return None
        if run.batch is not None:
            self._write_batch(head, writes)
            return None
        if run.force and run.forced < run.at:
            self._force_page(head)
            return None
        if run.force_left:
            return self._force_left(head)
        if run.stop is None and spec.filter is None and not run.checked:
            self._check_listed(head)
            return None
        written_all = run.at >= run.pages * PAGE_SIZE
        if run.stop is None and not (written_all and run.targeted) and self._sweep_due() and self._sweep(head):
            return None  # a long job's executions final at their deadline, before their marks may go
        if run.stop is None and not written_all:
            wait = self._claim(head)
            if isinstance(wait, tuple):  # claimed: written now, from what the claim set
                claimed, pages = wait
                self._write_batch(claimed, writes, pages)
                return None
            if wait is None:
                return None
            if wait > IDLE_AFTER_SECONDS:
                return self._idle(head, int((now + wait) * 1000))
            self._runtime.sleep(max(0.0, min(wait, deadline - self._runtime.monotonic())))
            return None
        if run.stop is None and not run.targeted:
            self._target_page(head)
            return None
        if self._sweep(head):
            return None
        if spec.continuous and run.stop is None and now * 1000 >= run.requery_ms:
            self._jobs.update_run(job_id, self.owner, sets={
                items.TARGETED: None, items.QUERY_CURSOR: None,
                items.REQUERY_AT: int((now + self.requery_seconds) * 1000)}, lease_seconds=self.lease_seconds)
            return None
        counts = head.counts_by_state
        if counts[QUEUED] == 0 and counts[IN_PROGRESS] == 0 and (not spec.continuous or run.stopped_ms is not None):
            self._jobs.complete(head)
            return Progress(DONE)
        return self._idle(head, None)

    def _idle(self, head: Head, wake_ms: int | None) -> Progress:
        """Nothing due now: when the schedule should run the job again."""
        spec, run = head.record.spec, head.run
        due = [wake_ms, int(spec.ends_at * 1000) if run.stop is None else None,
               run.requery_ms if spec.continuous and run.stop is None else None, self._next_deadline(head)]
        wake = min((moment for moment in due if moment), default=None)
        self._jobs.update_run(spec.job_id, self.owner, sets={items.WAKE: wake})
        return Progress(IDLE, wake)

    # ------------------------------------------------------------- stops

    def _stop_look(self, spec: JobSpec) -> Callable[[], bool]:
        """What a batch's ``StopWatch`` reads: the run item alone (a stop asked, or the run
        another's); for a job with abort criteria its head (one query: the run and the counts),
        so that a criterion met while a paced batch writes ends the batch then, not its 10 s later
        (the next step aborts the job)."""
        def stopped(run: items.RunState) -> bool:
            return run.stop is not None or run.owner != self.owner

        if not spec.abort:
            return lambda: stopped(self._jobs.run(spec.job_id))

        def look() -> bool:
            head = self._jobs.head(spec.job_id)
            return head is None or stopped(head.run) or head.abortable()
        return look

    def _stopping(self, head: Head, now: float) -> bool:
        """Asks a stop when ``endsAt`` passed or an abort criterion is met; True when it did."""
        spec = head.record.spec
        if now >= spec.ends_at:
            self._jobs.stop(spec.job_id, items.STOP_END)
            return True
        counts = head.counts_by_state
        criterion = next((criterion for criterion in spec.abort if criterion.met(counts)), None)
        if criterion is None or head.record.status != IN_PROGRESS:
            return False
        try:
            self._jobs.stop(spec.job_id, items.STOP_ABORT, ABORTED, aborted_by=criterion.as_dict())
        except JobEnded:  # canceled meanwhile: that stop stands
            pass
        return True

    def _reconcile(self, head: Head) -> None:
        """A stop found a batch claimed and not recorded: what of it reached the devices (their
        marks) is recorded as written; the rest is CANCELED, each execution final on its own. A
        runner that claimed the batch and stalled past its lease may still land a write there
        later: that execution stays CANCELED (its device's later reports count for nothing), where
        a count of the queued would have counted it again."""
        spec, run = head.record.spec, head.run
        pages = self._read_batch(spec, run)
        states, finals = {}, {}
        for page in pages:  # a page's devices at a time: a batch read takes up to 100
            unrecorded = [device_id for _, index, device_id in _inside([page], run.batch) if not page.writes[index]]
            states.update(self._store.batch_get_states(unrecorded) if unrecorded else {})
            finals.update(self._jobs.finals(spec.job_id, unrecorded))
        recorded, canceled = {}, []
        now_ms = int(self._runtime.clock() * 1000)
        for page, index, device_id in _inside(pages, run.batch):
            if page.writes[index] or device_id in finals:  # final already: the stream judged its write
                continue
            mark = job_marks.mark_of(states.get(device_id), spec.job_id)
            if mark is not None:
                version, deadline_ms = mark
                recorded[(page.number, index)] = items.pack_write(deadline_ms - spec.window_seconds * 1000, version)
            else:
                canceled.append(Final(device_id, Verdict(CANCELED, now_ms)))
        self._record(spec, pages, recorded)
        self._finals.record(spec.job_id, items.retire_at(spec), canceled)
        self._move_past(head, pages, recorded, sum(execution.written for execution in finals.values()))

    def _cancel_queued(self, head: Head) -> None:
        queued = head.counts_by_state[QUEUED]
        self._jobs.update_run(head.record.spec.job_id, self.owner, sets={
            items.STOPPED: int(self._runtime.clock() * 1000), items.CANCELED_QUEUED: queued},
            absent=(items.STOPPED, items.BATCH), lease_seconds=self.lease_seconds)

    def _force_page(self, head: Head) -> None:
        """A forced cancel: each device still in progress where the job still owns its leaves (no
        other writer set one since) has its execution CANCELED first, then the job's leaves
        removed (the stream then sees the job's own removal after the final state, not a
        supersession). A device whose removal does not apply (leased, DynamoDB failing) is left
        for ``_force_left``, and the pages after it go on. One CANCELED already (a runner that
        stopped before it recorded the page) has its removal made again where still owed."""
        spec, run = head.record.spec, head.run
        page = self._jobs.page(spec.job_id, run.forced // PAGE_SIZE)
        end = min((run.forced // PAGE_SIZE + 1) * PAGE_SIZE, run.at)
        left = []
        if page is not None:
            written = self._written(spec, page, run.forced, end)
            finals = self._jobs.final_states(spec.job_id, [device_id for _, device_id, _, _ in written])
            for position, device_id, version, deadline_ms in written:
                if device_id not in finals:
                    removed = self._force_one(spec, device_id, version, deadline_ms)
                else:  # CANCELED: removed again where still owed; another final was not the job's to cancel
                    removed = finals[device_id] != CANCELED or self._remove_owned(spec, device_id, version)
                if not removed:
                    left.append(position)
        retry_ms = int((self._runtime.clock() + FORCE_RETRY_SECONDS) * 1000)  # the wake that retries what is left
        self._jobs.update_run(spec.job_id, self.owner, sets={
            items.FORCED: end, **({items.FORCE_LEFT: tuple(sorted({*run.force_left, *left})),
                                   items.WAKE: min(retry_ms, run.wake_ms or retry_ms)} if left else {})},
            lease_seconds=self.lease_seconds)

    def _force_left(self, head: Head) -> Progress | None:
        """The removals a forced cancel left (their executions CANCELED), tried again while the
        job still owns the device's leaves; the job idles while any is left, for the schedule to
        take it up again (a lease on the device may last long: the rest of the job went on)."""
        spec, run = head.record.spec, head.run
        still = []
        for number in sorted({position // PAGE_SIZE for position in run.force_left}):
            page = self._jobs.page(spec.job_id, number)
            written = self._written(spec, page, number * PAGE_SIZE, (number + 1) * PAGE_SIZE) if page else []
            still += [position for position, device_id, version, _ in written if position in run.force_left
                      and not self._remove_owned(spec, device_id, version)]
        self._jobs.update_run(spec.job_id, self.owner, sets={items.FORCE_LEFT: tuple(still) or None},
                              lease_seconds=self.lease_seconds)
        return self._idle(head, int((self._runtime.clock() + FORCE_RETRY_SECONDS) * 1000)) if still else None

    def _force_one(self, spec: JobSpec, device_id: str, version: int, deadline_ms: int) -> bool:
        """The device's execution CANCELED and the job's leaves removed while the job still owns
        them; False when the removal did not apply."""
        expires = items.retire_at(spec)
        item = self._store.get_state(device_id)
        verdict = judge(spec.leaves, version, deadline_ms, item, self._runtime.clock())
        if verdict is not None:  # final already: confirmed, refused, superseded or gone
            self._finals.record(spec.job_id, expires, [Final(device_id, verdict, version, True)])
            return True
        canceled = Final(device_id, Verdict(CANCELED, int(self._runtime.clock() * 1000)), version, True)
        if not self._finals.record(spec.job_id, expires, [canceled]):
            return True  # the stream made it final meanwhile: the job no longer owns the outcome
        return self._remove_owned(spec, device_id, version)

    def _remove_owned(self, spec: JobSpec, device_id: str, version: int) -> bool:
        """The job's leaves removed from the device while the job still owns them (``owns_leaves``:
        whatever the execution came to since its CANCELED, past its deadline too); False when the
        removal did not apply."""
        def attempt(current, _number):
            if not owns_leaves(spec.leaves, version, current, self._runtime.clock()):
                return  # another writer set a leaf (or the device went): its leaves are not the job's now
            planner = self._pipeline.planner()
            removal = _removal(spec.leaves, Device.from_item(current).desired)
            self._pipeline.send(planner, planner.replace_state(current, removal, None, UPDATED, DESIRED))

        try:
            RetryLoop(8, 5.0, self._runtime).run(device_id, attempt, lambda: self._store.get_state(device_id),
                                                 count_success=False)
        except DeviceNotFound:
            return True
        except (RetriesExhausted, OutcomeUnknown, StorageUnavailable, Moved, DeviceLocked, LeaseNotHeld) as error:
            logger.warning("job %s: the canceled desire of %s is left on the device for now (%s); tried again in %d s",
                           spec.job_id, device_id, type(error).__name__, FORCE_RETRY_SECONDS)
            return False
        return True

    def _check_listed(self, head: Head) -> None:
        """A listed device that does not exist has its execution REMOVED at once."""
        spec, run = head.record.spec, head.run
        now = self._runtime.clock()
        finals = []
        for page in self._jobs.pages(spec.job_id, 0, run.pages - 1):
            states = self._store.batch_get_states(list(page.ids))
            finals += [Final(device_id, Verdict(REMOVED, int(now * 1000))) for device_id in page.ids
                       if not schema.is_live_state(states.get(device_id), now)]
        self._finals.record(spec.job_id, items.retire_at(spec), finals)
        self._jobs.update_run(spec.job_id, self.owner, sets={items.CHECKED: True}, lease_seconds=self.lease_seconds)

    # ---------------------------------------------------------- targeting

    def _target_page(self, head: Head) -> Head:
        """The next pages of matching devices (up to ``TARGET_PAGES``, from one page of the fleet
        query), those the job has not targeted, written nor finished; the head as it left the run
        (its pages, cursor, whether targeting reached the end).

        A device whose indexed value moves ahead of the query's cursor is found again: written
        already, its mark keeps it out; waiting to be written, the pages from the write position on
        (the only ones with devices not yet written, read here) do; final with no mark on its item,
        its execution item does, read only when that may be (``_finals_may_recur``)."""
        spec, run = head.record.spec, head.run
        try:
            found, cursor = self._query.page_items(spec.filter, TARGET_PAGES * PAGE_SIZE, run.query_cursor,
                                                   max_limit=TARGET_PAGES * PAGE_SIZE)
        except IndexBuilding:
            self._runtime.sleep(1.0)
            return head
        except (InvalidCursor, InvalidFilter) as error:  # the declaration changed under the job
            logger.warning("job %s: targeting stopped: %s", spec.job_id, error)
            found, cursor = [], None
        ids = list(dict.fromkeys(schema.StateItem.of(item).device_id for item in found
                                 if job_marks.mark_of(item, spec.job_id) is None))
        if ids and run.pages * PAGE_SIZE > run.at:
            waiting = {device_id for page in self._jobs.pages(spec.job_id, run.at // PAGE_SIZE, run.pages - 1)
                       for device_id in page.ids}
            ids = [device_id for device_id in ids if device_id not in waiting]
        if ids and self._finals_may_recur(head):
            final = self._jobs.final_devices(spec.job_id, ids)
            ids = [device_id for device_id in ids if device_id not in final]
        added = self._jobs.add_pages(spec.job_id, self.owner, run.pages, ids, cursor, items.retire_at(spec))
        targeted = replace(run, pages=run.pages + added, total=run.total + len(ids), query_cursor=cursor,
                           targeted=cursor is None)
        return replace(head, run=targeted)

    def _finals_may_recur(self, head: Head) -> bool:
        """Whether a device the query finds may hold no mark of the job although its execution is
        final: one final without a write (refused, removed unwritten), one written and deleted
        since (its item, created again, holds no mark), or one whose mark a write dropped a day
        after its deadline (a job older than that); a continuous job's requery always."""
        spec, counts = head.record.spec, head.counts
        marks_kept_until = spec.created_at + spec.window_seconds + job_marks.GRACE_SECONDS
        return (spec.continuous or counts.finals_unwritten > 0 or counts.finals.get(REMOVED, 0) > 0
                or self._runtime.clock() >= marks_kept_until)

    # ------------------------------------------------------------ writes

    def _claim(self, head: Head) -> tuple[Head, list[Page]] | float | None:
        """Claims the next devices to write: the rest of the page being written and, in a job with
        no rollout and no abort criteria, of the pages after it up to ``BATCH_PAGES`` (a batch
        ending at a page's end ends at the next page's start). (The head as the claim left it,
        the pages) when it claimed; None when it moved past pages' ends; else the seconds until
        the rollout allows the next write."""
        spec, run = head.record.spec, head.run
        first_page = run.at // PAGE_SIZE
        last_page = min(run.pages, first_page + _pages_per_batch(spec)) - 1
        pages = self._jobs.pages(spec.job_id, first_page, last_page)
        positions = [position for page in pages for position in map(page.position, range(len(page.ids)))
                     if position >= run.at]
        boundary = (last_page + 1) * PAGE_SIZE
        if not positions:  # on to the next page
            self._jobs.update_run(spec.job_id, self.owner, sets={items.AT: boundary}, conditions={items.AT: run.at},
                                  absent=(items.BATCH,), lease_seconds=self.lease_seconds)
            return None
        count = len(positions)
        now = self._runtime.clock()
        started = run.started_ms / 1000 if run.sent else now
        if spec.max_per_minute is not None:
            # write j may go at started + 60 j / rate: claim those due within the next BATCH_SECONDS
            allowed = int((now + BATCH_SECONDS - started) * spec.max_per_minute / 60) + 1 - run.sent
            if allowed <= 0:
                return started + 60 * run.sent / spec.max_per_minute - now
            count = min(count, allowed)
        until_ms = int((now + self._batch_lease(spec)) * 1000)  # at most the lease the claim sets
        batch = (run.at, boundary if count == len(positions) else positions[count - 1] + 1)
        started_ms = int(started * 1000)
        self._jobs.update_run(spec.job_id, self.owner, sets={items.BATCH: batch, items.STARTED: started_ms},
                              adds={items.SENT: count}, conditions={items.AT: run.at},
                              absent=(items.BATCH, items.STOP), lease_seconds=self._batch_lease(spec))
        claimed = replace(run, batch=batch, started_ms=started_ms, sent=run.sent + count, until_ms=until_ms)
        return replace(head, run=claimed), pages

    def _read_batch(self, spec: JobSpec, run) -> list[Page]:
        """The pages of the claimed batch (one query)."""
        first, end = run.batch
        return self._jobs.pages(spec.job_id, first // PAGE_SIZE, (end - 1) // PAGE_SIZE)

    def _write_batch(self, head: Head, writes: JobWrites, pages: list[Page] | None = None) -> None:
        """Writes the claimed devices not recorded yet (each once: one written already answers
        with its version), records them on their pages (``pages``, when the caller read them),
        then moves the run past the batch once every one is known. The job's next target pages
        are found meanwhile, while fewer than two batches' worth would wait after this one."""
        spec, run = head.record.spec, head.run
        first, end = run.batch
        again = pages is None  # claimed at an earlier step, whose tries made some of it final unwritten
        pages = pages if pages is not None else self._read_batch(spec, run)
        entries = [(page, index, device_id) for page, index, device_id in _inside(pages, run.batch)
                   if not page.writes[index]]
        final = {}
        if spec.filter is None or again:  # final already: a listed device found missing at the start, one
            # an earlier try refused (a lease, a too large document): never written after its FAILED; or
            # one an earlier try wrote, its answer lost, that the stream judged since (written: counted so)
            final = self._jobs.finals(spec.job_id, [device_id for _, _, device_id in entries])
            entries = [entry for entry in entries if entry[2] not in final]
        sent_before = run.sent - sum(1 for _ in _inside(pages, run.batch))  # (a paced batch's are in a row)
        started = run.started_ms / 1000
        watch = StopWatch(self._stop_look(spec))
        # no write starts once the lease is about to lapse: another runner may take the job up then
        lease_end = run.until_ms / 1000 - self.lease_seconds / 3
        threading.Thread(target=watch.run, daemon=True).start()
        targeting = None
        wanted = 2 * _pages_per_batch(spec) - (run.pages - end // PAGE_SIZE)  # pages to find: two batches waiting
        if run.stop is None and not run.targeted and wanted > 0:
            targeting = threading.Thread(target=self._target_beside, args=(head, wanted, watch.finished), daemon=True)
            targeting.start()
        try:
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                outcomes = list(pool.map(
                    lambda entry: self._write_one(writes, spec, entry[2], started,
                                                  sent_before + entry[0].position(entry[1]) - first, watch,
                                                  lease_end), entries))
        finally:
            watch.finish()
            if targeting is not None:
                targeting.join()
        recorded, finals, unknown = {}, [], 0
        for (page, index, device_id), (outcome, written_ms) in zip(entries, outcomes):
            if outcome is not None and outcome.version:
                recorded[(page.number, index)] = items.pack_write(written_ms, outcome.version)
            elif outcome is not None and outcome.final is not None:
                finals.append(Final(device_id, outcome.final))
            else:
                unknown += 1
        self._record(spec, pages, recorded)
        if finals:
            self._finals.record(spec.job_id, items.retire_at(spec), finals)
        if unknown:  # written again at the next step (or found on the devices by a stop)
            self._jobs.update_run(spec.job_id, self.owner, lease_seconds=self._batch_lease(spec))
            return
        self._move_past(head, pages, recorded, sum(execution.written for execution in final.values()))

    def _record(self, spec: JobSpec, pages: list[Page], recorded: dict) -> None:
        """``recorded`` ((page number, index) -> packed write) on each page, the pages side by side."""
        def record(page):
            self._jobs.record_page(spec.job_id, page.number, {index: packed for (number, index), packed
                                                              in recorded.items() if number == page.number})

        with ThreadPoolExecutor(max_workers=len(pages) or 1) as pool:
            list(pool.map(record, pages))

    def _target_beside(self, head: Head, pages: int, finished: threading.Event) -> None:
        """Up to ``pages`` target pages found beside a batch's writes, none begun once they are
        ``finished``; whatever stops it, the next step finds on the run which pages were added,
        and targets again if it must."""
        try:
            wanted = head.run.pages + pages
            for _ in range(pages):  # each query's page adds some
                head = self._target_page(head)
                if head.run.targeted or head.run.pages >= wanted or finished.is_set():
                    return
        except Exception as error:  # noqa: BLE001 - the next step decides
            logger.warning("job %s: targeting beside the writes stopped (%s); the next step goes on",
                           head.record.spec.job_id, error)

    def _batch_lease(self, spec: JobSpec) -> float:
        """The lease a batch is written under: a paced one waits its turns."""
        return self.lease_seconds + (BATCH_SECONDS if spec.max_per_minute is not None else 0)

    def _move_past(self, head: Head, pages: list[Page], recorded: dict, final_written: int) -> None:
        """Moves the run past its batch, counting as written the devices recorded on their pages
        and ``final_written``, those found final and written (the stream judged them first)."""
        first, end = head.run.batch
        written = final_written + sum(1 for page, index, _ in _inside(pages, head.run.batch)
                                      if page.writes[index] or (page.number, index) in recorded)
        self._jobs.update_run(head.record.spec.job_id, self.owner, sets={items.AT: end, items.BATCH: None},
                              adds={items.WRITTEN: written}, conditions={items.BATCH: (first, end)},
                              lease_seconds=self.lease_seconds)

    def _write_one(self, writes: JobWrites, spec: JobSpec, device_id: str, started: float, number: int,
                   watch: "StopWatch", lease_end: float) -> tuple[Outcome | None, int]:
        """The device's write, no earlier than its turn in the rollout; None once a stop came,
        ``endsAt`` passed (the next step stops the job), or the lease is near ``lease_end`` (the next
        step renews it, or finds the job another's)."""
        if spec.max_per_minute is not None:
            turn = started + 60 * number / spec.max_per_minute
            while not watch.stopped.is_set() and self._runtime.clock() < turn:
                watch.stopped.wait(min(turn - self._runtime.clock(), STOP_POLL_SECONDS))
        now = self._runtime.clock()
        if watch.stopped.is_set() or now >= lease_end or now >= spec.ends_at:
            return None, 0
        watch.began_write()
        outcome = writes.write(device_id)
        return outcome, int(self._runtime.clock() * 1000)

    # ------------------------------------------------------------ sweeps

    def _in_progress(self, spec: JobSpec, page: Page, start: int, end: int,
                     due_by_ms: int | None = None) -> list[tuple[str, int, int]]:
        """(device, version, deadline ms) of the page's written, not final executions in
        [start, end), those whose deadline is ``due_by_ms`` or earlier when given."""
        written = [entry for entry in self._written(spec, page, start, end)
                   if due_by_ms is None or entry[3] <= due_by_ms]
        final = self._jobs.final_devices(spec.job_id, [device_id for _, device_id, _, _ in written])
        return [(device_id, version, deadline_ms) for _, device_id, version, deadline_ms in written
                if device_id not in final]

    @staticmethod
    def _written(spec: JobSpec, page: Page, start: int, end: int) -> list[tuple[int, str, int, int]]:
        """(position, device, version, deadline ms) of the page's written executions in [start, end)."""
        window_ms = spec.window_seconds * 1000
        written = []
        for index, device_id in enumerate(page.ids):
            if start <= page.position(index) < end and page.writes[index]:
                version, written_ms = items.unpack_write(page.writes[index])
                written.append((page.position(index), device_id, version, written_ms + window_ms))
        return written

    def _sweep(self, head: Head) -> bool:
        """Makes final the written executions whose deadline passed, in write order; True when
        it moved."""
        spec, run = head.record.spec, head.run
        if run.sweep >= run.at:
            return False
        now = self._runtime.clock()
        now_ms, window_ms = int(now * 1000), spec.window_seconds * 1000
        page = self._jobs.page(spec.job_id, run.sweep // PAGE_SIZE)
        end = min((run.sweep // PAGE_SIZE + 1) * PAGE_SIZE, run.at)
        reached = end
        if page is not None:
            for index, packed in enumerate(page.writes):
                position = page.position(index)
                if run.sweep <= position < end and packed and items.unpack_write(packed)[1] + window_ms > now_ms:
                    reached = position  # deadlines follow the write order: the rest are later still
                    break
            due = self._in_progress(spec, page, run.sweep, reached, now_ms)
            states = self._store.batch_get_states([device_id for device_id, _, _ in due]) if due else {}
            finals = [Final(device_id, verdict, version, True) for device_id, version, deadline_ms in due
                      if (verdict := judge(spec.leaves, version, deadline_ms, states.get(device_id), now))]
            self._finals.record(spec.job_id, items.retire_at(spec), finals)
        if reached == run.sweep:
            return False
        self._jobs.update_run(spec.job_id, self.owner, sets={items.SWEEP: reached}, lease_seconds=self.lease_seconds)
        return True

    def _sweep_due(self) -> bool:
        now = self._runtime.monotonic()
        if self._swept_at is not None and now - self._swept_at < SWEEP_EVERY_SECONDS:
            return False
        self._swept_at = now
        return True

    def _next_deadline(self, head: Head) -> int | None:
        """The deadline of the first written execution not swept yet."""
        spec, run = head.record.spec, head.run
        if run.sweep >= run.at:
            return None
        page = self._jobs.page(spec.job_id, run.sweep // PAGE_SIZE)
        for index, packed in enumerate(page.writes if page else ()):
            if page.position(index) >= run.sweep and packed:
                return items.unpack_write(packed)[1] + spec.window_seconds * 1000
        return int(self._runtime.clock() * 1000)  # unwritten entries to pass over: at once


def _pages_per_batch(spec: JobSpec) -> int:
    """The target pages a batch may take: one where writes must be counted out (a rollout) or
    their outcomes judged as they come (abort criteria, checked between batches)."""
    return 1 if spec.max_per_minute is not None or spec.abort else BATCH_PAGES


def _inside(pages: list[Page], batch: tuple[int, int]):
    """(page, index, device id) of each of ``pages``' devices whose position is in ``batch``."""
    first, end = batch
    for page in pages:
        for index, device_id in enumerate(page.ids):
            if first <= page.position(index) < end:
                yield page, index, device_id


def _removal(leaves: dict, desired: dict) -> MergePatch:
    """The merge patch that removes ``leaves`` (pointers) from ``desired``, and the objects that
    leaves empty: nulls at the leaves alone would leave ``{"fan": {}}`` where the job set
    fan/speed, an empty object being a leaf of its own that the delta would ask for."""
    return MergePatch(_merge_diff(desired, without_leaves(desired, leaves)))


def _merge_diff(before: dict, after: dict) -> dict:
    """The merge patch from ``before`` to ``after``, where ``after`` only lacks members of ``before``."""
    return {key: None if key not in after else _merge_diff(value, after[key])
            for key, value in before.items() if key not in after or (isinstance(value, dict) and value != after[key])}


STUCK_AFTER_MS = 5 * 60 * 1000  # a job due this long with no runner at it is stuck


@dataclass(frozen=True)
class Due:
    """What the schedule found: the jobs a runner should take now, and the executions (queued
    or in progress) of those due longer than ``STUCK_AFTER_MS``: stuck, since no runner came."""

    job_ids: tuple[str, ...]
    stuck_executions: int


def due_jobs(jobs: JobStore, now: float) -> Due:
    """The open jobs due now (``Head.due``): what the deployed schedule wakes, and what
    ``make serve``'s runner loop runs."""
    now_ms = int(now * 1000)
    found, stuck = [], 0
    for job_id in jobs.open_jobs():
        head = jobs.head(job_id)
        if head is None or not head.due(now_ms):
            continue
        found.append(job_id)
        if head.overdue_ms(now_ms) > STUCK_AFTER_MS:
            counts = head.counts_by_state
            stuck += counts[QUEUED] + counts[IN_PROGRESS]
    return Due(tuple(found), stuck)
