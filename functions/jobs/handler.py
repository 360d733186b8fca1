"""The job runner, deployed: a self-invoking function like the reindex one. Invoked with
``{"jobId": ...}`` (by ``POST /jobs``, by a cancel, by itself), it runs the job until its time is
nearly up (``JobRunner.run``) and invokes itself again, asynchronously, while work is due at once;
a job left idle (a paced job between batches, executions waiting for their deadline) or whose
runner died is woken by the schedule: invoked with no job (an EventBridge rule, every minute), it
invokes itself once per job due (``due_jobs``) and reports how many executions sit in jobs no
runner took for too long (``JobStuckExecutions``, alarmed). The job's position is on the table,
so a failed, repeated or concurrent invocation resumes rather than restarts, and the devices'
marks make any repeat of a write harmless."""

from __future__ import annotations

import functools
import os

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from functions.config import JobsConfig
from functions.device_state import DeviceStateManager, dynamodb_client, start_function
from functions.device_state import metrics as names
from functions.device_state.jobs import BUSY

SAFETY_SECONDS = 30  # left for the last batch and the next invocation
# A wake-up or a run's next invocation throttled (Lambda's TooManyRequests) or cut off is sent again,
# with backoff, as boto3 does by default: one lost would leave the schedule's other due jobs unwoken.
INVOKE_ATTEMPTS = 5

logger = Logger(service=names.SERVICE)
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or names.NAMESPACE,
                  service=names.SERVICE)


@functools.lru_cache(maxsize=1)
def _manager() -> DeviceStateManager:
    config = JobsConfig.from_environment()
    return DeviceStateManager(dynamodb_client(config.dynamodb_endpoint), config.table_name,
                              fleet_index=config.fleet_index, cursor_key=config.cursor_key)


def _invoke(context, job_id: str) -> None:
    start_function(os.environ.get("AWS_LAMBDA_FUNCTION_NAME", context.function_name), {"jobId": job_id},
                   attempts=INVOKE_ATTEMPTS)


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event, context):
    job_id = (event or {}).get("jobId")
    if not job_id:  # the schedule
        due = _manager().due_jobs()
        # Counted before the invokes: one that fails (throttled) still leaves the count, which the
        # JobStuckExecutions alarm misses in a period only when the schedule itself stops.
        metrics.add_metric(name=names.JOB_STUCK_EXECUTIONS, unit=MetricUnit.Count, value=due.stuck_executions)
        for one in due.job_ids:
            _invoke(context, one)
        return {"woken": len(due.job_ids), "stuck": due.stuck_executions}
    budget = max(context.get_remaining_time_in_millis() / 1000 - SAFETY_SECONDS, 1.0)
    try:
        progress = _manager().job_runner().run(job_id, budget)
    except Exception:
        metrics.add_metric(name=names.JOB_ERRORS, unit=MetricUnit.Count, value=1)
        logger.exception("job runner failed", extra={"job_id": job_id})
        raise
    logger.info("job run", extra={"job_id": job_id, "progress": progress.status, "wake_ms": progress.wake_ms})
    if progress.status == BUSY:
        _invoke(context, job_id)
    return {"status": progress.status, "wakeMs": progress.wake_ms}
