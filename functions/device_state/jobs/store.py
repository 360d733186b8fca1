"""A job's items on the table, read and written (``items`` names them): the job created whole in
one transaction, its head (job, run, counters) read in one query, the runner's lease and every
change of the run item on condition that the caller holds it, target pages, executions, stops.
Sends through the one pipeline's store (these are no device's state items)."""

from __future__ import annotations

import uuid
from dataclasses import replace

from ..errors import ConditionNotMet, DeviceStateError, JobEnded, JobExists, JobNotFound
from ..item import schema
from ..write.expressions import Expression
from ..write.outcomes import Refusals
from ..write.pipeline import WritePipeline
from ..model.values import dumps
from ..write.store import IDEMPOTENT, ONCE
from . import items
from .items import PAGE_SIZE, Execution, Head, JobRecord, Page
from .spec import ABORTED, CANCELED, COMPLETED, IN_PROGRESS, JobSpec

MAX_PAGES_AT_CREATE = 10  # a listed job's pages (MAX_DEVICE_IDS / PAGE_SIZE) go in its creating transaction


class RunLost(DeviceStateError):
    """The caller no longer holds the job's runner lease (another runner took it): it stops."""

    def __init__(self, job_id: str):
        super().__init__(f"the runner of job {job_id!r} lost its lease")
        self.job_id = job_id


