"""Keyed writes: which already happened, and what they answered.

A record lives in the device's partition (``sk = "idem#<scope>#<key>"``) and is written in
the same ``TransactWriteItems`` as the device change it describes, under
``attribute_not_exists``: either both land or neither does, so a retry after a lost
response finds the record and replays instead of applying the change again. A
transaction too large to carry its whole answer beside it records the versions only
(one small item, one action), and a replay reads those versions back, every section.

Recorded answers (``RecordedAnswers``): Recorded answers of keyed writes: the record an idempotency key left, read back as the
devices it answered (``recorded_results``), each at its version from the state
item while it is there, else from the change log's history.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from dataclasses import dataclass, replace
from typing import Callable

from .. import table
from ..errors import (ConditionFailed, DesireMoved, DeviceAlreadyExists, DeviceNotFound, DeviceStateError,
                      IdempotencyKeyReused, ItemTooLarge, PatchNotApplicable, PatchTestFailed, RetriesExhausted,
                      StorageUnavailable, VersionConflict)
from ..feed.log import ChangeLog, VersionNotFound
from ..item import schema
from ..model.device import Device, timestamp
from ..model.values import check_item_size, dumps, loads
from ..runtime import Runtime
from .expressions import Expression, number
from .plan import CHECKED, CREATED, DELETED, REPLACED, UPDATED  # noqa: F401 (the outcomes a record answers)
from .store import Store

RECORD_TTL_SECONDS = 24 * 60 * 60
# What a keyed write may be refused for because a request with its key landed after the write
# first looked for its record: the device it creates exists then, the version it names has moved
# on, the device it deletes is gone. Before answering one of these, a keyed write looks for its
# record once more, and replays it when it is there.
REFUSALS_SAME_KEY_MAY_CAUSE = (DeviceNotFound, DeviceAlreadyExists, VersionConflict, ConditionFailed, PatchTestFailed,
                               PatchNotApplicable, DesireMoved, ItemTooLarge, RetriesExhausted)
KEY_PATTERN = re.compile(r"[\x20-\x7e]{1,255}")
SCOPE_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

# What a keyed write did; the HTTP layer maps these to 201 / 200 / 204.

FINGERPRINT = "fingerprint"
ANSWER = "answer"  # the recorded answer: compressed JSON, per device the outcome and the device
PARTS = "parts"  # how many items the answer spans (the first holds part 0)
PART_BYTES = 300 * 1024
OUTCOME = "outcome"
RECORDED_AT = "recordedAt"


class InvalidIdempotencyKey(DeviceStateError, ValueError):
    pass


@dataclass(frozen=True)
class IdempotencyKey:
    """A caller's key for one logical write. ``scope`` separates operations on the same
    device (the HTTP layer uses the method); ``fingerprint`` identifies the request, so
    the same key with another request is refused instead of replayed."""

    key: str
    scope: str = "write"
    fingerprint: str = ""

    def __post_init__(self):
        if not isinstance(self.key, str) or not KEY_PATTERN.fullmatch(self.key):
            raise InvalidIdempotencyKey("an idempotency key is 1-255 printable ASCII characters")
        if not SCOPE_PATTERN.fullmatch(self.scope):
            raise InvalidIdempotencyKey("an idempotency scope is 1-64 of A-Z a-z 0-9 _ . : -")

    @property
    def sort_key(self) -> str:
        return f"{table.IDEMPOTENCY_SK_PREFIX}{self.scope}#{self.key}"

    def client_request_token(self, table_name: str, device_id: str, transact_items: list) -> str:
        """DynamoDB's own 10-minute idempotency for one transaction attempt, so botocore may
        resend it safely. Derived from the key and the attempt's exact parameters: a resend
        carries the same token, any other attempt (new timestamps, new write id) another."""
        digest = hashlib.sha256()
        digest.update(f"{table_name}\n{device_id}\n{self.sort_key}\n".encode())
        digest.update(json.dumps(transact_items, sort_keys=True, default=bytes.hex).encode())
        return digest.hexdigest()[:36]


def fingerprint(*parts: str | bytes | None) -> str:
    """A stable digest of the parts of a request that make it the same request."""
    digest = hashlib.sha256()
    for part in parts:
        data = b"" if part is None else part if isinstance(part, bytes) else part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def record_puts(table_name: str, partition: str, key: IdempotencyKey, results: list[tuple], now: float,
                *, with_states: bool = True) -> list[dict]:
    """The record of a keyed write, as TransactWriteItems Puts: its fingerprint and, per
    device, the outcome and the device as the answer showed it (``results`` are (device,
    outcome) pairs). The answer is stored compressed, and split over as many items as it
    needs. Only the first item carries the condition that makes the key single-use.

    ``with_states=False`` records each device's version but not its sections: one small item,
    for a transaction whose answer would not fit beside it (DynamoDB's 4 MB and 100
    actions). A replay then reads each device back at its version (``recorded_results``):
    a version's sections never change, so the answer is the same."""
    answer = zlib.compress(dumps([
        {OUTCOME: outcome, "deviceId": device.device_id, "version": device.version,
         **({"state": device.state, "desired": device.desired, "reported": device.reported,
             "entries": device.entries} if with_states else {}),
         "createdAt": device.created_at, "updatedAt": device.updated_at}
        for device, outcome in results]).encode(), 6)
    parts = [answer[offset:offset + PART_BYTES] for offset in range(0, len(answer), PART_BYTES)] or [b""]
    expires = number(int(now) + RECORD_TTL_SECONDS)
    first = {**record_key(partition, key), FINGERPRINT: {"S": key.fingerprint}, ANSWER: {"B": parts[0]},
             PARTS: number(len(parts)), RECORDED_AT: {"S": timestamp(now)}, schema.TTL_ATTRIBUTE: expires}
    expr = Expression()
    puts = [{"Put": {
        "TableName": table_name, "Item": first,
        "ConditionExpression": (f"attribute_not_exists({expr.name(schema.SORT_KEY)}) OR "
                                f"{expr.name(schema.TTL_ATTRIBUTE)} <= {expr.number(now)}"),
        **expr.attributes(),
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }}]
    for index, part in enumerate(parts[1:], start=1):
        puts.append({"Put": {"TableName": table_name, "Item": {
            **part_key(partition, key, index), ANSWER: {"B": part}, schema.TTL_ATTRIBUTE: expires}}})
    for put in puts:
        check_item_size(put["Put"]["Item"])
    return puts


