"""What a job's head shows and when it is due, from its items as a runner or the stream left them."""
from __future__ import annotations

import time

from functions.device_state.jobs import items
from functions.device_state.jobs.items import Counts, Head, JobRecord, RunState
from functions.device_state.jobs.spec import parse


def head(status="IN_PROGRESS", **run) -> Head:
    spec = parse({"jobId": "j1", "filter": "eq(state/site,\"x\")", "desired": {"mode": "eco"}}, time.time())
    return Head(JobRecord(spec, status), RunState(**run), Counts())


def test_a_job_still_finding_devices_says_so():
    assert head(targeted=False).as_dict()["targeting"] is True
    assert "targeting" not in head(targeted=True).as_dict()


def test_a_job_stopped_before_its_targeting_ended_is_not_shown_targeting():
    """No runner targets a stopped job, so its total is final: a cancel within a second of the
    create had left ``targeting: true`` on the canceled job for good."""
    canceled = head("CANCELED", targeted=False, stop=items.STOP_CANCEL, stopped_ms=1)
    assert "targeting" not in canceled.as_dict()
    assert canceled.etag() != head("CANCELED", targeted=False).etag()


def test_default_job_ids_sort_as_they_were_created():
    """A device's jobs are listed in job id order: ids made a millisecond apart, over a day's
    seconds, sort as they were made (base32's A-Z2-7 does not: 2 comes after Z)."""
    from functions.device_state.jobs.spec import new_job_id

    start = 1796099688.397
    made = [new_job_id(start + step / 1000) for step in range(0, 86_400_000, 86_400_000 // 20_000)]
    assert made == sorted(made) and len(set(made)) == len(made)
    assert all(len(job_id) == 16 and job_id.isalnum() and job_id == job_id.lower() for job_id in made)
