"""Job marks on a device's state item: which jobs' desired writes reached the device.

``jobs`` (``schema.JOB_MARKS``) maps a job's id to one number packing the device version the job's write made
and the execution's deadline (epoch milliseconds): ``deadline_ms * VERSION_SPAN + version``,
so a compiled write, which reads nothing, can set it as ``#version + :packed`` (as it sets a
leaf's metadata). A job's write requires its id absent from the map (``JobMark``): the device
gets each job's write at most once, whatever is lost or sent again. A mark is kept until
``GRACE_SECONDS`` after its deadline (by then the execution is final: the job's sweep finalizes
what its device never confirmed); every write that reads the item drops the marks past that
(the planner: ``write.versioned``). At most ``MAX_JOB_MARKS`` are kept: a job's write to a
device holding that many is refused (``TooManyJobs``). All pure."""

from __future__ import annotations

from dataclasses import dataclass

from ..model.sections import VERSION_SPAN
from ..model.values import item_size
from . import schema

MAX_JOB_MARKS = 10  # jobs whose executions a device may be in at once
GRACE_SECONDS = 24 * 60 * 60  # a mark outlives its execution's deadline by this, for the job's sweep


def pack(deadline_ms: int, version: int) -> int:
    return deadline_ms * VERSION_SPAN + version


def unpack(packed) -> tuple[int, int]:
    """(version, deadline in epoch milliseconds) of a stored mark."""
    deadline_ms, version = divmod(int(packed), VERSION_SPAN)
    return version, deadline_ms


def marks(item: dict | None) -> dict[str, int]:
    """Every mark the raw item holds: job id -> packed mark."""
    value = (item or {}).get(schema.JOB_MARKS)
    return {job_id: int(entry["N"]) for job_id, entry in value["M"].items()} if value and "M" in value else {}


def kept(item: dict | None, now: float) -> dict[str, int]:
    """The marks a write at ``now`` keeps: those whose deadline passed less than ``GRACE_SECONDS`` ago."""
    now_ms = int(now * 1000)
    return {job_id: packed for job_id, packed in marks(item).items()
            if unpack(packed)[1] + GRACE_SECONDS * 1000 > now_ms}


def mark_of(item: dict | None, job_id: str) -> tuple[int, int] | None:
    """(version, deadline ms) of the job's mark on the raw item, or None."""
    packed = marks(item).get(job_id)
    return unpack(packed) if packed is not None else None


def mark_bytes(job_id: str) -> int:
    """What one mark adds to the item, at its largest (a 38-digit number)."""
    return 1 + item_size({job_id: {"N": "9" * 38}})


@dataclass(frozen=True)
class JobMark:
    """The job a write is made for (``PlanContext.job``): its id and how long after the write
    its execution is tracked (``window_seconds``: the deadline is the write's time plus it)."""

    job_id: str
    window_seconds: int

    def deadline_ms(self, now: float) -> int:
        return int(now * 1000) + self.window_seconds * 1000

    def packed(self, now: float, version: int) -> int:
        return pack(self.deadline_ms(now), version)
