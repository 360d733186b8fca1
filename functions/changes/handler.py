"""The stream processor's Lambda handler: Powertools' batch utility over DynamoDB Streams
records, answering with partial batch responses.

Records of one shard arrive in order, and a device's records all come from one shard.
Once a device's record fails, that device's later records in the batch are reported
failed too (without being tried), so its changes are never written out of order; every
other device's records are still handled, so one poison record holds no other device's
feed beyond one retry cycle (Lambda resends from the first failed record, and what was
written already is found there and left alone). A record that can never be written
(DynamoDB refuses it: a permanent failure) is not retried: its version is marked lost
at once (``ChangeLog.record_lost``), so followers get 410 instead of waiting on a gap.
Records that are no change (see ``device_state.changes``) are dropped; the event source
mapping's filter (``FILTER_PATTERN``) drops most before they cost an invocation, and the
same test runs again here.
"""

from __future__ import annotations

import functools
import os
import time

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response

from functions.device_state import (MAX_RECORD_AGE_SECONDS, ChangeLog, DeviceStateManager, InvalidValue,
                                    RequestRefused,
                                    connectivity_event,
                                    dynamodb_client, metrics as names, restore, table)

from functions.config import processor_config
from .events import EventBridgePublisher, FilePublisher, LogPublisher

# The event source mapping's filter (Lambda filter-pattern syntax). Only a state item
# that has a version can be a change; the version comparison itself is done in code.
FILTER_PATTERN = {
    "eventName": ["INSERT", "MODIFY"],
    "dynamodb": {
        "Keys": {table.SORT_KEY: {"S": [table.STATE_SK]}},
        "NewImage": {table.VERSION: {"N": [{"exists": True}]}},
    },
}

logger = Logger(service=names.SERVICE)
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or names.NAMESPACE,
                  service=names.SERVICE)


def matches_filter(record: dict) -> bool:
    """``FILTER_PATTERN``, as the event source mapping applies it (for the local poller and
    as the code's own second check)."""
    dynamodb = record.get("dynamodb") or {}
    return (record.get("eventName") in ("INSERT", "MODIFY")
            and (dynamodb.get("Keys") or {}).get(table.SORT_KEY, {}).get("S") == table.STATE_SK
            and "N" in (dynamodb.get("NewImage") or {}).get(table.VERSION, {}))


@functools.lru_cache(maxsize=1)
def change_log() -> ChangeLog:
    config = processor_config()
    return ChangeLog(dynamodb_client(config.dynamodb_endpoint), config.table_name,
                     retention_seconds=config.change_retention_seconds)


@functools.lru_cache(maxsize=1)
def publisher():
    config = processor_config()
    if config.event_bus_name:
        import boto3

        return EventBridgePublisher(boto3.session.Session().client("events"), config.event_bus_name)
    if config.events_file:
        return FilePublisher(config.events_file)
    return LogPublisher()


# A SnapStart restore reseeds the library's generators and creates these clients afresh.
restore.on_restore(change_log.cache_clear)
restore.on_restore(publisher.cache_clear)
restore.register_with_lambda()


# The event source mapping's settings (infra/changes.py); the local poller keeps the same.
BATCH_SIZE = 100
MAX_RETRY_ATTEMPTS = 10  # then the batch's first failed record goes to the on-failure queue
# MAX_RECORD_AGE_SECONDS, the mapping's longest hold on a record, is the library's: the feed relies on it.


class SkippedAfterFailure(RuntimeError):
    """Not tried: an earlier record of the same device failed in this batch, and order must hold."""


