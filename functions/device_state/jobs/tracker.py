"""The stream processor's part of jobs: executions move from what the device already does, with
no read of the device. For each state item change (old and new images), every job mark the item
holds is judged on both images (``executions.judge``); an execution in progress before the change
and final after it (the device confirmed, refused, another writer set a leaf, the device was
deleted) is collected, and ``flush`` writes a batch's collected finals with the job's counts, in
one transaction per job (``finals``): a record delivered again, or judged again by the runner's
sweep, is refused there as final already and dropped, so a count moves exactly once.

A job's spec is read once per container (a job's spec never changes)."""

from __future__ import annotations

from collections import defaultdict

from ..item import job_marks, schema
from ..write.pipeline import WritePipeline
from . import items
from .executions import judge
from .finals import Final, Finals
from .items import JobRecord
from .spec import JobSpec


class JobTracker:
    def __init__(self, pipeline: WritePipeline, finals: Finals | None = None):
        self._pipeline = pipeline
        self._finals = finals or Finals(pipeline)
        self._specs: dict[str, JobSpec | None] = {}
        self._pending: dict[str, dict[str, Final]] = defaultdict(dict)

    def see(self, old: dict | None, new: dict | None) -> int:
        """Judges one change of a state item; returns how many executions it made final."""
        now = self._pipeline.runtime.clock()
        marks = job_marks.marks(new) if schema.is_live_state(new, now) else job_marks.marks(old)
        found = 0
        for job_id, packed in marks.items():
            version, deadline_ms = job_marks.unpack(packed)
            spec = self._spec(job_id)
            if spec is None:
                continue
            before = judge(spec.leaves, version, deadline_ms, old, now) if job_marks.mark_of(old, job_id) else None
            if before is not None:  # final already: an earlier change made it so
                continue
            after = judge(spec.leaves, version, deadline_ms, new, now)
            if after is None:
                continue
            device_id = schema.StateItem.of(new or old).device_id
            self._pending[job_id].setdefault(device_id, Final(device_id, after, version, True))
            found += 1
        return found

    def flush(self) -> int:
        """Writes the collected finals (``StorageUnavailable`` when they could not be: the batch
        is delivered again, and nothing is counted twice); how many were written now."""
        written = 0
        for job_id in list(self._pending):
            finals = list(self._pending[job_id].values())
            written += len(self._finals.record(job_id, items.retire_at(self._specs[job_id]), finals))
            del self._pending[job_id]
        return written

    def _spec(self, job_id: str) -> JobSpec | None:
        if job_id not in self._specs:
            item = self._pipeline.store.get(items.job_key(job_id))
            self._specs[job_id] = JobRecord.from_item(item).spec if item else None
        return self._specs[job_id]
