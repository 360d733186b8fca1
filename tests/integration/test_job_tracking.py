"""Executions move from the change stream (jobs/tracker.py in functions/changes): on DynamoDB
Local, the stream records of what devices do after a job wrote them (a report confirming the
job's leaf, an ack refusing it, another writer setting it, a delete) make those executions
SUCCEEDED, FAILED (with code and reason), SUPERSEDED and REMOVED, with the job's counts, and the
same batch delivered again changes nothing (a tracker that counts without the execution's
condition counts twice: the control)."""

from __future__ import annotations

import time
from collections import Counter

import boto3
import pytest

from functions.changes.events import LogPublisher
from functions.changes.handler import process
from functions.device_state import Ack, DeviceStateManager, MergePatch
from functions.device_state.feed.log import ChangeLog
from functions.device_state.jobs.finals import Finals
from functions.device_state.jobs.runner import IDLE, JobRunner
from functions.device_state.jobs.spec import parse
from functions.device_state.jobs.store import JobStore
from functions.device_state.jobs.tracker import JobTracker
from functions.device_state.runtime import Runtime
from functions.device_state.write.pipeline import WritePipeline
from functions.device_state.write.store import Store
from localdev.stream import StreamPoller, lambda_record

pytestmark = [pytest.mark.dynamodb_local, pytest.mark.table_stream]  # tables made with their stream


def stream_event(dynamodb_local, client, name) -> dict:
    """Every record of the table's stream so far, as Lambda hands them over in one batch."""
    streams = boto3.client("dynamodbstreams", endpoint_url=dynamodb_local.endpoint, region_name="us-east-1")
    poller = StreamPoller(streams, client, name, lambda event, context: {"batchItemFailures": []})
    records = []
    for shard in streams.describe_stream(StreamArn=poller.stream_arn)["StreamDescription"]["Shards"]:
        iterator = streams.get_shard_iterator(StreamArn=poller.stream_arn, ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        records += [lambda_record(record, poller.stream_arn)
                    for record in streams.get_records(ShardIterator=iterator)["Records"]]
    return {"Records": records}


@pytest.fixture
def scene(dynamodb_local, local_table):
    """Five devices a job wrote, then: d0 confirms, d1 refuses, another writer sets d2's leaf,
    d3 is deleted, d4 does nothing."""
    client, name = local_table
    manager = DeviceStateManager(client, name)
    runtime = Runtime()
    pipeline = WritePipeline(Store(client, name, runtime), runtime)
    ids = [f"d{number}" for number in range(5)]
    for device_id in ids:
        manager.create(device_id, {"n": 0})
    jobs = JobStore(pipeline)
    jobs.create(parse({"jobId": "j1", "deviceIds": ids, "desired": {"mode": "eco"}}, time.time()))
    assert JobRunner(pipeline).run("j1", 30).status == IDLE
    manager.as_device("d0").update_with_retry("d0", MergePatch({"mode": "eco"}), section="reported")
    manager.as_device("d1").acknowledge("d1", [Ack("/mode", 2, 503, "battery too low")])
    manager.update_with_retry("d2", MergePatch({"mode": "manual"}), section="desired")
    manager.delete("d3")
    return manager, jobs, stream_event(dynamodb_local, client, name), ChangeLog(client, name), pipeline


def test_the_stream_moves_each_execution_once_with_the_jobs_counts(scene):
    manager, jobs, event, log, _ = scene
    tracker = manager.job_tracker()
    assert process(event, None, log, LogPublisher(), tracker) == {"batchItemFailures": []}
    executions = {execution.device_id: execution for execution in jobs.executions("j1")}
    assert {device_id: execution.state for device_id, execution in executions.items()} == {
        "d0": "SUCCEEDED", "d1": "FAILED", "d2": "SUPERSEDED", "d3": "REMOVED"}
    assert executions["d1"].code == 503 and executions["d1"].reason == "battery too low"
    assert all(execution.version == 2 for execution in executions.values())
    counts = jobs.head("j1").counts_by_state
    assert counts == {"QUEUED": 0, "IN_PROGRESS": 1, "SUCCEEDED": 1, "FAILED": 1, "TIMED_OUT": 0,
                      "SUPERSEDED": 1, "REMOVED": 1, "CANCELED": 0}
    assert process(event, None, log, LogPublisher(), manager.job_tracker()) == {"batchItemFailures": []}
    assert jobs.head("j1").counts_by_state == counts  # delivered again: nothing counted twice


class CountingWithoutCondition(Finals):
    """The control: counts each final it is given, with no condition on its execution item."""

    def _execution(self, job_id, expires, final):
        request = super()._execution(job_id, expires, final)
        request["Put"].pop("ConditionExpression")
        request["Put"].pop("ExpressionAttributeNames")
        return request


def test_control_a_tracker_without_the_executions_condition_counts_a_redelivered_batch_twice(scene):
    _, jobs, event, log, pipeline = scene
    for _ in range(2):
        process(event, None, log, LogPublisher(), JobTracker(pipeline, CountingWithoutCondition(pipeline)))
    counts = jobs.head("j1").counts_by_state
    assert counts["SUCCEEDED"] == 2 and Counter(e.state for e in jobs.executions("j1"))["SUCCEEDED"] == 1
