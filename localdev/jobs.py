"""The job runner under ``make serve``: what the deployed schedule and the runner's
self-invocations do (functions/jobs/handler.py), in one loop: every ``TICK_SECONDS`` the open
jobs due now (``DeviceStateManager.due_jobs``) each get a run of up to ``BUDGET_SECONDS``, the
same ``JobRunner.run`` the function calls, so a created job starts within a tick, a paced or
waiting one is woken when due, and a cancel is carried out."""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("device_state.jobs")

TICK_SECONDS = 0.5
BUDGET_SECONDS = 10.0


def serve(manager, stop=lambda: False) -> None:
    runner = manager.job_runner()
    while not stop():
        try:
            for job_id in manager.due_jobs().job_ids:
                progress = runner.run(job_id, BUDGET_SECONDS)
                logger.info("job %s: %s", job_id, progress.status)
        except Exception:  # noqa: BLE001 - as the function's retry would: the next tick tries again
            logger.exception("job runner failed; trying again")
        time.sleep(TICK_SECONDS)
