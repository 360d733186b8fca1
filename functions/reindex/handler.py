"""The fleet index's backfill, deployed: the stack's reindex function runs
``DeviceStateManager.reindex`` until its time is nearly up, then invokes itself again
(asynchronously) to go on from where it stopped; the job's position is on the table, so a
failed or repeated invocation resumes rather than restarts. Invoke it once after a deploy
that declares a field on a table holding devices (``docs/operations.md``); it answers with
the progress and does nothing when every declared field is ready."""

from __future__ import annotations

import functools
import json
import os

import boto3
from aws_lambda_powertools import Logger

from functions.config import ConfigError, StorageConfig, fleet_index
from functions.device_state import DeviceStateManager, dynamodb_client

SAFETY_SECONDS = 60  # left for the last page and the next invocation

logger = Logger()


@functools.lru_cache(maxsize=1)
def _manager() -> DeviceStateManager:
    config = StorageConfig.from_environment()
    return DeviceStateManager(dynamodb_client(config.dynamodb_endpoint), config.table_name,
                              fleet_index=fleet_index())


@logger.inject_lambda_context
def handler(event, context):
    if not fleet_index():
        raise ConfigError("FLEET_INDEX declares no field: nothing to index")
    budget = max(context.get_remaining_time_in_millis() / 1000 - SAFETY_SECONDS, 1.0)
    done = _manager().reindex(budget_seconds=budget, report=lambda progress: logger.info("reindex", **progress))
    if not done:
        boto3.client("lambda").invoke(FunctionName=os.environ.get("AWS_LAMBDA_FUNCTION_NAME", context.function_name),
                                      InvocationType="Event", Payload=json.dumps({"continued": True}).encode())
    return {"done": done}
