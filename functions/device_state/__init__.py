"""The device-state library: optimistic locking over the DynamoDB ``devices`` table.

Free of HTTP and of Powertools; takes its DynamoDB client and table name as arguments.
"""

from . import leases  # its limits; the lease code itself loads when first used (leases/__init__.py)
from .client import boto3_session, dynamodb_client
from .errors import (
    AnswerLost,
    ConditionFailed,
    ConditionNotMet,
    DesireMoved,
    DeviceAlreadyExists,
    DeviceLocked,
    DeviceNotFound,
    DeviceStateError,
    FilterTooBroad,
    IdempotencyKeyReused,
    IndexBuilding,
    InvalidCursor,
    InvalidDeviceId,
    InvalidFilter,
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
    RequestRefused,
    RetriesExhausted,
    StorageError,
    StorageUnavailable,
    TooManyConnections,
    UnindexedFilter,
    UnknownLease,
    VersionConflict,
)
from .feed.items import CHANGE_SK_PREFIX, Change, change_from_item, device_after
from .feed.log import (
    DEFAULT_RETENTION_SECONDS,
    MAX_FEED_LIMIT,
    MAX_RECORD_AGE_SECONDS,
    ChangeLog,
    ChangesExpired,
    InvalidSince,
    VersionNotFound,
    VersionNotRecorded,
)
from .fleet.cursors import CURSOR_PATTERN
from .fleet.cursors import MIN_KEY_BYTES as MIN_CURSOR_KEY_BYTES
from .fleet.index import MAX_FIELDS as MAX_FLEET_FIELDS
from .fleet.index import FleetIndex, FleetIndexError
from .fleet.limits import MAX_COUNT_INDEX_ENTRIES, MAX_COUNT_ITEMS, MAX_FILTER_CHARS, MAX_LIST_LIMIT
from .fleet.limits import MAX_LIMIT as MAX_QUERY_LIMIT
from .item.room import MAX_STATE_ITEM_BYTES
from .manager import DEFAULT_BUDGET_SECONDS, DEFAULT_MAX_ATTEMPTS, DeviceStateManager
from .model.connectivity import connectivity_event
from .model.desires import (
    CONFIRMATION_BYTES,
    MAX_ACKS,
    MAX_CLEARED_KEPT,
    MAX_CLEARED_KEPT_BYTES,
    MAX_EXPIRY_SECONDS,
    MAX_REASON_CHARS,
    MIN_EXPIRY_SECONDS,
    STATUS_BYTES,
    Ack,
    DesireOptions,
    check_acks,
)
from .model.device import Device, timestamp
from .model.patches import JsonPatch, MergePatch
from .model.sections import (
    DESIRED,
    DEVICE_SECTIONS,
    MAX_POINTER_BYTES,
    METADATA_ENTRY_BYTES,
    REPORTED,
    SECTIONS,
    STATE,
    delta,
)
from .model.values import (
    DEVICE_ID_PATTERN,
    MAX_EXPONENT,
    MAX_MEMBER_NAME_BYTES,
    MAX_PATCH_OPERATIONS,
    MAX_SIGNIFICANT_DIGITS,
    MAX_STATE_DEPTH,
    MAX_VERSION,
    MIN_EXPONENT,
    dumps,
    loads,
    validate_device_id,
)
from .runtime import Backoff, UpdateObserver
from .write import transactions  # the public module of transaction operations (kinds, failure reasons)
from .write.keyed import KEY_PATTERN, IdempotencyKey, InvalidIdempotencyKey, fingerprint
from .write.pipeline import DEFAULT_SETTLE_SECONDS
from .write.plan import CREATED, DEFAULT_TOMBSTONE_SECONDS, DELETED, REPLACED, UPDATED
from .write.transactions import (
    MAX_OPERATIONS,
    InvalidTransaction,
    Operation,
    OperationFailure,
    TransactionFailed,
    TransactionTooLarge,
)

