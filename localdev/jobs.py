"""The job runner under ``make serve``: what the deployed schedule and the runner's
self-invocations do (functions/jobs/handler.py). Every ``TICK_SECONDS`` each open job due now
(``DeviceStateManager.due_jobs``) that is not running already gets a run of up to
``BUDGET_SECONDS`` on a thread of its own, the same ``JobRunner.run`` the function calls:
deployed, each job's run is an invocation of its own, so one job pacing its writes holds no
other back. A created job starts within a tick, a paced or waiting one is woken when due, and a
cancel is carried out. At most ``MAX_RUNS`` jobs run at once (deployed, the function's
concurrency bounds them): a run to spare goes to the due job that has waited longest."""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger("device_state.jobs")

TICK_SECONDS = 0.5
BUDGET_SECONDS = 10.0
MAX_RUNS = 4


def serve(manager, stop=lambda: False) -> None:
    """Runs due jobs until ``stop()`` is true, then waits for the runs under way to end."""
    runner = manager.job_runner()
    running: dict[str, threading.Thread] = {}
    started: dict[str, int] = {}  # job id -> the tick its last run started on
    tick = 0
    while not stop():
        tick += 1
        running = {job_id: run for job_id, run in running.items() if run.is_alive()}
        try:
            due = [job_id for job_id in manager.due_jobs().job_ids if job_id not in running]
        except Exception:  # noqa: BLE001 - as the schedule's next minute would: the next tick looks again
            logger.exception("looking for due jobs failed; trying again")
            due = []
        # The longest waiting first (never run before any): four paced jobs, due again each time
        # their run ends, take turns with the others rather than keep every run to themselves.
        started = {job_id: at for job_id, at in started.items() if job_id in running or job_id in due}
        for job_id in sorted(due, key=lambda job_id: started.get(job_id, 0))[:MAX_RUNS - len(running)]:
            started[job_id] = tick
            running[job_id] = threading.Thread(target=_run, args=(runner, job_id), name=f"job {job_id}", daemon=True)
            running[job_id].start()
        time.sleep(TICK_SECONDS)
    for run in running.values():
        run.join()


def _run(runner, job_id: str) -> None:
    try:
        progress = runner.run(job_id, BUDGET_SECONDS)
        logger.info("job %s: %s", job_id, progress.status)
    except Exception:  # noqa: BLE001 - as the function's retry would: the next tick tries again
        logger.exception("job %s: its run failed; trying again", job_id)
