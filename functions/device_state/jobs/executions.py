"""An execution's state, judged from the device's state item alone: no read of the device
beyond what the stream (or a sweep) already holds. All pure.

The job's write set its leaves at ``version`` (the device's mark). Then, looking at the item:

- the device is gone (deleted, or never there): ``REMOVED``;
- the device acknowledged one of the job's leaves with a code of 400 or more (the leaf's status
  at ``version``): ``FAILED``, with that code and reason;
- another write set one of the job's leaves (its metadata names a later version), to any value,
  or removed it: ``SUPERSEDED`` (the job no longer owns the outcome);
- reported holds every leaf's value, set at or after ``version`` (or the leaf left desired as
  clear on confirm does, its confirmation kept): ``SUCCEEDED``;
- whichever of these happened first, by the times the item records; one that happened after the
  execution's deadline, or none by then: ``TIMED_OUT``;
- otherwise it is still ``IN_PROGRESS`` (``judge`` answers None).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..item import schema
from ..model import desires
from ..model.device import Device
from ..model.times import epoch_of
from ..model.sections import DESIRED, REPORTED, VERSION_SPAN, leaf_entries, leaves, same_value, version_of
from .spec import FAILED, REMOVED, SUCCEEDED, SUPERSEDED, TIMED_OUT


@dataclass(frozen=True)
class Verdict:
    """A final state, when it was reached (epoch ms), and a failure's code and reason."""

    state: str
    at_ms: int
    code: int | None = None
    reason: str | None = None


def _time_ms(packed) -> int:
    return int(packed) // VERSION_SPAN


def judge(job_leaves: dict, version: int, deadline_ms: int, item: dict | None, now: float) -> Verdict | None:
    """The final state of the execution whose write made ``version`` on this device, as the
    raw state ``item`` shows it at ``now``; None while it is in progress."""
    now_ms = int(now * 1000)
    if not schema.is_live_state(item, now):
        return _by_deadline(Verdict(REMOVED, now_ms), deadline_ms, now_ms)
    device = Device.from_item(item)
    desired_entries = leaf_entries(device.desired, device.entries.get(DESIRED, {}))
    reported_entries = leaf_entries(device.reported, device.entries.get(REPORTED, {}))
    reported_values = leaves(device.reported)
    statuses = desires.current(device.desired, device.entries)
    cleared = desires.cleared(device.desired, device.entries)
    ended: list[Verdict] = []  # failures and supersessions, each at its time
    confirmed_at = []
    for pointer, value in job_leaves.items():
        if pointer not in desired_entries:
            done = cleared.get(pointer)
            if done is not None and int(done.get("v", 0)) == version:  # cleared on confirm: confirmed
                confirmed_at.append(_time_ms(reported_entries[pointer]) if pointer in reported_entries else now_ms)
            else:  # another write removed it: at the latest, when the item was last written
                ended.append(Verdict(SUPERSEDED, int(epoch_of(device.updated_at) * 1000)))
            continue
        entry = desired_entries[pointer]
        if version_of(entry) != version:
            ended.append(Verdict(SUPERSEDED, _time_ms(entry)))
            continue
        status = statuses.get(pointer)
        if status is not None and desires.is_refused(status):
            ended.append(Verdict(FAILED, int(status.get("t", now_ms)), int(status["a"]), status.get("r")))
        if pointer in reported_values and same_value(value, reported_values[pointer]) \
                and version_of(reported_entries[pointer]) >= version:
            confirmed_at.append(_time_ms(reported_entries[pointer]))
    first = min(ended, key=lambda verdict: (verdict.at_ms, verdict.state != FAILED), default=None)
    if len(confirmed_at) == len(job_leaves) and (first is None or max(confirmed_at) < first.at_ms):
        first = Verdict(SUCCEEDED, max(confirmed_at))
    return _by_deadline(first, deadline_ms, now_ms)


def owns_leaves(job_leaves: dict, version: int, item: dict | None, now: float) -> bool:
    """Whether every leaf the job's write set (at ``version``) is still in desired as it set it:
    the device is there and no other write set or removed one. What a forced cancel removes,
    whatever became of the execution since (confirmed, refused, past its deadline)."""
    if not schema.is_live_state(item, now):
        return False
    device = Device.from_item(item)
    entries = leaf_entries(device.desired, device.entries.get(DESIRED, {}))
    return all(pointer in entries and version_of(entries[pointer]) == version for pointer in job_leaves)


def _by_deadline(verdict: Verdict | None, deadline_ms: int, now_ms: int) -> Verdict | None:
    """What happened after the deadline, or nothing by it, is a timeout (an event stamped by a
    writer whose clock runs ahead counts while this clock has not reached the deadline)."""
    if verdict is not None and (verdict.at_ms <= deadline_ms or now_ms < deadline_ms):
        return verdict
    if verdict is not None or now_ms >= deadline_ms:
        return Verdict(TIMED_OUT, deadline_ms)
    return None