def record_key(partition: str, key: IdempotencyKey) -> dict:
    return {schema.PARTITION_KEY: {"S": partition}, schema.SORT_KEY: {"S": key.sort_key}}


def part_key(partition: str, key: IdempotencyKey, index: int) -> dict:
    """Where part ``index`` (from 1) of a long recorded answer lives."""
    return {schema.PARTITION_KEY: {"S": partition},
            schema.SORT_KEY: {"S": f"{table.IDEMPOTENCY_PART_SK_PREFIX}{index}#{key.scope}#{key.key}"}}


def recorded_results(partition: str, key: IdempotencyKey, record: dict | None, now: float,
                     read_part: Callable[[dict], dict | None],
                     read_device: Callable[[str, int], Device] | None = None) -> list[tuple] | None:
    """The recorded (device, outcome) pairs of a live record, None without one;
    ``IdempotencyKeyReused`` when the key was used for a different request.
    ``read_part(key)`` reads one further part of a long answer; ``read_device(device_id,
    version)`` the device at a version a record holds without its state."""
    if record is None or schema.is_expired(record, now):
        return None
    if record[FINGERPRINT]["S"] != key.fingerprint:
        raise IdempotencyKeyReused(partition, key.key)
    answer = bytes(record[ANSWER]["B"])
    for index in range(1, int(record[PARTS]["N"])):
        part = read_part(part_key(partition, key, index))
        if part is None:
            return None  # expired part by part: the whole record counts as gone
        answer += bytes(part[ANSWER]["B"])
    results = []
    for entry in loads(zlib.decompress(answer)):
        version = int(entry["version"])
        if "state" in entry:
            device = Device(entry["deviceId"], version, entry["state"], entry["createdAt"], entry["updatedAt"],
                            desired=entry.get("desired", {}), reported=entry.get("reported", {}),
                            entries=entry.get("entries", {}))
        else:
            device = read_device(entry["deviceId"], version)
        results.append((replace(device, replayed=True), entry[OUTCOME]))
    return results


REPLAY_HISTORY_WAIT_SECONDS = 5.0  # a replay waits this long for the feed to record a version


class RecordedAnswers:
    def __init__(self, store: Store, history: ChangeLog, runtime: Runtime):
        self._store = store
        self._history = history
        self._runtime = runtime

    def results(self, partition: str, key: IdempotencyKey) -> list[tuple[Device, str]] | None:
        """(device, outcome) per device of the keyed write recorded in ``partition``, or None
        when there is none; ``IdempotencyKeyReused`` when the key was used for another request."""
        record = self._store.get(record_key(partition, key))
        results = recorded_results(partition, key, record, self._runtime.clock(), self._store.get,
                                        self._device_at)
        if results is not None:
            self._runtime.observer.replayed(partition)
        return results

    def _device_at(self, device_id: str, version: int) -> Device:
        """The device at ``version`` (state and sections): its state item while it is there, else the
        feed's history (written a moment after the version; waited for that long)."""
        runtime = self._runtime
        deadline = runtime.monotonic() + REPLAY_HISTORY_WAIT_SECONDS
        while True:
            item = self._store.get_state(device_id)
            if item is not None and schema.VERSION in item and schema.StateItem.of(item).version == version \
                    and schema.STATE in item:
                return Device.from_item(item)
            try:
                return self._history.at_version(device_id, version)
            except VersionNotFound:
                if runtime.monotonic() >= deadline:
                    raise StorageUnavailable(f"the recorded answer of {device_id} at version {version} cannot be "
                                             "read back yet") from None
            runtime.sleep(0.1)
