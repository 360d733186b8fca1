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
