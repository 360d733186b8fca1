"""The job marker on a device's state item (item/job_marks.py), planned by the one planner: a
job's desired write carries its mark in the same request and requires it absent, so the device
gets the job's write at most once; a refusal whose old item holds the mark says the job wrote
the device already, and at which version; every versioned write drops the marks long past their
deadline. Planned without an engine (the requests themselves)."""

from __future__ import annotations

import pytest

from functions.device_state import MergePatch, table
from functions.device_state.errors import JobAlreadyWritten, TooManyJobs
from functions.device_state.item import job_marks
from functions.device_state.item.fencing import Fence
from functions.device_state.item.job_marks import GRACE_SECONDS, MAX_JOB_MARKS, JobMark
from functions.device_state.model.sections import DESIRED
from functions.device_state.write.compiled import compile_patch
from functions.device_state.write.outcomes import refusal
from functions.device_state.write.planner import Planner
from tests.unit.test_writes import item, spelled

NOW = 1_800_000_000.0
MARK = JobMark("job1", window_seconds=600)
JOB_PLANNER = Planner("devices", Fence(), NOW, job=MARK)
PLAIN = Planner("devices", Fence(), NOW)
DEADLINE_MS = int(NOW * 1000) + 600_000


def marked(version=3, **marks):
    return item(version, **{table.JOB_MARKS: {"M": {job_id: {"N": str(packed)} for job_id, packed in marks.items()}}})


def test_a_mark_packs_the_version_and_the_deadline_and_reads_back():
    packed = MARK.packed(NOW, 7)
    assert job_marks.unpack(packed) == (7, DEADLINE_MS)
    assert job_marks.mark_of(marked(job1=packed), "job1") == (7, DEADLINE_MS)
    assert job_marks.mark_of(marked(), "job1") is None and job_marks.mark_of(None, "job1") is None


def test_a_compiled_job_write_sets_its_mark_at_the_version_it_makes_and_requires_it_absent():
    request = JOB_PLANNER.compiled("d", compile_patch(MergePatch({"mode": "eco"}), DESIRED), None,
                                   DESIRED).request["Update"]
    update, condition = spelled(request, "UpdateExpression"), spelled(request, "ConditionExpression")
    assert f"jobs.job1 = version + {job_marks.pack(DEADLINE_MS, 1)}" in update
    assert "attribute_type(jobs, 'M')" in condition and "attribute_not_exists(jobs.job1)" in condition
    assert f"size(jobs) < {MAX_JOB_MARKS}" in condition


def test_a_read_modify_write_job_write_keeps_the_live_marks_adds_its_own_and_drops_the_long_expired():
    long_ago = int((NOW - GRACE_SECONDS - 1) * 1000)
    current = marked(other=job_marks.pack(DEADLINE_MS, 2), stale=job_marks.pack(long_ago, 1))
    planned = JOB_PLANNER.replace_state(current, MergePatch({"mode": "eco"}), None, "updated", DESIRED)
    update = spelled(planned.request["Update"], "UpdateExpression")
    expected = {"other": {"N": str(job_marks.pack(DEADLINE_MS, 2))}, "job1": {"N": str(MARK.packed(NOW, 4))}}
    assert f"jobs = {_json({'M': expected})}" in update


def test_a_job_write_to_a_device_holding_its_mark_is_refused_before_it_is_sent_with_the_version():
    with pytest.raises(JobAlreadyWritten) as refused:
        JOB_PLANNER.replace_state(marked(job1=MARK.packed(NOW, 2)), MergePatch({"mode": "eco"}), None, "updated",
                                  DESIRED)
    assert refused.value.version == 2 and refused.value.job_id == "job1"


def test_a_device_in_the_most_jobs_refuses_another_one():
    full = marked(**{f"j{number}": job_marks.pack(DEADLINE_MS, 2) for number in range(MAX_JOB_MARKS)})
    with pytest.raises(TooManyJobs):
        JOB_PLANNER.replace_state(full, MergePatch({"mode": "eco"}), None, "updated", DESIRED)


def test_a_refused_job_write_whose_old_item_holds_the_mark_was_written_already_at_that_version():
    planned = JOB_PLANNER.compiled("d", compile_patch(MergePatch({"mode": "eco"}), DESIRED), None, DESIRED)
    found = refusal(planned, marked(version=5, job1=MARK.packed(NOW, 4)), JOB_PLANNER)
    assert isinstance(found, JobAlreadyWritten) and found.version == 4
    assert not isinstance(refusal(planned, marked(version=5), JOB_PLANNER), JobAlreadyWritten)


def test_a_plain_write_gives_a_device_an_empty_map_once_and_drops_long_expired_marks():
    without = {name: value for name, value in item().items() if name != table.JOB_MARKS}
    update = spelled(PLAIN.replace_state(without, lambda s: s, None, "updated").request["Update"], "UpdateExpression")
    assert "jobs = {\"M\":{}}" in update  # so that a job's write to it can be read-free
    live = marked(other=job_marks.pack(DEADLINE_MS, 2))
    assert "jobs" not in spelled(PLAIN.replace_state(live, lambda s: s, None, "updated").request["Update"],
                                 "UpdateExpression")
    stale = marked(other=job_marks.pack(int((NOW - GRACE_SECONDS - 1) * 1000), 2))
    assert "jobs = {\"M\":{}}" in spelled(PLAIN.replace_state(stale, lambda s: s, None, "updated").request["Update"],
                                          "UpdateExpression")


def _json(value) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


@pytest.mark.parametrize("given, window", [
    ({}, 7 * 24 * 3600),
    ({"timeoutSeconds": 20 * 24 * 3600}, 20 * 24 * 3600),  # past the 7 days of the default: as given
    ({"expiresIn": 20 * 24 * 3600}, 20 * 24 * 3600),  # the default is expiresIn
    ({"timeoutSeconds": 600, "expiresIn": 3600}, 600),
    ({"timeoutSeconds": 3600, "expiresIn": 600}, 600),  # the leaves gone: nothing more can confirm it
], ids=["default", "long-timeout", "long-expiry", "timeout-first", "expiry-first"])
def test_an_executions_window_is_its_timeout_else_its_leaves_expiry_else_seven_days(given, window):
    """docs/api/jobs.md: timeoutSeconds 1 to 2,592,000 (default: expiresIn, else 7 days)."""
    from functions.device_state.jobs.spec import parse

    assert parse({"jobId": "j1", "desired": {"mode": "eco"}, "deviceIds": ["lamp"], **given},
                 1_800_000_000).window_seconds == window


def test_a_job_keeps_the_window_it_was_stored_with_and_one_stored_before_keeps_seven_days():
    """A job created before the window was stored, with a timeout over 7 days, was tracked over
    7 days: it still is after the change (its marks' deadlines were made so)."""
    import json

    from functions.device_state.jobs.spec import JobSpec, parse

    spec = parse({"jobId": "j1", "desired": {"mode": "eco"}, "deviceIds": ["lamp"],
                  "timeoutSeconds": 20 * 24 * 3600}, 1_800_000_000)
    assert JobSpec.from_stored(spec.stored()).window_seconds == 20 * 24 * 3600
    earlier = json.loads(spec.stored())
    del earlier["windowSeconds"]
    assert JobSpec.from_stored(json.dumps(earlier)).window_seconds == 7 * 24 * 3600
