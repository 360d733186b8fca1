"""A job's desired write to one device: planned by the one planner as the job's write
(``PlanContext.job``, so its mark goes in the same request and the device gets it at most
once), sent and settled by the one pipeline. Read-free (a compiled merge patch: one write, like
a plain desired write) when the job sets no options and the patch compiles; otherwise, or when
DynamoDB refuses the compiled form, read-modify-write at the device's version, as any such
desired write. What came of it is one of: written (now or before: the version it made), a final
state at once (the device is gone, or refuses the write), or nothing yet (try again later)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import (
    ConditionFailed,
    DeviceLocked,
    DeviceNotFound,
    InvalidValue,
    ItemTooLarge,
    JobAlreadyWritten,
    LeaseNotHeld,
    OutcomeUnknown,
    RequestRefused,
    RetriesExhausted,
    StorageUnavailable,
    TooManyJobs,
)
from ..item.job_marks import JobMark
from ..model.patches import MergePatch
from ..model.sections import DESIRED
from ..write.compiled import compile_patch
from ..write.outcomes import Moved
from ..write.pipeline import WritePipeline
from ..write.plan import UPDATED, expect
from ..write.retry import RetryLoop
from .executions import Verdict
from .spec import FAILED, REMOVED, JobSpec

ATTEMPTS, BUDGET_SECONDS = 8, 5.0  # while other writers move the device


@dataclass(frozen=True)
class Outcome:
    """``version`` > 0: the job's write is on the device at that version; ``final``: the
    execution's final state, reached without a write; neither: not known yet (try again)."""

    version: int = 0
    final: Verdict | None = None


class JobWrites:
    """Writes one job's desired patch to its devices."""

    def __init__(self, pipeline: WritePipeline, spec: JobSpec):
        self._pipeline = pipeline
        self._spec = spec
        self._mark = JobMark(spec.job_id, spec.window_seconds)
        self._patch = MergePatch(spec.desired)
        self._compiled = None if spec.options else compile_patch(self._patch, DESIRED)

    def write(self, device_id: str) -> Outcome:
        runtime = self._pipeline.runtime
        try:
            refused = self._compiled_write(device_id)
            if isinstance(refused, Outcome):
                return refused
            first = [refused] if refused is not None else []  # the refused write's item stands for a first read
            return RetryLoop(ATTEMPTS, BUDGET_SECONDS, runtime).run(
                device_id, lambda current, _number: self._read_modify_write(device_id, current),
                lambda: first.pop() if first else self._pipeline.store.get_state(device_id), count_success=False)
        except JobAlreadyWritten as written:
            return Outcome(written.version)
        except DeviceNotFound:
            return Outcome(final=Verdict(REMOVED, int(runtime.clock() * 1000)))
        except TooManyJobs as refused:
            return self._failed(409, f"too-many-jobs: {refused}")
        except (DeviceLocked, LeaseNotHeld) as refused:
            return self._failed(423, f"device-locked: {refused}")
        except ItemTooLarge as refused:
            return self._failed(413, f"item-too-large: {refused}")
        except InvalidValue as refused:
            return self._failed(400, f"{refused.limit}: {refused}")
        except (RetriesExhausted, OutcomeUnknown, StorageUnavailable):
            return Outcome()

    def _compiled_write(self, device_id: str):
        """The read-free write: its ``Outcome``, or the item to read-modify-write from (None:
        read it) when it is not for a compiled write."""
        if self._compiled is None:
            return None
        planner = self._pipeline.planner(job=self._mark)
        planned = planner.compiled(device_id, self._compiled, None, DESIRED)
        if planned is None:
            return None
        try:
            return Outcome(self._pipeline.send(planner, planned).version)
        except Moved as moved:  # no job marks yet, a parent not an object, ...: read-modify-write decides
            return moved.item
        except (ConditionFailed, RequestRefused, ItemTooLarge):
            return None

    def _read_modify_write(self, device_id: str, item: dict | None) -> Outcome:
        planner = self._pipeline.planner(job=self._mark)
        planned = planner.replace_state(expect(device_id, item, None, planner.now), self._patch, None, UPDATED,
                                        DESIRED, self._spec.options)
        return Outcome(self._pipeline.send(planner, planned).version)

    def _failed(self, code: int, reason: str) -> Outcome:
        return Outcome(final=Verdict(FAILED, int(self._pipeline.runtime.clock() * 1000), code, reason[:256]))
