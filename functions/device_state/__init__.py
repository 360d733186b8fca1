"""The device-state library: optimistic locking over the DynamoDB ``devices`` table.

Free of HTTP and of Powertools; takes its DynamoDB client and table name as arguments.
"""

from .client import dynamodb_client
from .errors import (
    ConditionFailed,
    DeviceAlreadyExists,
    DeviceLocked,
    DeviceNotFound,
    DesireMoved,
    DeviceStateError,
    FilterTooBroad,
    IdempotencyKeyReused,
    IndexBuilding,
    InvalidFilter,
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
    TooManyConnections,
    UnindexedFilter,
    UnknownLease,
    VersionConflict,
)
from .write.keyed import IdempotencyKey, InvalidIdempotencyKey
from .model.device import Device
from .leases.handle import Lease
from .leases.queue import LeaseGrant, LeaseStatus
from .manager import DeviceStateManager
from .runtime import Backoff
from .runtime import UpdateObserver
from .model.patches import JsonPatch, MergePatch
from .write import transactions  # the public module of transaction operations (kinds, failure reasons)
from .write.transactions import (MAX_OPERATIONS, InvalidTransaction, Operation, OperationFailure, TransactionFailed,
                           TransactionTooLarge)
from .feed.items import CHANGE_SK_PREFIX, Change, change_from_item, device_after
from .feed.log import (DEFAULT_RETENTION_SECONDS, MAX_FEED_LIMIT, MAX_RECORD_AGE_SECONDS, ChangeLog, ChangesExpired,
                      InvalidSince, VersionNotFound, VersionNotRecorded)
from .client import boto3_session
from .model.device import timestamp
from .write.keyed import KEY_PATTERN, fingerprint
from .write.plan import CREATED, DELETED, REPLACED, UPDATED
from .manager import DEFAULT_BUDGET_SECONDS, DEFAULT_MAX_ATTEMPTS, MAX_LIST_LIMIT
from .write.pipeline import DEFAULT_SETTLE_SECONDS
from .model.sections import (DESIRED, DEVICE_SECTIONS, MAX_POINTER_BYTES, METADATA_ENTRY_BYTES, REPORTED, SECTIONS, STATE,
                       delta)
from .model.values import (DEVICE_ID_PATTERN, MAX_EXPONENT, MAX_MEMBER_NAME_BYTES, MAX_PATCH_OPERATIONS,
                     MAX_SIGNIFICANT_DIGITS, MAX_STATE_DEPTH, MAX_VERSION, MIN_EXPONENT, dumps, loads,
                     validate_device_id)
from .write.plan import DEFAULT_TOMBSTONE_SECONDS
from .item.room import MAX_STATE_ITEM_BYTES
from .fleet.index import MAX_FIELDS as MAX_FLEET_FIELDS, FleetIndex, FleetIndexError
from .fleet.query import MAX_COUNT_INDEX_ENTRIES, MAX_COUNT_ITEMS, MAX_LIMIT as MAX_QUERY_LIMIT
from .fleet.cursors import CURSOR_PATTERN, MIN_KEY_BYTES as MIN_CURSOR_KEY_BYTES
from .fleet.rql import MAX_FILTER_CHARS
from .model.connectivity import connectivity_event
from .model.desires import (CONFIRMATION_BYTES, MAX_ACKS, MAX_CLEARED_KEPT, MAX_CLEARED_KEPT_BYTES, MAX_EXPIRY_SECONDS,
                      MAX_REASON_CHARS, MIN_EXPIRY_SECONDS, STATUS_BYTES, Ack, DesireOptions, check_acks)

__all__ = [
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
