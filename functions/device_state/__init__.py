"""The device-state library: optimistic locking over the DynamoDB ``devices`` table.

Free of HTTP and of Powertools; takes its DynamoDB client and table name as arguments.
"""

from .client import dynamodb_client
from .errors import (
    ConditionFailed,
    DeviceAlreadyExists,
    DeviceNotFound,
    DeviceStateError,
    IdempotencyKeyReused,
    InvalidCursor,
    InvalidDeviceId,
    InvalidPatch,
    InvalidValue,
    ItemTooLarge,
    PatchError,
    PatchNotApplicable,
    PatchTestFailed,
    RetriesExhausted,
    StorageError,
    StorageUnavailable,
    VersionConflict,
)
from .idempotency import IdempotencyKey, InvalidIdempotencyKey
from .manager import Backoff, Device, DeviceStateManager
from .observer import UpdateObserver
from .patches import JsonPatch, MergePatch
from .transactions import InvalidTransaction, Operation, OperationFailure, TransactionFailed, TransactionTooLarge

__all__ = [
    "Backoff",
    "ConditionFailed",
    "Device",
    "DeviceAlreadyExists",
    "DeviceNotFound",
    "DeviceStateError",
    "DeviceStateManager",
    "IdempotencyKey",
    "IdempotencyKeyReused",
    "InvalidIdempotencyKey",
    "InvalidCursor",
    "InvalidDeviceId",
    "InvalidPatch",
    "InvalidTransaction",
    "InvalidValue",
    "ItemTooLarge",
    "JsonPatch",
    "MergePatch",
    "Operation",
    "OperationFailure",
    "PatchError",
    "PatchNotApplicable",
    "PatchTestFailed",
    "RetriesExhausted",
    "StorageError",
    "StorageUnavailable",
    "TransactionFailed",
    "TransactionTooLarge",
    "UpdateObserver",
    "VersionConflict",
    "dynamodb_client",
]