class InOrder:
    """The record handler for one batch: after a device's first failure, skips that
    device's later records; other devices' records go on."""

    def __init__(self, log: ChangeLog, events, jobs=None):
        self.log, self.events, self.jobs = log, events, jobs
        self.failed: set[str] = set()

    def __call__(self, record) -> None:
        device_id = record_device(record.raw_event)
        if device_id in self.failed:
            raise SkippedAfterFailure(f"an earlier record of {device_id} failed in this batch")
        try:
            handle(record.raw_event, self.log, self.events)
            if self.jobs is not None and matches_filter(record.raw_event):
                dynamodb = record.raw_event["dynamodb"]
                self.jobs.see(dynamodb.get("OldImage"), dynamodb.get("NewImage"))
        except PERMANENT_FAILURES:
            logger.exception("stream record can never be written: its version is marked lost",
                             extra={"device_id": device_id})
            try:
                self.log.record_lost((record.raw_event.get("dynamodb") or {}).get("NewImage"))
            except Exception:
                self.failed.add(device_id)
                raise
            count_lost()
        except Exception:
            if self._given_up(record.raw_event):
                return
            self.failed.add(device_id)
            raise

    def _given_up(self, raw: dict) -> bool:
        """Lambda gives a record up after ``MAX_RETRY_ATTEMPTS`` retries and leaves no trace in
        the feed, so the processor counts its own tries and on the last one marks the version
        lost itself: followers that reach it get 410 at once. False (retry) while tries are
        left, or when even the count or the marker cannot be written."""
        new_image = (raw.get("dynamodb") or {}).get("NewImage")
        try:
            if self.log.count_try(new_image) < MAX_RETRY_ATTEMPTS:
                return False
            self.log.record_lost(new_image)
        except Exception:  # noqa: BLE001 - DynamoDB itself failing: Lambda's retries go on
            return False
        logger.exception("stream record failed on every try: its version is marked lost",
                         extra={"device_id": record_device(raw)})
        count_lost()
        return True


# Failures no retry can cure: the record's change cannot be stored (DynamoDB refuses it).
PERMANENT_FAILURES = (InvalidValue, RequestRefused)


def count_lost() -> None:
    """A version marked lost: the invocation succeeds and nothing reaches the on-failure queue,
    so this metric (and its alarm, ChangesLost) is how an operator learns of it."""
    metrics.add_metric(name=names.CHANGES_LOST, unit=MetricUnit.Count, value=1)


def record_device(raw: dict) -> str | None:
    keys = (raw.get("dynamodb") or {}).get("Keys") or {}
    return keys.get(table.PARTITION_KEY, {}).get("S")


def handle(raw: dict, log: ChangeLog, events) -> None:
    """One stream record: write its change (once) and publish its event."""
    if not matches_filter(raw):
        return
    dynamodb = raw["dynamodb"]
    lost = []
    change = log.record(dynamodb.get("OldImage"), dynamodb.get("NewImage"), on_lost=lost.append)
    # connected or disconnected (a connection, or a delete of a connected device): an event of its own
    became = connectivity_event(dynamodb.get("OldImage"), dynamodb.get("NewImage"))
    if change is None:
        if became is not None:
            events.send(*became)
        return
    events.publish(change)
    if became is not None:
        events.send(*became)
    if lost:  # no form of it fits an item: its version is marked lost, as an exhausted record's is
        logger.warning("change fits no item: its version is marked lost", extra={"device_id": change.device_id})
        count_lost()
        return
    metrics.add_metric(name=names.CHANGES_RECORDED, unit=MetricUnit.Count, value=1)
    created = dynamodb.get("ApproximateCreationDateTime")
    if isinstance(created, (int, float)):
        metrics.add_metric(name=names.CHANGE_LAG, unit=MetricUnit.Milliseconds,
                           value=max(0.0, time.time() - created) * 1000)


def process(event: dict, context, log: ChangeLog, events, jobs=None) -> dict:
    """One batch of stream records -> ``{"batchItemFailures": [...]}`` (Lambda's partial
    batch response: the sequence numbers of the records to retry, from the first failed).
    ``jobs``: the ``JobTracker`` that moves the executions the batch makes final, written
    together after the batch (when that fails, the whole batch is delivered again: the change
    items and the finals are each written once)."""
    processor = BatchProcessor(event_type=EventType.DynamoDBStreams, raise_on_entire_batch_failure=False)
    answer = process_partial_response(event=event, record_handler=InOrder(log, events, jobs), processor=processor,
                                      context=context)
    if jobs is not None:
        written = jobs.flush()
        if written:
            metrics.add_metric(name=names.JOB_EXECUTIONS_FINAL, unit=MetricUnit.Count, value=written)
    return answer


@functools.lru_cache(maxsize=1)
def job_tracker():
    config = processor_config()
    return DeviceStateManager(dynamodb_client(config.dynamodb_endpoint), config.table_name).job_tracker()


restore.on_restore(job_tracker.cache_clear)


def give_up(record: dict) -> None:
    """What the local poller does with a record it gives up (Lambda's on-failure
    destination): its version is marked lost, so followers learn at once."""
    change_log().record_lost((record.get("dynamodb") or {}).get("NewImage"))
    count_lost()


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event, context):
    return process(event, context, change_log(), publisher(), job_tracker())
