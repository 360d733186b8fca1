"""The stream processor under `make serve`: what Lambda's event source mapping does,
against DynamoDB Local's stream.

Every shard is read in order (a child shard only after its parent is finished); the
records that pass the mapping's filter (``matches_filter``) go in batches of at most
``BATCH_SIZE`` to the same ``process`` the Lambda handler runs. When the partial batch
response names failed records, the shard is read again from the first of them, after a
backoff; after ``MAX_RETRY_ATTEMPTS`` failed tries of one record it is logged as sent to
the on-failure destination and passed, as Lambda does (and ``on_give_up`` marks its
version lost, so the feed answers 410 rather than wait on it). ``process`` handles every
device's records apart (``functions.changes.handler``), so a failing record delays other
devices' changes by one backoff at most: each retry reads on from the failed record and
handles the others again, which finds their changes written and changes nothing.
Records pass through ``lambda_record``, which also repairs what DynamoDB Local sends
differently from DynamoDB (an empty map without its type).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from functions.changes.handler import BATCH_SIZE, MAX_RETRY_ATTEMPTS, matches_filter

logger = logging.getLogger("device_state.stream")

FIRST_BACKOFF_SECONDS = 0.05
MAX_BACKOFF_SECONDS = 2.0
# Between rounds even when records keep coming (Lambda's batching window, in effect): records
# then arrive in batches, and the poller costs a busy machine one call per shard per window,
# not one per record. It adds at most this much to the feed's lag.
BATCH_WINDOW_SECONDS = 0.1
# After this long without records a poller polls every QUIET_POLL_SECONDS rather than every idle_seconds.
QUIET_AFTER_SECONDS, QUIET_POLL_SECONDS = 2.0, 0.5
DISCOVER_EVERY_SECONDS = 1.0  # new shards (DynamoDB Local rolls them over) are looked for this often


def typed(attribute):
    """An attribute value as DynamoDB Streams documents it. DynamoDB Local sends an empty
    map as ``{}``, without its type (measured on 3.3.1: ``{"state": {}}``, ``{"cfg": {}}``,
    ``[{}]``); nothing else is ever an empty dict, so it is ``{"M": {}}``."""
    if not attribute:
        return {"M": {}}
    (kind, value), = attribute.items()
    if kind == "M":
        return {"M": {name: typed(member) for name, member in value.items()}}
    if kind == "L":
        return {"L": [typed(member) for member in value]}
    return attribute


def lambda_record(record: dict, stream_arn: str) -> dict:
    """A DynamoDB Streams record as boto3 returns it -> as Lambda hands it to a handler."""
    dynamodb = dict(record["dynamodb"])
    for image in ("Keys", "NewImage", "OldImage"):
        if image in dynamodb:
            dynamodb[image] = {name: typed(value) for name, value in dynamodb[image].items()}
    created = dynamodb.get("ApproximateCreationDateTime")
    if hasattr(created, "timestamp"):
        dynamodb["ApproximateCreationDateTime"] = created.timestamp()
    return {**record, "dynamodb": dynamodb, "eventSourceARN": stream_arn}


class StreamPoller:
    """Polls a table's stream and feeds ``process(event, context) -> partial batch response``."""

    def __init__(self, streams_client, dynamodb_client, table_name: str, process: Callable[[dict, object], dict],
                 *, context_factory: Callable[[], object] | None = None, idle_seconds: float = 0.1,
                 quiet_seconds: float = QUIET_POLL_SECONDS,
                 batch_window_seconds: float = BATCH_WINDOW_SECONDS,
                 max_retry_attempts: int = MAX_RETRY_ATTEMPTS, batch_size: int = BATCH_SIZE,
                 on_give_up: Callable[[dict], None] | None = None,
                 record_filter: Callable[[dict], bool] = matches_filter):
        self.streams = streams_client
        self.record_filter = record_filter  # the mapping's filter: the change feed's by default
        self.table_name = table_name
        self.process = process
        self.on_give_up = on_give_up or (lambda record: None)  # e.g. mark the record's version lost
        self.context_factory = context_factory or (lambda: None)
        self.idle_seconds = idle_seconds
        self.quiet_seconds = max(quiet_seconds, idle_seconds)
        self.batch_window_seconds = batch_window_seconds
        self._next_discovery = 0.0
        self.max_retry_attempts = max_retry_attempts
        self.batch_size = batch_size
        self.stream_arn = dynamodb_client.describe_table(TableName=table_name)["Table"]["LatestStreamArn"]
        self.iterators: dict[str, str] = {}
        self.last_sequence: dict[str, str] = {}
        self.finished: set[str] = set()
        self.failures: dict[str, int] = {}  # sequence number -> failed tries
        self.discarded: list[dict] = []  # records given up on (Lambda's on-failure destination)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ running

    def start(self) -> "StreamPoller":
        self._thread = threading.Thread(target=self.run, name="stream-poller", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)

    def run(self) -> None:
        """Polls every ``idle_seconds`` while records came within ``QUIET_AFTER_SECONDS``, then every
        ``quiet_seconds``: a quiet table costs a server's two stream pollers and DynamoDB Local a
        third of the CPU (measured: 0.16 CPU-seconds a second at 0.1 s), and the first change after
        the quiet is picked up within ``quiet_seconds`` (Lambda polls a shard four times a second)."""
        last_busy = time.monotonic()
        while not self._stop.is_set():
            try:
                busy = self.poll_once()
            except Exception:  # DynamoDB Local went away for a moment, or a bug: keep polling
                logger.exception("stream poll failed")
                busy = False
            now = time.monotonic()
            last_busy = now if busy else last_busy
            idle = self.idle_seconds if now - last_busy < QUIET_AFTER_SECONDS else self.quiet_seconds
            self._stop.wait(self.batch_window_seconds if busy else idle)

    # ------------------------------------------------------------------ one round

    def poll_once(self) -> bool:
        """Read every open shard once; True when any records came."""
        if not self.iterators or time.monotonic() >= self._next_discovery:
            self._discover()
            self._next_discovery = time.monotonic() + DISCOVER_EVERY_SECONDS
        busy = False
        for shard_id in list(self.iterators):
            busy = self._read(shard_id) or busy
        return busy

    def _discover(self) -> None:
        shards, start = [], None
        while True:
            request = {"StreamArn": self.stream_arn, **({"ExclusiveStartShardId": start} if start else {})}
            description = self.streams.describe_stream(**request)["StreamDescription"]
            shards.extend(description["Shards"])
            start = description.get("LastEvaluatedShardId")
            if not start:
                break
        known = {shard["ShardId"] for shard in shards}
        for shard in shards:
            shard_id, parent = shard["ShardId"], shard.get("ParentShardId")
            if shard_id in self.iterators or shard_id in self.finished:
                continue
            if parent and parent in known and parent not in self.finished:
                continue  # the parent's records come first
            self.iterators[shard_id] = self._iterator(shard_id, "TRIM_HORIZON")

    def _iterator(self, shard_id: str, kind: str, sequence: str | None = None) -> str:
        request = {"StreamArn": self.stream_arn, "ShardId": shard_id, "ShardIteratorType": kind}
        if sequence:
            request["SequenceNumber"] = sequence
        return self.streams.get_shard_iterator(**request)["ShardIterator"]

    def _resume(self, shard_id: str) -> str:
        """An iterator just after the last record handled on the shard (its start if none)."""
        last = self.last_sequence.get(shard_id)
        if last:
            try:
                return self._iterator(shard_id, "AFTER_SEQUENCE_NUMBER", last)
            except self.streams.exceptions.TrimmedDataAccessException:
                logger.warning("stream shard %s: trimmed past %s; reading from its oldest record", shard_id, last)
        return self._iterator(shard_id, "TRIM_HORIZON")

    def _read(self, shard_id: str) -> bool:
        try:
            page = self.streams.get_records(ShardIterator=self.iterators[shard_id], Limit=self.batch_size)
        except self.streams.exceptions.ExpiredIteratorException:
            self.iterators[shard_id] = self._resume(shard_id)
            return True
        except self.streams.exceptions.TrimmedDataAccessException:
            # DynamoDB Local sometimes answers this for an iterator taken on a young shard, though
            # nothing was trimmed (aws/aws-sdk-java#2923); read again after the last record handled.
            logger.warning("stream shard %s: trimmed-data answer; resuming after the last record handled", shard_id)
            self.iterators[shard_id] = self._resume(shard_id)
            return True
        records = page.get("Records", [])
        batch = [lambda_record(record, self.stream_arn) for record in records if self.record_filter(record)]
        failed = self._failed_sequence(batch) if batch else None
        if failed is not None:
            tries = self.failures[failed] = self.failures.get(failed, 0) + 1
            if tries <= self.max_retry_attempts:
                time.sleep(min(FIRST_BACKOFF_SECONDS * 2 ** (tries - 1), MAX_BACKOFF_SECONDS))
                self.iterators[shard_id] = self._iterator(shard_id, "AT_SEQUENCE_NUMBER", failed)
                return True
            record = next(r for r in batch if r["dynamodb"]["SequenceNumber"] == failed)
            logger.error("stream record %s failed %d times: sent to the on-failure destination", failed, tries)
            self.discarded.append(record)
            try:
                self.on_give_up(record)
            except Exception:  # the record is given up all the same: the shard must go on
                logger.exception("marking the given-up record %s failed", failed)
            del self.failures[failed]
            self.last_sequence[shard_id] = failed
            self.iterators[shard_id] = self._iterator(shard_id, "AFTER_SEQUENCE_NUMBER", failed)
            return True
        if records:
            self.last_sequence[shard_id] = records[-1]["dynamodb"]["SequenceNumber"]
            self.failures.clear()
        following = page.get("NextShardIterator")
        if following is None:
            del self.iterators[shard_id]
            self.finished.add(shard_id)
            self._next_discovery = 0.0  # its children come next
        else:
            self.iterators[shard_id] = following
        return bool(records)

    def _failed_sequence(self, batch: list[dict]) -> str | None:
        response = self.process({"Records": batch}, self.context_factory()) or {}
        failed = [entry["itemIdentifier"] for entry in response.get("batchItemFailures", [])]
        if not failed:
            return None
        return min(failed, key=int)
