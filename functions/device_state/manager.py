"""DeviceStateManager: version-based optimistic locking over the ``devices`` table."""

from __future__ import annotations

import base64
import binascii
import copy
import json
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from boto3.dynamodb.conditions import ConditionBase, ConditionExpressionBuilder
from botocore.exceptions import BotoCoreError, ClientError

from . import idempotency as idem
from . import table
from .errors import (
    ConditionFailed,
    DeviceAlreadyExists,
    DeviceNotFound,
    IdempotencyKeyReused,
    InvalidCursor,
    InvalidValue,
    ItemTooLarge,
    RetriesExhausted,
    StorageError,
    StorageUnavailable,
    VersionConflict,
)
from .errors import DeviceLocked, LeaseNotHeld, PatchNotApplicable, PatchTestFailed
from . import leases
from .idempotency import CHECKED, CREATED, DELETED, REPLACED, UPDATED, IdempotencyKey
from . import transactions as tx
from .transactions import Operation, OperationFailure, TransactionFailed
from .observer import NULL_OBSERVER, UpdateObserver
from .values import (
    DEVICE_ID_PATTERN,
    check_item_size,
    check_state,
    from_attribute,
    item_size,
    to_attribute,
    validate_device_id,
)

logger = logging.getLogger("device_state")

UpdateFn = Callable[[dict], dict]

DEFAULT_MAX_ATTEMPTS = 25
DEFAULT_BUDGET_SECONDS = 5.0
MAX_LIST_LIMIT = 100
MAX_SCAN_CALLS_PER_PAGE = 4  # a listing page never costs more than this many Scan calls

_THROTTLING_CODES = frozenset(
    {"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"}
)

# Fixed placeholders; boto3's ConditionExpressionBuilder names a caller's condition
# #n0.. and :v0.., so the two never collide.
_NAMES = {
    "#pk": table.PARTITION_KEY,
    "#state": table.STATE,
    "#version": table.VERSION,
    "#createdAt": table.CREATED_AT,
    "#updatedAt": table.UPDATED_AT,
    "#expiresAt": table.TTL_ATTRIBUTE,
    "#writeId": table.WRITE_ID,
    "#leaseToken": table.LEASE_TOKEN,
    "#leaseUntil": table.LEASE_UNTIL,
}
_LIVE = "(attribute_not_exists(#expiresAt) OR #expiresAt > :nowEpoch)"
_EXISTS = f"attribute_exists(#pk) AND {_LIVE}"
_ABSENT = "(attribute_not_exists(#pk) OR #expiresAt <= :nowEpoch)"


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: attempt n sleeps U(0, min(cap, base * 2^(n-1)))."""

    base_seconds: float = 0.01
    cap_seconds: float = 0.5

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.cap_seconds, self.base_seconds * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class Device:
    device_id: str
    version: int
    state: dict
    created_at: str
    updated_at: str
    # True when a keyed write was answered from its idempotency record (nothing written).
    replayed: bool = field(default=False, compare=False)

    @classmethod
    def from_item(cls, item: dict) -> "Device":
        return cls(
            device_id=item[table.PARTITION_KEY]["S"],
            version=int(item[table.VERSION]["N"]),
            state=from_attribute(item[table.STATE]),
            created_at=item[table.CREATED_AT]["S"],
            updated_at=item[table.UPDATED_AT]["S"],
        )

    def as_dict(self) -> dict:
        """The resource as the API shows it."""
        return {
            "deviceId": self.device_id,
            "version": self.version,
            "state": self.state,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        }


class _Rejected(Exception):
    """A conditional check failed; ``item`` is the item as it was (ALL_OLD), if any."""

    def __init__(self, item: dict | None):
        super().__init__("conditional check failed")
        self.item = item


class _Invalid(StorageError):
    """DynamoDB's ValidationException: a fault elsewhere, but an expected refusal of a
    compiled patch (then read-modify-write decides)."""


class _Cancelled(Exception):
    """A transaction was cancelled; ``reasons`` are DynamoDB's, one per action, in order."""

    def __init__(self, reasons: list[dict]):
        super().__init__("transaction cancelled")
        self.reasons = reasons


class _Moved(Exception):
    """Another writer got there first; ``item`` is the newer live item when known."""

    def __init__(self, item: dict | None):
        super().__init__("moved")
        self.item = item


@dataclass(frozen=True)
class _Planned:
    """One write, ready to send alone or inside a transaction (TransactWriteItems form)."""

    request: dict
    device: Device  # the device after the write (for a delete: as it was)
    outcome: str
    expected_version: int | None
    write_id: str | None


def _timestamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )


def _number(value: int | float) -> dict:
    return {"N": str(value)}