def _attribute(value) -> dict:
    if value is True:
        return {"BOOL": True}
    if isinstance(value, int):
        return {"N": str(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, tuple):
        return {"L": [{"N": str(entry)} for entry in value]}
    raise TypeError(f"no attribute for {value!r}")


class JobStore:
    def __init__(self, pipeline: WritePipeline):
        self._pipeline = pipeline
        self._store = pipeline.store
        self._runtime = pipeline.runtime

    @property
    def table(self) -> str:
        return self._store.table_name

    # ------------------------------------------------------------ create

    def create(self, spec: JobSpec, key_entry: dict | None = None) -> Head:
        """The job, its run, its listing and open entries, a listed job's target pages and the
        entry of the Idempotency-Key it was created with (``key_entry``, put only while absent: a
        refusal names the part "key"), in one transaction (its token makes a resend after a lost
        answer safe); returns the head it wrote. ``JobExists`` when a job of that id exists."""
        created_ms = round(spec.created_at * 1000)
        expires = items.retire_at(spec)
        ids = list(spec.device_ids)
        pages = [Page(number, tuple(ids[start:start + PAGE_SIZE]), (0,) * len(ids[start:start + PAGE_SIZE]))
                 for number, start in enumerate(range(0, len(ids), PAGE_SIZE))]
        if len(pages) > MAX_PAGES_AT_CREATE:
            raise ValueError("too many device ids for one job")
        run = {**items.run_key(spec.job_id), items.PAGES: {"N": str(len(pages))}, items.TOTAL: {"N": str(len(ids))},
               **{name: {"N": "0"} for name in (items.AT, items.SENT, items.WRITTEN, items.SWEEP)},
               schema.TTL_ATTRIBUTE: {"N": str(expires)}}
        if spec.filter is None:
            run[items.TARGETED] = {"BOOL": True}
        listing = {**items.key(items.LISTING_PARTITION, items.listing_sort_key(created_ms, spec.job_id)),
                   items.JOB_ID: {"S": spec.job_id}, items.STATUS: {"S": IN_PROGRESS},
                   schema.TTL_ATTRIBUTE: {"N": str(expires)}}
        expr = Expression()
        absent = f"attribute_not_exists({expr.name(schema.PARTITION_KEY)})"
        parts = {"job": [{"Put": {"TableName": self.table, "Item": JobRecord(spec, IN_PROGRESS).item(),
                                  "ConditionExpression": absent, **expr.attributes()}}],
                 "run": [{"Put": {"TableName": self.table, "Item": run}}],
                 "listing": [{"Put": {"TableName": self.table, "Item": listing}}],
                 "open": [{"Put": {"TableName": self.table, "Item": {
                     **items.open_key(spec.job_id), schema.TTL_ATTRIBUTE: {"N": str(expires)}}}}],
                 "pages": [{"Put": {"TableName": self.table, "Item": page.item(spec.job_id, expires)}}
                           for page in pages]}
        parts.update(self._key_part(key_entry))
        try:
            self._pipeline.send_together(self._pipeline.planner(), [], parts, uuid.uuid4().hex)
        except Refusals as refused:
            if "job" in refused.refused and "key" not in refused.refused:
                raise JobExists(spec.job_id) from None
            raise
        return Head.from_items([parts["job"][0]["Put"]["Item"], run])

    def _key_part(self, key_entry: dict | None) -> dict:
        """The part "key" of a keyed write's transaction: the Idempotency-Key's entry, put only
        while none is there (or it lapsed)."""
        if key_entry is None:
            return {}
        expr = Expression()
        lapsed = f"{expr.name(schema.TTL_ATTRIBUTE)} <= {expr.number(int(self._runtime.clock()))}"
        return {"key": [{"Put": {"TableName": self.table, "Item": key_entry,
                                 "ConditionExpression": f"attribute_not_exists({expr.name(schema.PARTITION_KEY)})"
                                                        f" OR {lapsed}", **expr.attributes()}}]}

    # ------------------------------------------------------------- reads

    def head(self, job_id: str) -> Head | None:
        """The job, its run and its counters (one query), or None when there is no such job."""
        expr = Expression()
        found = self._store.query_all({
            "KeyConditionExpression": f"{expr.name(schema.PARTITION_KEY)} = "
                                      f"{expr.value({'S': items.job_partition(job_id)})} AND "
                                      f"{expr.name(schema.SORT_KEY)} < {expr.value({'S': items.HEAD_END})}",
            "ConsistentRead": True, **expr.attributes()})
        return Head.from_items(found)

    def run(self, job_id: str) -> items.RunState:
        """The job's run item alone (one strongly consistent read of a small item): whether it was
        stopped, and who holds it. An absent one reads as a run no one holds."""
        return items.RunState.from_item(self._store.get(items.run_key(job_id)))

    def pages(self, job_id: str, first: int, last: int) -> list[Page]:
        if last < first:
            return []
        expr = Expression()
        found = self._store.query_all({
            "KeyConditionExpression": f"{expr.name(schema.PARTITION_KEY)} = "
                                      f"{expr.value({'S': items.job_partition(job_id)})} AND "
                                      f"{expr.name(schema.SORT_KEY)} BETWEEN "
                                      f"{expr.value({'S': items.page_key(job_id, first)[schema.SORT_KEY]['S']})} AND "
                                      f"{expr.value({'S': items.page_key(job_id, last)[schema.SORT_KEY]['S']})}",
            "ConsistentRead": True, **expr.attributes()})
        return [Page.from_item(item) for item in found]

    def page(self, job_id: str, number: int) -> Page | None:
        found = self.pages(job_id, number, number)
        return found[0] if found else None

    def final_devices(self, job_id: str, device_ids: list[str]) -> set[str]:
        """Those of ``device_ids`` whose execution is final (an execution item exists)."""
        return set(self.final_states(job_id, device_ids))

    def final_states(self, job_id: str, device_ids: list[str]) -> dict[str, str]:
        """The final state of each of ``device_ids`` whose execution is final."""
        return {device_id: execution.state for device_id, execution in self.finals(job_id, device_ids).items()}

    def finals(self, job_id: str, device_ids: list[str]) -> dict[str, Execution]:
        """The execution of each of ``device_ids`` whose execution is final."""
        final = {}
        for start in range(0, len(device_ids), 100):
            keys = [items.execution_key(job_id, device_id) for device_id in device_ids[start:start + 100]]
            final.update((execution.device_id, execution)
                         for execution in map(Execution.from_item, self._store.batch_get(keys).values()))
        return final

    def executions(self, job_id: str) -> list[Execution]:
        """Every final execution of the job."""
        expr = Expression()
        found = self._store.query_all({
            "KeyConditionExpression": f"{expr.name(schema.PARTITION_KEY)} = "
                                      f"{expr.value({'S': items.job_partition(job_id)})} AND "
                                      f"begins_with({expr.name(schema.SORT_KEY)}, "
                                      f"{expr.value({'S': items.EXECUTION_PREFIX})})",
            "ConsistentRead": True, **expr.attributes()})
        return [Execution.from_item(item) for item in found]

    def open_jobs(self) -> list[str]:
        """The ids of the jobs not complete yet (their open entries)."""
        expr = Expression()
        found = self._store.query_all({
            "KeyConditionExpression": f"{expr.name(schema.PARTITION_KEY)} = "
                                      f"{expr.value({'S': items.OPEN_PARTITION})}",
            "ConsistentRead": True, **expr.attributes()})
        return [item[schema.SORT_KEY]["S"] for item in found]

    # ------------------------------------------------------------- lease

    def take_lease(self, job_id: str, owner: str, seconds: float) -> bool:
        """The runner lease, when it is free, lapsed, or ``owner``'s already."""
        now_ms = int(self._runtime.clock() * 1000)
        expr = Expression()
        owner_name, until = expr.name(items.OWNER), expr.name(items.UNTIL)
        me = expr.value({"S": owner})
        try:
            self._store.send(
                "update_item", IDEMPOTENT, Key=items.run_key(job_id),
                UpdateExpression=f"SET {owner_name} = {me}, {until} = {expr.number(now_ms + int(seconds * 1000))}",
                ConditionExpression=f"attribute_exists({expr.name(schema.PARTITION_KEY)}) AND "
                                    f"(attribute_not_exists({owner_name}) OR {until} < {expr.number(now_ms)} "
                                    f"OR {owner_name} = {me})", **expr.attributes())
            return True
        except ConditionNotMet:
            return False

    def release_lease(self, job_id: str, owner: str) -> None:
        expr = Expression()
        owner_name = expr.name(items.OWNER)
        try:
            self._store.send("update_item", IDEMPOTENT, Key=items.run_key(job_id),
                             UpdateExpression=f"REMOVE {owner_name}, {expr.name(items.UNTIL)}",
                             ConditionExpression=f"{owner_name} = {expr.value({'S': owner})}", **expr.attributes())
        except ConditionNotMet:
            pass

    def update_run(self, job_id: str, owner: str, sets: dict | None = None, adds: dict | None = None,
                   conditions: dict | None = None, absent: tuple = (), lease_seconds: float | None = None) -> None:
        """Changes the run item while ``owner`` holds its lease: ``sets`` (None: removes),
        ``adds`` (numbers), on condition that each of ``conditions`` holds its value and each of
        ``absent`` is absent. A resend after a lost answer is the caller's to judge (it re-reads):
        ``RunLost`` when the lease is another's, ``ConditionNotMet`` when another condition fails."""
        expr = Expression()
        sets = dict(sets or {})
        if lease_seconds is not None:
            sets[items.UNTIL] = int((self._runtime.clock() + lease_seconds) * 1000)
        set_parts = [f"{expr.name(name)} = {expr.value(_attribute(value))}" for name, value in sets.items()
                     if value is not None]
        removes = [expr.name(name) for name, value in sets.items() if value is None]
        update = ""
        if set_parts:
            update += "SET " + ", ".join(set_parts)
        if adds:
            update += " ADD " + ", ".join(f"{expr.name(name)} {expr.number(value)}" for name, value in adds.items())
        if removes:
            update += " REMOVE " + ", ".join(removes)
        checks = [f"{expr.name(items.OWNER)} = {expr.value({'S': owner})}"]
        checks += [f"{expr.name(name)} = {expr.value(_attribute(value))}" for name, value in (conditions or {}).items()]
        checks += [f"attribute_not_exists({expr.name(name)})" for name in absent]
        try:
            self._store.send("update_item", ONCE, Key=items.run_key(job_id), UpdateExpression=update.strip(),
                             ConditionExpression=" AND ".join(checks), ReturnValuesOnConditionCheckFailure="ALL_OLD",
                             **expr.attributes())
        except ConditionNotMet as refused:
            if (refused.item or {}).get(items.OWNER, {}).get("S") != owner:
                raise RunLost(job_id) from None
            raise

    # ------------------------------------------------------------- pages

    def add_pages(self, job_id: str, owner: str, number: int, ids: list[str], cursor: str | None,
                  expires: int) -> int:
        """Target pages of ``ids``, ``PAGE_SIZE`` each (none: only the cursor moves), and the run's
        count of them, in one transaction, while ``owner`` holds the lease, targeting is on, no
        stop was asked and ``number`` pages exist (a resend or a second runner's copy is refused);
        how many pages."""
        chunks = [ids[start:start + PAGE_SIZE] for start in range(0, len(ids), PAGE_SIZE)]
        expr = Expression()
        sets = [f"{expr.name(items.QUERY_CURSOR)} = {expr.value({'S': cursor})}" if cursor else None]
        removes = [] if cursor else [expr.name(items.QUERY_CURSOR)]
        if cursor is None:
            sets.append(f"{expr.name(items.TARGETED)} = {expr.value({'BOOL': True})}")
        if chunks:
            sets.append(f"{expr.name(items.PAGES)} = {expr.number(number + len(chunks))}")
        update = "SET " + ", ".join(part for part in sets if part) if any(sets) else ""
        if ids:
            update += f" ADD {expr.name(items.TOTAL)} {expr.number(len(ids))}"
        if removes:
            update += " REMOVE " + ", ".join(removes)
        run = {"Update": {
            "TableName": self.table, "Key": items.run_key(job_id), "UpdateExpression": update.strip(),
            "ConditionExpression": f"{expr.name(items.OWNER)} = {expr.value({'S': owner})} AND "
                                   f"{expr.name(items.PAGES)} = {expr.number(number)} AND "
                                   f"attribute_not_exists({expr.name(items.STOP)}) AND "
                                   f"attribute_not_exists({expr.name(items.TARGETED)})", **expr.attributes()}}
        parts = {"run": [run]}
        if chunks:
            parts["page"] = [{"Put": {"TableName": self.table, "Item": Page(
                number + offset, tuple(chunk), (0,) * len(chunk)).item(job_id, expires)}}
                for offset, chunk in enumerate(chunks)]
        try:
            self._pipeline.send_together(self._pipeline.planner(), [], parts, uuid.uuid4().hex)
        except Refusals as refused:
            if "run" in refused.refused:
                raise RunLost(job_id) from None
            raise
        return len(chunks)

    def record_page(self, job_id: str, number: int, recorded: dict[int, int]) -> None:
        """What the job's writes made of a page's devices (index -> packed version and time).
        The same record sent twice is the same: each device's version is its mark's."""
        if not recorded:
            return
        expr = Expression()
        writes = expr.name(items.WRITES)
        self._store.send("update_item", IDEMPOTENT, Key=items.page_key(job_id, number),
                         UpdateExpression="SET " + ", ".join(f"{writes}[{index}] = {expr.number(packed)}"
                                                             for index, packed in sorted(recorded.items())),
                         ConditionExpression=f"attribute_exists({expr.name(schema.PARTITION_KEY)})",
                         **expr.attributes())

    # ------------------------------------------------------------- stops

    def stop(self, job_id: str, reason: str, status: str | None = None, force: bool = False,
             aborted_by: dict | None = None, key_entry: dict | None = None) -> Head:
        """Asks the runner to stop queuing (``reason``: cancel, abort, end); ``status``: the job's
        new status (CANCELED, ABORTED), in the same transaction, only while it is IN_PROGRESS
        (``JobEnded`` otherwise; ``JobNotFound`` when there is no job). A forced cancel of a job
        canceled or aborted already, not yet completed, adds the force (an aborted one stays
        ABORTED). ``key_entry``: the entry of the Idempotency-Key it was asked with, in the same
        transaction (``Refusals`` naming "key" when one is there). Returns the head read before,
        with what the write changed."""
        head = self.head(job_id)
        if head is None:
            raise JobNotFound(job_id)
        expr = Expression()
        run_sets = [f"{expr.name(items.STOP)} = if_not_exists({expr.name(items.STOP)}, {expr.value({'S': reason})})"]
        if force:
            run_sets.append(f"{expr.name(items.FORCE)} = {expr.value({'BOOL': True})}")
        parts = {"run": [{"Update": {"TableName": self.table, "Key": items.run_key(job_id),
                                     "UpdateExpression": "SET " + ", ".join(run_sets), **expr.attributes()}}]}
        if force and status == CANCELED and head.record.status == ABORTED:
            status = ABORTED  # its leaves still in progress may be taken back too; it stays aborted
        if status is not None:
            record, expr = head.record, Expression()
            sets = [f"{expr.name(items.STATUS)} = {expr.value({'S': status})}"]
            if aborted_by is not None:
                sets.append(f"{expr.name(items.ABORTED_BY)} = {expr.value({'S': dumps(aborted_by)})}")
            allowed = {CANCELED: (IN_PROGRESS, CANCELED), ABORTED: (ABORTED,)}[status] if force else (IN_PROGRESS,)
            condition = " OR ".join(f"{expr.name(items.STATUS)} = {expr.value({'S': one})}" for one in allowed)
            parts["job"] = [{"Update": {"TableName": self.table, "Key": items.job_key(job_id),
                                        "UpdateExpression": "SET " + ", ".join(sets),
                                        "ConditionExpression": f"attribute_not_exists({expr.name(items.COMPLETED_MS)})"
                                                               f" AND ({condition})", **expr.attributes()}}]
            parts["listing"] = [self._listing_status(record, status)]
        parts.update(self._key_part(key_entry))
        try:
            self._pipeline.send_together(self._pipeline.planner(), [], parts, uuid.uuid4().hex)
        except Refusals as refused:
            if "job" in refused.refused and "key" not in refused.refused:
                current = self.head(job_id)
                raise JobEnded(job_id, current.record.status if current else status) from None
            raise
        record = head.record if status is None else replace(head.record, status=status, aborted_by=aborted_by or head.record.aborted_by)
        return replace(head, record=record, run=replace(head.run, stop=head.run.stop or reason,
                                                        force=head.run.force or force))

    def _listing_status(self, record: JobRecord, status: str) -> dict:
        expr = Expression()
        created_ms = round(record.spec.created_at * 1000)
        return {"Update": {"TableName": self.table,
                           "Key": items.key(items.LISTING_PARTITION,
                                            items.listing_sort_key(created_ms, record.spec.job_id)),
                           "UpdateExpression": f"SET {expr.name(items.STATUS)} = {expr.value({'S': status})}",
                           **expr.attributes()}}

    def complete(self, head: Head) -> None:
        """The job ends: its completion time, COMPLETED unless it was canceled or aborted, its
        listing, and its open entry gone, in one transaction (a second copy is refused: done)."""
        record = head.record
        status = COMPLETED if record.status == IN_PROGRESS else record.status
        now_ms = int(self._runtime.clock() * 1000)
        expr = Expression()
        job = {"Update": {"TableName": self.table, "Key": items.job_key(record.spec.job_id),
                          "UpdateExpression": f"SET {expr.name(items.STATUS)} = {expr.value({'S': status})}, "
                                              f"{expr.name(items.COMPLETED_MS)} = {expr.number(now_ms)}",
                          "ConditionExpression": f"attribute_not_exists({expr.name(items.COMPLETED_MS)}) AND "
                                                 f"{expr.name(items.STATUS)} = {expr.value({'S': record.status})}",
                          **expr.attributes()}}
        parts = {"job": [job], "listing": [self._listing_status(record, status)],
                 "open": [{"Delete": {"TableName": self.table, "Key": items.open_key(record.spec.job_id)}}]}
        try:
            self._pipeline.send_together(self._pipeline.planner(), [], parts, uuid.uuid4().hex)
        except Refusals as refused:
            if "job" not in refused.refused:
                raise


__all__ = ["JobStore", "RunLost", "ABORTED", "CANCELED"]
