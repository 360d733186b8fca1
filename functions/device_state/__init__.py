"""The device-state library: optimistic locking over the DynamoDB ``devices`` table.

Free of HTTP and of Powertools; takes its DynamoDB client and table name as arguments.
"""

from .client import dynamodb_client
from .errors import (
    ConditionFailed,
    DeviceAlreadyExists,
    DeviceLocked,
    DeviceNotFound,
    DeviceStateError,
    IdempotencyKeyReused,
    InvalidCursor,
    InvalidDeviceId,
    InvalidLease,
    InvalidPatch,
    InvalidValue,
    ItemTooLarge,
    LeaseBusy,
    LeaseLost,
    LeaseNotHeld,
    OutcomeUnknown,
    PatchError,
    PatchNotApplicable,
    PatchTestFailed,
    RetriesExhausted,
    StorageError,
    StorageUnavailable,
    UnknownLease,
    VersionConflict,
)
from .idempotency import IdempotencyKey, InvalidIdempotencyKey
from .device import Device
from .leases import Lease, LeaseGrant, LeaseStatus
from .manager import DeviceStateManager
from .retry import Backoff
from .observer import UpdateObserver
from .patches import JsonPatch, MergePatch
from .transactions import InvalidTransaction, Operation, OperationFailure, TransactionFailed, TransactionTooLarge

__all__ = [
    "Backoff",
    "ConditionFailed",
    "Device",
    "DeviceAlreadyExists",
    "DeviceLocked",
    "DeviceNotFound",
    "DeviceStateError",
    "DeviceStateManager",
    "IdempotencyKey",
    "IdempotencyKeyReused",
    "InvalidIdempotencyKey",
    "InvalidCursor",
    "InvalidDeviceId",
    "InvalidLease",
    "InvalidPatch",
    "InvalidTransaction",
    "InvalidValue",
    "ItemTooLarge",
    "JsonPatch",
    "Lease",
    "LeaseBusy",
    "LeaseGrant",
    "LeaseLost",
    "LeaseNotHeld",
    "LeaseStatus",
    "MergePatch",
    "OutcomeUnknown",
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
    "UnknownLease",
    "UpdateObserver",
    "VersionConflict",
    "dynamodb_client",
]