class DeviceStateManager:
    """Reads and writes device state items with version-based optimistic locking.

    Takes its DynamoDB (low-level) client and table name; holds no global state.
    ``clock``, ``monotonic``, ``sleep`` and ``rng`` are there so tests can drive time.
    """

    def __init__(
        self,
        client,
        table_name: str,
        *,
        observer: UpdateObserver = NULL_OBSERVER,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        budget_seconds: float = DEFAULT_BUDGET_SECONDS,
        backoff: Backoff = Backoff(),
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ):
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._client = client
        self.table_name = table_name
        self.observer = observer
        self.max_attempts = max_attempts
        self.budget_seconds = budget_seconds
        self.backoff = backoff
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._lease_tokens: dict = {}

    def fenced(self, tokens: dict) -> "DeviceStateManager":
        """This manager, writing under lease fencing tokens: ``{device_id: token}`` (an
        int, or a ``Lease``, which also refuses once it is lost). A write to a device
        with an active lease must present that lease's token, and a write that presents
        a token succeeds only while that lease is the active one."""
        view = copy.copy(self)
        view._lease_tokens = {**self._lease_tokens, **tokens}
        return view

    def lease(self, device_id: str, ttl_seconds: float = leases.DEFAULT_TTL_SECONDS,
              wait_seconds: float = 0, *, owner: str | None = None) -> "leases.Lease":
        """A FIFO lease on the device (not yet acquired): use it as a context manager
        (acquires, heartbeats in the background, releases on exit) or call
        ``acquire()``, ``heartbeat()`` and ``release()``. See ``leases.py``."""
        return leases.Lease(leases.LeaseQueue(self), device_id, ttl_seconds, wait_seconds, owner)

    def lease_queue(self) -> "leases.LeaseQueue":
        """The lease protocol by lease id, for callers that hold no ``Lease`` object (HTTP)."""
        return leases.LeaseQueue(self)

    # ----------------------------------------------------------------- reads

    def get(self, device_id: str) -> Device:
        """Strongly consistent read of a device; ``DeviceNotFound`` when absent or expired."""
        return Device.from_item(self._read(device_id))

    def list_devices(self, limit: int = 50, cursor: str | None = None) -> tuple[list[Device], str | None]:
        """One page of devices and the opaque cursor of the next page (None at the end).

        A page costs at most ``MAX_SCAN_CALLS_PER_PAGE`` Scan calls of at most ``limit``
        items each, so it may hold fewer than ``limit`` devices while a cursor remains.
        """
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValueError(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}")
        start_key = _decode_cursor(cursor) if cursor is not None else None
        devices: list[Device] = []
        for _ in range(MAX_SCAN_CALLS_PER_PAGE):
            request = {
                "TableName": self.table_name,
                "Limit": limit - len(devices),
                "ConsistentRead": True,
                "FilterExpression": f"#sk = :stateSk AND {_LIVE}",
                "ExpressionAttributeNames": {"#sk": table.SORT_KEY, "#expiresAt": table.TTL_ATTRIBUTE},
                "ExpressionAttributeValues": {
                    ":stateSk": {"S": table.STATE_SK},
                    ":nowEpoch": _number(int(self._clock())),
                },
            }
            if start_key:
                request["ExclusiveStartKey"] = start_key
            page = self._call("scan", **request)
            devices.extend(Device.from_item(item) for item in page.get("Items", []))
            start_key = page.get("LastEvaluatedKey")
            if not start_key or len(devices) >= limit:
                break
        return devices, _encode_cursor(start_key) if start_key else None

    # ---------------------------------------------------------------- writes
    #
    # Every write takes an optional ``idempotency`` key. Without one it is a single
    # conditional DynamoDB write. With one, the change and its idempotency record go in one
    # TransactWriteItems, and a write whose record exists is answered from the record
    # (``Device.replayed`` is then True) without touching the device.

    def create(self, device_id: str, state: dict, *, idempotency: IdempotencyKey | None = None) -> Device:
        """Create a device at version 1; ``DeviceAlreadyExists`` if it exists."""
        validate_device_id(device_id)
        check_state(state)
        if idempotency is not None:
            return self._keyed(device_id, idempotency, lambda item: self._plan_create(device_id, state, item))[0]
        planned = self._plan_create(device_id, state, None)
        try:
            self._call("put_item", **planned.request["Put"])
        except _Rejected as rejected:
            raise DeviceAlreadyExists(device_id, self._live_device(rejected.item)) from None
        return planned.device

    def put(self, device_id: str, state: dict, *, idempotency: IdempotencyKey | None = None) -> tuple[Device, bool]:
        """Create the device or replace its whole state; returns (device, created)."""
        validate_device_id(device_id)
        check_state(state)
        if idempotency is not None:
            device, outcome = self._keyed(device_id, idempotency, lambda item: (
                self._plan_create(device_id, state, None) if item is None
                else self._plan_state(item, lambda _: state, None, REPLACED)))
            return device, outcome == CREATED
        self._check_state_fits(device_id, state)
        now = self._clock()
        names = _names("#state", "#updatedAt", "#createdAt", "#version", "#expiresAt")
        values = {":state": to_attribute(state), ":now": {"S": _timestamp(now)}, ":one": _number(1),
                  ":nowEpoch": _number(now)}
        condition = f"{_LIVE} AND {self._fence(device_id, names, values)}"
        try:
            attributes = self._call(
                "update_item",
                TableName=self.table_name,
                Key=table.state_key(device_id),
                UpdateExpression=(
                    "SET #state = :state, #updatedAt = :now, "
                    "#createdAt = if_not_exists(#createdAt, :now) ADD #version :one"
                ),
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )["Attributes"]
        except _Rejected as rejected:
            fenced = self._lease_error(device_id, self._raw_live(rejected.item))
            if fenced is not None:
                raise fenced from None
            # Otherwise only an expired item fails the condition: it counts as absent, so create anew.
            return self.create(device_id, state), True
        device = Device.from_item(attributes)
        return device, device.version == 1

    def replace(self, device_id: str, state: dict, expected_version: int | None = None, *,
                idempotency: IdempotencyKey | None = None) -> Device:
        """Replace the whole state. With ``expected_version`` only at that version;
        without it a deliberate clobber (DynamoDBMapper's CLOBBER) that still bumps the
        version by exactly one."""
        validate_device_id(device_id)
        check_state(state)
        if idempotency is not None:
            return self._keyed(device_id, idempotency, lambda item: self._plan_state(
                self._expect(device_id, item, expected_version), lambda _: state, None, REPLACED))[0]
        self._check_state_fits(device_id, state)
        now = self._clock()
        values = {":state": to_attribute(state), ":now": {"S": _timestamp(now)}, ":nowEpoch": _number(now)}
        if expected_version is None:
            update = "SET #state = :state, #updatedAt = :now ADD #version :one"
            condition = _EXISTS
            values[":one"] = _number(1)
        else:
            update = "SET #state = :state, #updatedAt = :now, #version = :next"
            condition = f"#version = :expected AND {_LIVE}"
            values[":expected"] = _number(expected_version)
            values[":next"] = _number(expected_version + 1)
        names = _names_in(update + condition)
        condition += " AND " + self._fence(device_id, names, values)
        try:
            attributes = self._call(
                "update_item",
                TableName=self.table_name,
                Key=table.state_key(device_id),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )["Attributes"]
        except _Rejected as rejected:
            raise self._rejection(device_id, expected_version, rejected.item) from None
        return Device.from_item(attributes)

    def update(
        self,
        device_id: str,
        update_fn: UpdateFn,
        expected_version: int,
        *,
        condition: ConditionBase | None = None,
        idempotency: IdempotencyKey | None = None,
    ) -> Device:
        """One conditional attempt (the ``If-Match`` path): apply ``update_fn`` to the
        state at ``expected_version``; ``VersionConflict`` if the device is elsewhere."""
        validate_device_id(device_id)
        if idempotency is not None:
            return self._keyed(device_id, idempotency, lambda item: self._plan_state(
                self._expect(device_id, item, expected_version), update_fn, condition, UPDATED))[0]
        started = self._monotonic()
        item = self._expect(device_id, self._read_optional(device_id), expected_version)
        self.observer.attempt(device_id, 1)
        try:
            device = self._write(self._plan_state(item, update_fn, condition, UPDATED))
        except _Rejected as rejected:
            raise self._rejection(device_id, expected_version, rejected.item) from None
        self.observer.succeeded(device_id, 1, self._monotonic() - started)
        return device

    def update_with_retry(
        self,
        device_id: str,
        update_fn: UpdateFn,
        *,
        condition: ConditionBase | None = None,
        max_attempts: int | None = None,
        budget_seconds: float | None = None,
        idempotency: IdempotencyKey | None = None,
    ) -> Device:
        """Read, apply the pure ``update_fn`` to a copy of the state, and write it under
        ``version = :expected``; when another writer got there first, re-apply it to
        the newer state: at once to the item the failed write returned after a first
        conflict, and after a full-jitter backoff and a fresh read after later ones (a
        returned item is stale once we have slept). Gives up with ``RetriesExhausted``,
        having written nothing, after ``max_attempts`` or when the next sleep would cross
        ``budget_seconds``.

        ``condition`` (boto3 ``Attr(...)`` conditions, e.g. ``Attr("state.online").eq(True)``)
        is ANDed with the version check; when it is false ``ConditionFailed`` is raised
        at once. An exception from ``update_fn`` propagates at once, nothing written.
        """
        validate_device_id(device_id)

        def plan(item):
            return self._plan_state(self._expect(device_id, item, None), update_fn, condition, UPDATED)

        if idempotency is not None:
            return self._keyed(device_id, idempotency, plan, max_attempts=max_attempts,
                               budget_seconds=budget_seconds)[0]
        # A caller's own condition keeps read-modify-write, which tells its failure apart.
        compiled = self._compiled_update(device_id, update_fn) if condition is None else None
        if compiled is not None:
            return compiled

        def attempt(item, number):
            planned = plan(item)
            self.observer.attempt(device_id, number)
            try:
                return self._write(planned)
            except _Rejected as rejected:
                raise self._moved_or_error(device_id, planned.expected_version, rejected.item) from None

        return self._with_retries(device_id, attempt, max_attempts, budget_seconds)

    def delete(self, device_id: str, expected_version: int | None = None, *,
               idempotency: IdempotencyKey | None = None) -> Device:
        """Delete a device (version-checked when ``expected_version`` is given) and
        return it as it was."""
        validate_device_id(device_id)
        if idempotency is not None:
            return self._keyed(device_id, idempotency, lambda item: self._plan_delete(
                self._expect(device_id, item, expected_version)))[0]
        now = self._clock()
        condition = _EXISTS
        values = {":nowEpoch": _number(now)}
        if expected_version is not None:
            condition += " AND #version = :expected"
            values[":expected"] = _number(expected_version)
        names = _names_in(condition)
        condition += " AND " + self._fence(device_id, names, values)
        try:
            old = self._call(
                "delete_item",
                TableName=self.table_name,
                Key=table.state_key(device_id),
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )["Attributes"]
        except _Rejected as rejected:
            raise self._rejection(device_id, expected_version, rejected.item) from None
        return Device.from_item(old)

    def transact(self, operations: list[Operation], *, idempotency: IdempotencyKey | None = None,
                 max_attempts: int | None = None, budget_seconds: float | None = None) -> list[Device]:
        """All-or-nothing changes to up to 100 devices (99 with an idempotency key, whose
        record is one more action). Reads every device (consistently, in one batch),
        applies each operation to it, and writes one TransactWriteItems with every
        version condition. When a version moved under an operation without an expected
        version, or DynamoDB reports a TransactionConflict, it reads again and retries
        with backoff inside the attempt and time budget; any other failure raises
        ``TransactionFailed`` naming each failing operation, with nothing written.
        Returns the devices in order: after the write, as deleted, or as checked."""
        operations = list(operations)
        limit = tx.MAX_OPERATIONS - (1 if idempotency else 0)
        if not 1 <= len(operations) <= limit:
            raise tx.InvalidTransaction(f"a transaction has 1 to {limit} operations, not {len(operations)}")
        seen = set()
        for operation in operations:
            if not isinstance(operation, Operation):
                raise tx.InvalidTransaction("operations must be Operation objects")
            validate_device_id(operation.device_id)
            if operation.device_id in seen:
                raise tx.InvalidTransaction(f"device {operation.device_id!r} appears more than once")
            seen.add(operation.device_id)
            if operation.state is not None:
                check_state(operation.state)
        partition = operations[0].device_id  # where a keyed transaction's record lives
        if idempotency is not None:
            replay = self._replay_all(partition, idempotency, self._read_record(partition, idempotency))
            if replay is not None:
                return [device for device, _ in replay]

        def attempt(_item, number):
            items = self._batch_read([operation.device_id for operation in operations])
            planned, failures = [], []
            for index, operation in enumerate(operations):
                try:
                    planned.append(self._plan_operation(operation, items.get(operation.device_id)))
                except (DeviceNotFound, DeviceAlreadyExists, VersionConflict, PatchTestFailed,
                        PatchNotApplicable) as error:
                    failures.append(_failure_of(index, operation, error))
            if failures:
                raise TransactionFailed(failures)
            requests = [plan.request for plan in planned]
            if idempotency is not None:
                requests.append(self._record_put(partition, idempotency, planned))
            size = sum(item_size(_written_attributes(request)) for request in requests)
            if size > tx.MAX_TRANSACTION_BYTES:
                raise tx.TransactionTooLarge(size)
            token = (idempotency.client_request_token(self.table_name, partition, requests) if idempotency
                     else uuid.uuid4().hex)
            try:
                self._call("transact_write_items", TransactItems=requests, ClientRequestToken=token)
            except _Cancelled as cancelled:
                reasons = cancelled.reasons
                if idempotency is not None and len(reasons) > len(planned) \
                        and reasons[-1].get("Code") == "ConditionalCheckFailed":
                    replay = self._replay_all(partition, idempotency, self._read_record(partition, idempotency))
                    if replay is not None:
                        return [device for device, _ in replay]
                failures, retry_reason = [], None
                for index, (operation, plan, reason) in enumerate(zip(operations, planned, reasons)):
                    code = reason.get("Code")
                    if code in (None, "None"):
                        continue
                    if code == "TransactionConflict":
                        retry_reason = "conflict"
                        continue
                    if code != "ConditionalCheckFailed":
                        raise StorageError(f"transaction cancelled: {reasons}") from None
                    failure = self._cancelled_operation(index, operation, plan, self._raw_live(reason.get("Item")))
                    if failure is None:
                        retry_reason = retry_reason or "version"
                    else:
                        failures.append(failure)
                if failures:
                    raise TransactionFailed(failures) from None
                self.observer.transaction_retried(retry_reason or "unknown")
                raise _Moved(None) from None
            self.observer.transaction_committed(len(operations), number)
            return [plan.device for plan in planned]

        return self._with_retries(partition, attempt, max_attempts, budget_seconds, read_item=False)

    def _cancelled_operation(self, index: int, operation: Operation, plan: _Planned,
                             old: dict | None) -> OperationFailure | None:
        """Why one operation's condition failed, or None when a retry may still succeed
        (its device moved under an operation that named no version)."""
        if plan.outcome == CREATED:
            if old is not None and operation.action == tx.CREATE:
                return OperationFailure(index, operation.device_id, tx.EXISTS, "the device exists",
                                        Device.from_item(old))
            return None
        if old is None:
            return OperationFailure(index, operation.device_id, tx.NOT_FOUND, "the device does not exist")
        current = Device.from_item(old)
        fenced = self._lease_error(operation.device_id, old) if operation.action != tx.CHECK else None
        if fenced is not None:
            reason = tx.LOCKED if isinstance(fenced, DeviceLocked) else tx.LEASE_NOT_HELD
            return OperationFailure(index, operation.device_id, reason, str(fenced), current)
        if current.version != plan.expected_version:
            if operation.expected_version is None:
                return None
            return OperationFailure(index, operation.device_id, tx.VERSION,
                                    f"the device is at version {current.version}, not {operation.expected_version}",
                                    current)
        return OperationFailure(index, operation.device_id, tx.CONDITION, "the condition is not met", current)

    def _batch_read(self, device_ids: list[str]) -> dict[str, dict]:
        """The live state items of up to 100 devices, strongly consistent, in one batch."""
        found: dict[str, dict] = {}
        pending = [table.state_key(device_id) for device_id in device_ids]
        for round_no in range(1, 11):
            response = self._call("batch_get_item", RequestItems={
                self.table_name: {"Keys": pending, "ConsistentRead": True}})
            for item in response.get("Responses", {}).get(self.table_name, []):
                live = self._raw_live(item)
                if live is not None:
                    found[live[table.PARTITION_KEY]["S"]] = live
            pending = response.get("UnprocessedKeys", {}).get(self.table_name, {}).get("Keys", [])
            if not pending:
                return found
            self._sleep(self.backoff.delay(round_no, self._rng))
        raise StorageUnavailable("DynamoDB left keys unprocessed after 10 batch reads")

    # ------------------------------------------------------- planned writes

    def _expect(self, device_id: str, item: dict | None, expected_version: int | None) -> dict:
        """The live item, checked against the version the caller expects (if any)."""
        if item is None:
            raise DeviceNotFound(device_id)
        if expected_version is not None:
            current = Device.from_item(item)
            if current.version != expected_version:
                raise self._conflict(device_id, expected_version, current)
        return item

    def _plan_create(self, device_id: str, state: dict, item: dict | None) -> _Planned:
        if item is not None:
            raise DeviceAlreadyExists(device_id, Device.from_item(item))
        check_state(state)
        now = self._clock()
        stamp = _timestamp(now)
        new_item = {
            **table.state_key(device_id),
            table.VERSION: _number(1),
            table.STATE: to_attribute(state),
            table.CREATED_AT: {"S": stamp},
            table.UPDATED_AT: {"S": stamp},
        }
        check_item_size(new_item)
        request = {"Put": {
            "TableName": self.table_name,
            "Item": new_item,
            "ConditionExpression": _ABSENT,
            "ExpressionAttributeNames": _names("#pk", "#expiresAt"),
            "ExpressionAttributeValues": {":nowEpoch": _number(now)},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }}
        return _Planned(request, Device.from_item(new_item), CREATED, None, None)

    def _plan_state(self, item: dict, update_fn: UpdateFn, condition, outcome: str) -> _Planned:
        """A conditional write of ``update_fn(state)`` over the live ``item``, at its version."""
        current = Device.from_item(item)
        new_state = _apply(update_fn, current)
        check_state(new_state)
        now = self._clock()
        stamp = _timestamp(now)
        next_version = current.version + 1
        state_attribute = to_attribute(new_state)
        write_id = uuid.uuid4().hex
        check_item_size({**item, table.STATE: state_attribute, table.VERSION: _number(next_version),
                         table.UPDATED_AT: {"S": stamp}, table.WRITE_ID: {"S": write_id}})
        names = _names("#state", "#version", "#updatedAt", "#expiresAt", "#writeId")
        values = {
            ":state": state_attribute,
            ":expected": _number(current.version),
            ":next": _number(next_version),
            ":now": {"S": stamp},
            ":nowEpoch": _number(now),
            ":writeId": {"S": write_id},
        }
        expression = f"#version = :expected AND {_LIVE} AND {self._fence(current.device_id, names, values)}"
        expression = _and_condition(expression, names, values, condition)
        request = {"Update": {
            "TableName": self.table_name,
            "Key": table.state_key(current.device_id),
            "UpdateExpression": "SET #state = :state, #version = :next, #updatedAt = :now, #writeId = :writeId",
            "ConditionExpression": expression,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }}
        device = Device(current.device_id, next_version, new_state, current.created_at, stamp)
        return _Planned(request, device, outcome, current.version, write_id)

    def _plan_delete(self, item: dict) -> _Planned:
        current = Device.from_item(item)
        names = _names("#version", "#expiresAt")
        values = {":expected": _number(current.version), ":nowEpoch": _number(self._clock())}
        request = {"Delete": {
            "TableName": self.table_name,
            "Key": table.state_key(current.device_id),
            "ConditionExpression": f"#version = :expected AND {_LIVE} AND "
                                   + self._fence(current.device_id, names, values),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }}
        return _Planned(request, current, DELETED, current.version, None)

    def _plan_check(self, item: dict, condition: ConditionBase | None) -> _Planned:
        current = Device.from_item(item)
        names = _names("#version", "#expiresAt")
        values = {":expected": _number(current.version), ":nowEpoch": _number(self._clock())}
        expression = _and_condition(f"#version = :expected AND {_LIVE}", names, values, condition)
        request = {"ConditionCheck": {
            "TableName": self.table_name,
            "Key": table.state_key(current.device_id),
            "ConditionExpression": expression,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }}
        return _Planned(request, current, CHECKED, current.version, None)

    def _plan_operation(self, operation: Operation, item: dict | None) -> _Planned:
        action, device_id = operation.action, operation.device_id
        if action == tx.CREATE or (action == tx.PUT and item is None):
            return self._plan_create(device_id, operation.state, item)
        if action == tx.PUT:
            return self._plan_state(item, lambda _: operation.state, None, REPLACED)
        item = self._expect(device_id, item, operation.expected_version)
        if action == tx.REPLACE:
            return self._plan_state(item, lambda _: operation.state, None, REPLACED)
        if action == tx.UPDATE:
            return self._plan_state(item, operation.update_fn, operation.condition, UPDATED)
        if action == tx.DELETE:
            return self._plan_delete(item)
        return self._plan_check(item, operation.condition)

    def _write(self, planned: _Planned) -> Device:
        """One conditional update without a record. A botocore retry of a write whose
        response was lost fails its own version check; the item it returns then carries
        this attempt's write id, which shows the write landed (exactly once)."""
        try:
            self._call("update_item", **planned.request["Update"])
        except _Rejected as rejected:
            if rejected.item and rejected.item.get(table.WRITE_ID, {}).get("S") == planned.write_id:
                return planned.device
            raise
        return planned.device

    def _compiled_update(self, device_id: str, update_fn) -> Device | None:
        """Apply a patch that compiles to one UpdateItem: no read, and nothing for another
        writer to invalidate, so no conflict. None when it does not compile, or DynamoDB
        refuses it (a guard, a missing parent, a type): read-modify-write then decides."""
        compile_patch = getattr(update_fn, "compile", None)
        compiled = compile_patch() if compile_patch else None
        if compiled is None:
            return None
        try:
            check_state({"values": list(compiled.values.values())})
            values = {key: to_attribute(value) for key, value in compiled.values.items()}
        except (InvalidValue, TypeError, ArithmeticError):
            return None
        started = self._monotonic()
        now = self._clock()
        write_id = uuid.uuid4().hex
        names = {**_names("#pk", "#state", "#version", "#updatedAt", "#expiresAt", "#writeId"), **compiled.names}
        values.update({":one": _number(1), ":now": {"S": _timestamp(now)}, ":nowEpoch": _number(now),
                       ":writeId": {"S": write_id}})
        update = "SET " + ", ".join(compiled.sets + [
            "#version = #version + :one", "#updatedAt = :now", "#writeId = :writeId"])
        if compiled.removes:
            update += " REMOVE " + ", ".join(compiled.removes)
        # No version check here, so a resend of this very request must fail on its own write id.
        not_resent = "(attribute_not_exists(#writeId) OR #writeId <> :writeId)"
        expression = " AND ".join([_EXISTS, not_resent, self._fence(device_id, names, values), *compiled.conditions])
        self.observer.attempt(device_id, 1)
        try:
            attributes = self._call(
                "update_item", TableName=self.table_name, Key=table.state_key(device_id),
                UpdateExpression=update, ConditionExpression=expression,
                ExpressionAttributeNames=names, ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW", ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )["Attributes"]
        except _Rejected as rejected:
            old = self._raw_live(rejected.item)
            if old is None:
                raise DeviceNotFound(device_id) from None
            if old.get(table.WRITE_ID, {}).get("S") == write_id:
                attributes = old  # an SDK resend of our own landed write
            elif (fenced := self._lease_error(device_id, old)) is not None:
                raise fenced from None
            else:
                return None
        except _Invalid:
            return None
        self.observer.succeeded(device_id, 1, self._monotonic() - started)
        return Device.from_item(attributes)

    def _with_retries(self, device_id: str, attempt: Callable, max_attempts: int | None,
                      budget_seconds: float | None, *, read_item: bool = True):
        """Run ``attempt(item, number)`` until it returns. It raises ``_Moved`` when another
        writer got there first: after a first such conflict it runs again at once on the
        item the failed write returned; after later ones, after a full-jitter backoff and
        a fresh read. Stops at ``max_attempts`` or before a sleep would cross the budget."""
        max_attempts = max_attempts or self.max_attempts
        budget = self.budget_seconds if budget_seconds is None else budget_seconds
        started = self._monotonic()
        deadline = started + budget
        item = self._read_optional(device_id) if read_item else None
        number = 0
        while True:
            number += 1
            try:
                result = attempt(item, number)
            except _Moved as moved:
                if number == 1 and max_attempts > 1 and moved.item is not None:
                    item = moved.item  # as fresh as a read: go again at once
                    continue
                if number >= max_attempts:
                    raise self._exhausted(device_id, number, started, f"{max_attempts} attempts") from None
                delay = self.backoff.delay(number, self._rng)
                if self._monotonic() + delay > deadline:
                    raise self._exhausted(device_id, number, started, f"{budget} s budget") from None
                self._sleep(delay)
                # after a sleep a returned item is likely stale
                item = self._read_optional(device_id) if read_item else None
                continue
            if read_item:
                self.observer.succeeded(device_id, number, self._monotonic() - started)
            return result

    def _moved_or_error(self, device_id: str, expected_version: int | None, old_item: dict | None) -> Exception:
        error = self._rejection(device_id, expected_version, old_item)
        if isinstance(error, VersionConflict):
            return _Moved(self._raw_live(old_item))
        return error

    # ------------------------------------------------------------ idempotency

    def recorded(self, device_id: str, idempotency: IdempotencyKey) -> tuple[Device, str] | None:
        """The recorded result of a keyed write (device, outcome) if it happened, else None;
        ``IdempotencyKeyReused`` if the key was used for a different request."""
        validate_device_id(device_id)
        return self._replay(device_id, idempotency, self._read_record(device_id, idempotency))

    def _keyed(self, device_id: str, idempotency: IdempotencyKey, plan: Callable[[dict | None], _Planned], *,
               max_attempts: int | None = None, budget_seconds: float | None = None) -> tuple[Device, str]:
        """Apply ``plan`` once, atomically with the key's record, or replay the record."""
        replay = self._replay(device_id, idempotency, self._read_record(device_id, idempotency))
        if replay is not None:
            return replay

        def attempt(item, number):
            planned = plan(item)
            self.observer.attempt(device_id, number)
            items = [planned.request, self._record_put(device_id, idempotency, [planned])]
            try:
                self._call(
                    "transact_write_items",
                    TransactItems=items,
                    ClientRequestToken=idempotency.client_request_token(self.table_name, device_id, items),
                )
            except _Cancelled as cancelled:
                device_reason, record_reason = (cancelled.reasons + [{}, {}])[:2]
                if record_reason.get("Code") == "ConditionalCheckFailed":
                    replay = self._replay(device_id, idempotency, self._raw_live(record_reason.get("Item"))
                                          or self._read_record(device_id, idempotency))
                    if replay is not None:
                        return replay
                    raise _Moved(None) from None  # the record expired meanwhile: try again
                if device_reason.get("Code") == "ConditionalCheckFailed":
                    if planned.outcome == CREATED:
                        raise _Moved(None) from None  # created meanwhile: the plan says so next time
                    raise self._moved_or_error(device_id, planned.expected_version,
                                               device_reason.get("Item")) from None
                if any(reason.get("Code") == "TransactionConflict" for reason in cancelled.reasons):
                    raise _Moved(None) from None
                raise StorageError(f"transaction cancelled: {cancelled.reasons}") from None
            return planned.device, planned.outcome

        return self._with_retries(device_id, attempt, max_attempts, budget_seconds)

    def _record_put(self, partition: str, idempotency: IdempotencyKey, planned: list[_Planned]) -> dict:
        """The record of a keyed write: its fingerprint and, per device, the outcome and
        the device as the answer showed it."""
        now = self._clock()
        record = {
            table.PARTITION_KEY: {"S": partition},
            table.SORT_KEY: {"S": idempotency.sort_key},
            idem.FINGERPRINT: {"S": idempotency.fingerprint},
            idem.RESULTS: {"L": [{"M": {
                idem.OUTCOME: {"S": plan.outcome},
                table.PARTITION_KEY: {"S": plan.device.device_id},
                table.VERSION: _number(plan.device.version),
                table.STATE: to_attribute(plan.device.state),
                table.CREATED_AT: {"S": plan.device.created_at},
                table.UPDATED_AT: {"S": plan.device.updated_at},
            }} for plan in planned]},
            idem.RECORDED_AT: {"S": _timestamp(now)},
            table.TTL_ATTRIBUTE: _number(int(now) + idem.RECORD_TTL_SECONDS),
        }
        check_item_size(record)
        return {"Put": {
            "TableName": self.table_name,
            "Item": record,
            "ConditionExpression": "attribute_not_exists(#sk) OR #expiresAt <= :nowEpoch",
            "ExpressionAttributeNames": {"#sk": table.SORT_KEY, "#expiresAt": table.TTL_ATTRIBUTE},
            "ExpressionAttributeValues": {":nowEpoch": _number(now)},
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }}

    def _read_record(self, partition: str, idempotency: IdempotencyKey) -> dict | None:
        response = self._call(
            "get_item", TableName=self.table_name, ConsistentRead=True,
            Key={table.PARTITION_KEY: {"S": partition}, table.SORT_KEY: {"S": idempotency.sort_key}},
        )
        return self._raw_live(response.get("Item"))

    def _replay_all(self, partition: str, idempotency: IdempotencyKey,
                    record: dict | None) -> list[tuple[Device, str]] | None:
        """The recorded results (device, outcome), or None without a record."""
        if record is None:
            return None
        if record[idem.FINGERPRINT]["S"] != idempotency.fingerprint:
            raise IdempotencyKeyReused(partition, idempotency.key)
        results = []
        for entry in record[idem.RESULTS]["L"]:
            snapshot = entry["M"]
            results.append((Device(
                snapshot[table.PARTITION_KEY]["S"], int(snapshot[table.VERSION]["N"]),
                from_attribute(snapshot[table.STATE]), snapshot[table.CREATED_AT]["S"],
                snapshot[table.UPDATED_AT]["S"], replayed=True), snapshot[idem.OUTCOME]["S"]))
        self.observer.replayed(partition)
        return results

    def _replay(self, device_id: str, idempotency: IdempotencyKey, record: dict | None) -> tuple[Device, str] | None:
        results = self._replay_all(device_id, idempotency, record)
        return results[0] if results else None

    # -------------------------------------------------------------- internals

    def _exhausted(self, device_id: str, attempts: int, started: float, reason: str) -> RetriesExhausted:
        elapsed = self._monotonic() - started
        logger.warning(
            "retries exhausted",
            extra={"device_id": device_id, "attempts": attempts, "reason": reason,
                   "elapsed_seconds": round(elapsed, 4)},
        )
        self.observer.exhausted(device_id, attempts, elapsed)
        return RetriesExhausted(device_id, attempts, elapsed, reason)

    def _rejection(self, device_id: str, expected_version: int | None, old_item: dict | None) -> Exception:
        """Tell apart why a conditional write failed, from the item it returned."""
        old_item = self._raw_live(old_item)
        if old_item is None:
            return DeviceNotFound(device_id)
        fenced = self._lease_error(device_id, old_item)
        if fenced is not None:
            return fenced
        current = Device.from_item(old_item)
        if expected_version is not None and current.version != expected_version:
            return self._conflict(device_id, expected_version, current)
        self.observer.condition_failed(device_id)
        return ConditionFailed(device_id, current)

    def _conflict(self, device_id: str, expected_version: int, current: Device) -> VersionConflict:
        logger.info(
            "version conflict",
            extra={"device_id": device_id, "expected_version": expected_version,
                   "found_version": current.version},
        )
        self.observer.conflict(device_id, expected_version, current.version)
        return VersionConflict(device_id, expected_version, current)

    def _fence(self, device_id: str, names: dict, values: dict) -> str:
        """The lease condition every state write carries (its ``:nowEpoch`` already in
        ``values``): no active lease, or, when this manager holds a token for the device,
        exactly that lease, still active."""
        names.update(_names("#leaseToken", "#leaseUntil"))
        token = self._lease_tokens.get(device_id)
        if token is None:
            return "(attribute_not_exists(#leaseToken) OR #leaseUntil <= :nowEpoch)"
        if isinstance(token, leases.Lease):
            token = token.fencing_token_if_held()
        values[":leaseToken"] = _number(token)
        return "(#leaseToken = :leaseToken AND #leaseUntil > :nowEpoch)"

    def _lease_error(self, device_id: str, item: dict | None) -> Exception | None:
        """Why the fence refused a write to the live ``item``, or None if it did not."""
        if item is None:
            return None
        holder, until = leases.active_holder(item, self._clock())
        token = self._lease_tokens.get(device_id)
        if isinstance(token, leases.Lease):
            token = token.fencing_token
        if holder is None:
            return None if token is None else LeaseNotHeld(device_id, token)
        return None if holder == token else DeviceLocked(device_id, until)

    def _raw_live(self, item: dict | None) -> dict | None:
        """The item if it is present and unexpired, else None."""
        if item is None or table.is_expired(item, self._clock()):
            return None
        return item

    def _live_device(self, item: dict) -> Device | None:
        live = self._raw_live(item)
        return Device.from_item(live) if live else None

    def _read(self, device_id: str) -> dict:
        item = self._read_optional(device_id)
        if item is None:
            raise DeviceNotFound(device_id)
        return item

    def _read_optional(self, device_id: str) -> dict | None:
        """The live state item (strongly consistent), or None."""
        validate_device_id(device_id)
        response = self._call(
            "get_item", TableName=self.table_name, Key=table.state_key(device_id), ConsistentRead=True
        )
        return self._raw_live(response.get("Item"))

    def _check_state_fits(self, device_id: str, state: dict) -> None:
        """Size check for whole-state writes, which do not read the item first."""
        stamp = _timestamp(0)
        check_item_size({
            **table.state_key(device_id),
            table.VERSION: _number(10**20),
            table.STATE: to_attribute(state),
            table.CREATED_AT: {"S": stamp},
            table.UPDATED_AT: {"S": stamp},
        })

    def _call(self, operation: str, **request) -> dict:
        try:
            return getattr(self._client, operation)(**request)
        except ClientError as error:
            details = error.response.get("Error", {})
            code = details.get("Code", "")
            message = details.get("Message", "")
            if code == "ConditionalCheckFailedException":
                raise _Rejected(error.response.get("Item")) from None
            if code == "TransactionCanceledException":
                raise _Cancelled(error.response.get("CancellationReasons") or []) from None
            if code == "ValidationException" and "size" in message and "exceed" in message:
                raise ItemTooLarge(f"DynamoDB refused the item: {message}") from None
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in _THROTTLING_CODES or status >= 500:
                raise StorageUnavailable(f"DynamoDB {operation} failed after retries: {code}") from error
            if code == "ValidationException":
                raise _Invalid(f"DynamoDB {operation} refused: {message}") from error
            raise StorageError(f"DynamoDB {operation} refused: {code}: {message}") from error
        except BotoCoreError as error:
            raise StorageUnavailable(f"DynamoDB {operation} did not answer: {error}") from error


def _and_condition(expression: str, names: dict, values: dict, condition: ConditionBase | None) -> str:
    """``expression`` ANDed with a caller's boto3 condition, its placeholders merged in."""
    if condition is None:
        return expression
    # The builder already parenthesises AND/OR/NOT (DynamoDB refuses redundant ones).
    built = ConditionExpressionBuilder().build_expression(condition)
    names.update(built.attribute_name_placeholders)
    values.update({key: to_attribute(value) for key, value in built.attribute_value_placeholders.items()})
    return f"{expression} AND {built.condition_expression}"


def _apply(update_fn: UpdateFn, current: Device) -> dict:
    new_state = update_fn(copy.deepcopy(current.state))
    if new_state is None:
        raise TypeError("update_fn must return the new state")
    return new_state


def _failure_of(index: int, operation: Operation, error: Exception) -> OperationFailure:
    reason = {DeviceNotFound: tx.NOT_FOUND, DeviceAlreadyExists: tx.EXISTS, VersionConflict: tx.VERSION,
              PatchTestFailed: tx.TEST_FAILED, PatchNotApplicable: tx.NOT_APPLICABLE}[type(error)]
    return OperationFailure(index, operation.device_id, reason, str(error), getattr(error, "current", None))


def _written_attributes(request: dict) -> dict:
    """The attributes one transaction action sends, for DynamoDB's 4 MB transaction limit."""
    (kind, action), = request.items()
    if kind == "Put":
        return action["Item"]
    return {**action["Key"], **{name: value for name, value in action.get("ExpressionAttributeValues", {}).items()}}


def _names(*placeholders: str) -> dict:
    return {placeholder: _NAMES[placeholder] for placeholder in placeholders}


def _names_in(expression: str) -> dict:
    return {placeholder: name for placeholder, name in _NAMES.items() if placeholder in expression}


def _encode_cursor(key: dict) -> str:
    raw = json.dumps([key[table.PARTITION_KEY]["S"], key[table.SORT_KEY]["S"]], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> dict:
    """Only a key of this table's shape passes: a cursor just positions the scan, whose
    filter still returns live device state items and nothing else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        device_id, sort_key = json.loads(raw)
    except (ValueError, TypeError, binascii.Error):
        raise InvalidCursor("cursor is not one this service issued") from None
    if (
        not isinstance(device_id, str)
        or not isinstance(sort_key, str)
        or not DEVICE_ID_PATTERN.fullmatch(device_id)
        or not 1 <= len(sort_key) <= 256
    ):
        raise InvalidCursor("cursor is not one this service issued")
    return {table.PARTITION_KEY: {"S": device_id}, table.SORT_KEY: {"S": sort_key}}