_LEASE_NAMES = ("Lease", "LeaseGrant", "LeaseStatus")


def __getattr__(name: str):
    if name in _LEASE_NAMES:  # from the lease code, loaded on first use like the rest of it
        return getattr(leases, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AnswerLost",
    "ConditionNotMet",
    "RequestRefused",
    "Ack",
    "TooManyConnections",
    "check_acks",
    "CONFIRMATION_BYTES",
    "connectivity_event",
    "DesireMoved",
    "DesireOptions",
    "MAX_ACKS",
    "MAX_CLEARED_KEPT",
    "MAX_CLEARED_KEPT_BYTES",
    "MAX_COUNT_INDEX_ENTRIES",
    "MAX_COUNT_ITEMS",
    "MAX_EXPIRY_SECONDS",
    "MAX_REASON_CHARS",
    "MIN_EXPIRY_SECONDS",
    "STATUS_BYTES",
    "FilterTooBroad",
    "FleetIndex",
    "FleetIndexError",
    "IndexBuilding",
    "InvalidFilter",
    "MAX_FILTER_CHARS",
    "MAX_FLEET_FIELDS",
    "MAX_QUERY_LIMIT",
    "UnindexedFilter",
    "Backoff",
    "boto3_session",
    "Change",
    "CHANGE_SK_PREFIX",
    "ChangeLog",
    "change_from_item",
    "device_after",
    "ChangesExpired",
    "ConditionFailed",
    "CREATED",
    "CURSOR_PATTERN",
    "DEFAULT_BUDGET_SECONDS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_RETENTION_SECONDS",
    "DEFAULT_SETTLE_SECONDS",
    "DEFAULT_TOMBSTONE_SECONDS",
    "DELETED",
    "delta",
    "DESIRED",
    "Device",
    "DEVICE_ID_PATTERN",
    "DEVICE_SECTIONS",
    "DeviceAlreadyExists",
    "DeviceLocked",
    "DeviceNotFound",
    "DeviceStateError",
    "DeviceStateManager",
    "dumps",
    "dynamodb_client",
    "fingerprint",
    "IdempotencyKey",
    "IdempotencyKeyReused",
    "InvalidCursor",
    "InvalidDeviceId",
    "InvalidIdempotencyKey",
    "InvalidLease",
    "InvalidPatch",
    "InvalidSince",
    "InvalidTransaction",
    "InvalidValue",
    "ItemTooLarge",
    "JsonPatch",
    "KEY_PATTERN",
    "Lease",
    "LeaseBusy",
    "LeaseGrant",
    "LeaseLost",
    "LeaseNotHeld",
    "LeaseStatus",
    "loads",
    "MAX_EXPONENT",
    "MAX_FEED_LIMIT",
    "MAX_LIST_LIMIT",
    "MAX_MEMBER_NAME_BYTES",
    "MAX_OPERATIONS",
    "MAX_PATCH_OPERATIONS",
    "MAX_POINTER_BYTES",
    "MAX_RECORD_AGE_SECONDS",
    "MAX_SIGNIFICANT_DIGITS",
    "MAX_STATE_DEPTH",
    "MAX_STATE_ITEM_BYTES",
    "MAX_VERSION",
    "MergePatch",
    "MIN_CURSOR_KEY_BYTES",
    "METADATA_ENTRY_BYTES",
    "MIN_EXPONENT",
    "Operation",
    "OperationFailure",
    "OutcomeUnknown",
    "PatchError",
    "PatchNotApplicable",
    "PatchTestFailed",
    "REPLACED",
    "REPORTED",
    "RetriesExhausted",
    "SECTIONS",
    "STATE",
    "StorageError",
    "StorageUnavailable",
    "timestamp",
    "TransactionFailed",
    "TransactionTooLarge",
    "transactions",
    "UnknownLease",
    "UPDATED",
    "UpdateObserver",
    "validate_device_id",
    "VersionConflict",
    "VersionNotFound",
    "VersionNotRecorded",
]
