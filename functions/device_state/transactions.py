"""Multi-device operations for ``DeviceStateManager.transact``: what each one asks, and
how a refused transaction reports which operation failed and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from boto3.dynamodb.conditions import ConditionBase

from .errors import DeviceStateError, ItemTooLarge

MAX_OPERATIONS = 100  # DynamoDB's TransactWriteItems limit (a keyed transaction keeps one for its record)
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024

CREATE, PUT, REPLACE, UPDATE, DELETE, CHECK = "create", "put", "replace", "update", "delete", "check"

# Why an operation failed (the HTTP layer maps these to 404 / 409 / 412 / 409 / 409 / 422 / 423 / 409).
NOT_FOUND, EXISTS, VERSION, CONDITION, TEST_FAILED, NOT_APPLICABLE, LOCKED, LEASE_NOT_HELD = (
    "not-found", "exists", "version", "condition", "patch-test-failed", "patch-not-applicable", "locked",
    "lease-not-held")


@dataclass(frozen=True)
class Operation:
    """One device's part in a transaction. Build with the class methods."""

    device_id: str
    action: str
    state: dict | None = None
    update_fn: Callable[[dict], dict] | None = None
    expected_version: int | None = None
    condition: ConditionBase | None = None

    @classmethod
    def create(cls, device_id: str, state: dict) -> "Operation":
        return cls(device_id, CREATE, state=state)

    @classmethod
    def put(cls, device_id: str, state: dict) -> "Operation":
        """Create, or replace the whole state of an existing device."""
        return cls(device_id, PUT, state=state)

    @classmethod
    def replace(cls, device_id: str, state: dict, expected_version: int | None = None) -> "Operation":
        return cls(device_id, REPLACE, state=state, expected_version=expected_version)

    @classmethod
    def update(cls, device_id: str, update_fn, expected_version: int | None = None,
               condition: ConditionBase | None = None) -> "Operation":
        return cls(device_id, UPDATE, update_fn=update_fn, expected_version=expected_version, condition=condition)

    @classmethod
    def delete(cls, device_id: str, expected_version: int | None = None) -> "Operation":
        return cls(device_id, DELETE, expected_version=expected_version)

    @classmethod
    def check(cls, device_id: str, expected_version: int | None = None,
              condition: ConditionBase | None = None) -> "Operation":
        """Write nothing, but require the device (at a version, under a condition)."""
        return cls(device_id, CHECK, expected_version=expected_version, condition=condition)


@dataclass(frozen=True)
class OperationFailure:
    index: int
    device_id: str
    reason: str
    detail: str
    current: object | None = None  # the Device as it is, where known


class InvalidTransaction(DeviceStateError, ValueError):
    """Refused before anything was sent: no operations, too many, or a device twice."""


class TransactionTooLarge(ItemTooLarge):
    def __init__(self, size: int):
        super().__init__(f"the transaction would be about {size} bytes; DynamoDB's limit is {MAX_TRANSACTION_BYTES}")
        self.limit = "transaction-size"


class TransactionFailed(DeviceStateError):
    """Nothing was written: ``failures`` names each operation that could not apply."""

    def __init__(self, failures: list[OperationFailure]):
        super().__init__("; ".join(f"operation {f.index} ({f.device_id}): {f.detail}" for f in failures))
        self.failures = failures
