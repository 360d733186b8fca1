"""Idempotency records: which keyed writes already happened, and what they answered.

A record lives in the device's partition (``sk = "idem#<scope>#<key>"``) and is written in
the same ``TransactWriteItems`` as the device change it describes, under
``attribute_not_exists``: either both land or neither does, so a retry after a lost
response finds the record and replays instead of applying the change again.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from . import table
from .device import Device, timestamp
from .errors import DeviceStateError, IdempotencyKeyReused
from .values import check_item_size, from_attribute, to_attribute

RECORD_TTL_SECONDS = 24 * 60 * 60
KEY_PATTERN = re.compile(r"[\x20-\x7e]{1,255}")
SCOPE_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")

# What a keyed write did; the HTTP layer maps these to 201 / 200 / 204.
CREATED, REPLACED, UPDATED, DELETED, CHECKED = "created", "replaced", "updated", "deleted", "checked"

FINGERPRINT = "fingerprint"
RESULTS = "results"  # per device written: outcome and the device as answered
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
        digest.update(json.dumps(transact_items, sort_keys=True).encode())
        return digest.hexdigest()[:36]


def fingerprint(*parts: str | bytes | None) -> str:
    """A stable digest of the parts of a request that make it the same request."""
    digest = hashlib.sha256()
    for part in parts:
        data = b"" if part is None else part if isinstance(part, bytes) else part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def record_put(table_name: str, partition: str, key: IdempotencyKey, results: list[tuple], now: float) -> dict:
    """The record of a keyed write (a TransactWriteItems Put): its fingerprint and, per
    device, the outcome and the device as the answer showed it. ``results`` are
    (device, outcome) pairs."""
    record = {
        table.PARTITION_KEY: {"S": partition},
        table.SORT_KEY: {"S": key.sort_key},
        FINGERPRINT: {"S": key.fingerprint},
        RESULTS: {"L": [{"M": {
            OUTCOME: {"S": outcome},
            table.PARTITION_KEY: {"S": device.device_id},
            table.VERSION: {"N": str(device.version)},
            table.STATE: to_attribute(device.state),
            table.CREATED_AT: {"S": device.created_at},
            table.UPDATED_AT: {"S": device.updated_at},
        }} for device, outcome in results]},
        RECORDED_AT: {"S": timestamp(now)},
        table.TTL_ATTRIBUTE: {"N": str(int(now) + RECORD_TTL_SECONDS)},
    }
    check_item_size(record)
    return {"Put": {
        "TableName": table_name,
        "Item": record,
        "ConditionExpression": "attribute_not_exists(#sk) OR #expiresAt <= :nowEpoch",
        "ExpressionAttributeNames": {"#sk": table.SORT_KEY, "#expiresAt": table.TTL_ATTRIBUTE},
        "ExpressionAttributeValues": {":nowEpoch": {"N": str(now)}},
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }}


def record_key(partition: str, key: IdempotencyKey) -> dict:
    return {table.PARTITION_KEY: {"S": partition}, table.SORT_KEY: {"S": key.sort_key}}


def recorded_results(partition: str, key: IdempotencyKey, record: dict | None, now: float) -> list[tuple] | None:
    """The recorded (device, outcome) pairs of a live record, None without one;
    ``IdempotencyKeyReused`` when the key was used for a different request."""
    if record is None or table.is_expired(record, now):
        return None
    if record[FINGERPRINT]["S"] != key.fingerprint:
        raise IdempotencyKeyReused(partition, key.key)
    results = []
    for entry in record[RESULTS]["L"]:
        snapshot = entry["M"]
        results.append((Device(
            snapshot[table.PARTITION_KEY]["S"], int(snapshot[table.VERSION]["N"]),
            from_attribute(snapshot[table.STATE]), snapshot[table.CREATED_AT]["S"],
            snapshot[table.UPDATED_AT]["S"], replayed=True), snapshot[OUTCOME]["S"]))
    return results
