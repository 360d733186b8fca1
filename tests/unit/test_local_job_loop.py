"""make serve's job loop (localdev/jobs.py) runs each due job on a thread of its own, as each
deployed run is an invocation of its own: a job whose run is under way holds no other back and
is not started twice. A runner that blocks until told stands in for a paced job's run."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from localdev import jobs as local_runner


class _Runner:
    """Records each run; a job whose id starts "paced" runs until ``release`` is set."""

    def __init__(self):
        self.release, self.runs = threading.Event(), []

    def run(self, job_id: str, budget_seconds: float):
        self.runs.append(job_id)
        if job_id.startswith("paced"):
            self.release.wait(30)
        return SimpleNamespace(status="RUNNING")


class _Manager:
    def __init__(self, runner: _Runner, due: tuple[str, ...]):
        self.runner, self.due = runner, due

    def job_runner(self):
        return self.runner

    def due_jobs(self):
        return SimpleNamespace(job_ids=self.due)


def _one_at_a_time(manager, stop) -> None:
    """The naive control: the loop make serve had, each due job's run after the one before."""
    runner = manager.job_runner()
    while not stop():
        for job_id in manager.due_jobs().job_ids:
            runner.run(job_id, local_runner.BUDGET_SECONDS)
        time.sleep(local_runner.TICK_SECONDS)


def _serve_while_paced_holds(loop, monkeypatch, due=("paced", "plain")) -> list[str]:
    """The runs ``loop`` starts in 0.3 s (30 ticks) while the paced jobs' first runs hold."""
    monkeypatch.setattr(local_runner, "TICK_SECONDS", 0.01)
    runner, done = _Runner(), threading.Event()
    thread = threading.Thread(target=loop, args=(_Manager(runner, due), done.is_set))
    thread.start()
    try:
        time.sleep(0.3)
        return list(runner.runs)
    finally:
        done.set()
        runner.release.set()
        thread.join(30)
        assert not thread.is_alive()


@pytest.mark.parametrize("loop", [local_runner.serve, _one_at_a_time], ids=["serve", "control-one-at-a-time"])
def test_a_paced_jobs_run_holds_no_other_job_back_nor_is_started_twice(loop, monkeypatch):
    runs = _serve_while_paced_holds(loop, monkeypatch)
    if loop is _one_at_a_time:
        assert runs == ["paced"]  # the plain job waits out the paced one's run
    else:
        assert runs.count("paced") == 1 and runs.count("plain") > 1, runs  # due again each tick, it runs again


def test_no_more_than_max_runs_jobs_run_at_once(monkeypatch):
    monkeypatch.setattr(local_runner, "MAX_RUNS", 2)
    runs = _serve_while_paced_holds(local_runner.serve, monkeypatch, due=("paced", "paced-2", "paced-3"))
    assert runs == ["paced", "paced-2"], runs


def test_a_run_to_spare_goes_to_the_job_that_waited_longest(monkeypatch):
    """Jobs due again each time their run ends (as paced ones are) take turns: the first listed
    does not take every run to spare while the others wait."""
    monkeypatch.setattr(local_runner, "MAX_RUNS", 1)
    runs = _serve_while_paced_holds(local_runner.serve, monkeypatch, due=("a", "b", "c"))
    assert len(runs) >= 6 and runs[:6] == ["a", "b", "c"] * 2, runs
