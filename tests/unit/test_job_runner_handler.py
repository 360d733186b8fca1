"""The job runner's function (functions/jobs/handler.py): invoked for a job, it runs it and invokes
itself again only while work is due at once (BUSY); invoked by the schedule (no job), it invokes
itself once per due job and reports the stuck executions it was told of; a failed run is counted
as a job error and raised (Lambda retries, the schedule takes the job up again)."""

from __future__ import annotations

import pytest

from functions.device_state.jobs import BUSY, DONE, IDLE, Progress
from functions.device_state.jobs.runner import Due
from functions.jobs import handler
from localdev.apigw import LambdaContext


class Recorder:
    def __init__(self):
        self.invoked = []

    def start_function(self, function_name, payload, attempts):
        assert function_name == LambdaContext.function_name and attempts == handler.INVOKE_ATTEMPTS > 1
        self.invoked.append(payload)


class FakeRunner:
    def __init__(self, progress):
        self.progress, self.runs = progress, []

    def run(self, job_id, budget):
        self.runs.append((job_id, budget))
        if isinstance(self.progress, Exception):
            raise self.progress
        return self.progress


class FakeManager:
    def __init__(self, progress=None, due=Due((), 0)):
        self.runner, self.due = FakeRunner(progress), due

    def job_runner(self):
        return self.runner

    def due_jobs(self):
        return self.due


@pytest.fixture
def rig(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(handler, "start_function", recorder.start_function)
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "DeviceState")

    def with_manager(manager):
        monkeypatch.setattr(handler, "_manager", lambda: manager)
        return recorder
    return with_manager


@pytest.mark.parametrize("progress, again", [(Progress(BUSY), True), (Progress(IDLE, 5), False),
                                             (Progress(DONE), False)])
def test_a_run_invokes_itself_again_only_while_work_is_due_at_once(rig, progress, again):
    manager = FakeManager(progress)
    recorder = rig(manager)
    answer = handler.handler({"jobId": "j1"}, LambdaContext(900))
    assert answer["status"] == progress.status and manager.runner.runs[0][0] == "j1"
    assert 860 <= manager.runner.runs[0][1] <= 870  # the function's time, less the margin
    assert recorder.invoked == ([{"jobId": "j1"}] if again else [])


def test_the_schedule_invokes_one_run_per_due_job_and_reports_the_stuck(rig, capsys):
    recorder = rig(FakeManager(due=Due(("a", "b"), 7)))
    assert handler.handler({}, LambdaContext(60)) == {"woken": 2, "stuck": 7}
    assert recorder.invoked == [{"jobId": "a"}, {"jobId": "b"}]
    assert '"JobStuckExecutions"' in capsys.readouterr().out  # the metric Powertools writes


def test_the_schedule_reports_the_stuck_even_when_it_cannot_wake_a_job(rig, monkeypatch, capsys):
    """The JobStuckExecutions alarm takes a period without a count for a schedule that failed: a
    throttled invoke must not take the count with it (it was emitted after the invokes)."""
    rig(FakeManager(due=Due(("a",), 3)))

    def throttled(*args, **kwargs):
        raise RuntimeError("Rate Exceeded")

    monkeypatch.setattr(handler, "start_function", throttled)
    with pytest.raises(RuntimeError):
        handler.handler({}, LambdaContext(60))
    assert '"JobStuckExecutions"' in capsys.readouterr().out


def test_a_failed_run_is_counted_and_raised(rig, capsys):
    rig(FakeManager(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        handler.handler({"jobId": "j1"}, LambdaContext(60))
    assert '"JobErrors"' in capsys.readouterr().out


def test_the_schedule_wakes_every_due_job_through_a_throttled_invoke(monkeypatch):
    """Lambda answering one invoke 429 (TooManyRequests, past the function's concurrency): the
    schedule sends it again and wakes the other due jobs too. With one attempt (the API's), the
    first throttle ended the tick, its other jobs unwoken and its metric unpublished (a review)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Lambda(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            seen.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))))
            throttled = len(seen) == 1
            body = json.dumps({"Type": "User", "message": "Rate Exceeded."}).encode() if throttled else b""
            self.send_response(429 if throttled else 202)
            if throttled:
                self.send_header("x-amzn-ErrorType", "TooManyRequestsException")
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Lambda)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "DeviceState")
        monkeypatch.setattr(handler, "_manager", lambda: FakeManager(due=Due(("a", "b"), 7)))
        assert handler.handler({}, LambdaContext(60)) == {"woken": 2, "stuck": 7}
    finally:
        server.shutdown()
    assert seen == [{"jobId": "a"}, {"jobId": "a"}, {"jobId": "b"}]
