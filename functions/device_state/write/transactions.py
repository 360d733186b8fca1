"""Multi-device operations for ``DeviceStateManager.transact``: what each one asks, and
how a refused transaction reports which operation failed and why."""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from boto3.dynamodb.conditions import ConditionBase

from ..errors import (
    ConditionFailed,
    DeviceAlreadyExists,
    DeviceLocked,
    DeviceNotFound,
    DeviceStateError,
    IdempotencyKeyReused,
    InvalidValue,
    ItemTooLarge,
    LeaseNotHeld,
    PatchNotApplicable,
    PatchTestFailed,
    VersionConflict,
)
from ..item import schema
from ..item.credentials import Holder
from ..item.fencing import Fence
from ..model.device import Device
from ..model.sections import STATE, check_section, check_sections, replacing
from ..model.values import check_state, check_version, item_size, validate_device_id
from . import keyed as idem
from .keyed import REPLACED, UPDATED
from .outcomes import RECORD, Moved, Refusals
from .pipeline import WritePipeline
from .plan import Planned, expect
from .planner import Planner
from .retry import RetryLoop

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
    section: str = STATE  # the section an update patches
    sections: dict | None = None  # desired/reported a create, put or replace sets beside the state

    def __post_init__(self):
        if self.expected_version is not None:
            check_version(self.expected_version)

    @classmethod
    def create(cls, device_id: str, state: dict, sections: dict | None = None) -> "Operation":
        return cls(device_id, CREATE, state=state, sections=sections)

    @classmethod
    def put(cls, device_id: str, state: dict, sections: dict | None = None) -> "Operation":
        """Create, or replace the whole state (and the sections given) of an existing device."""
        return cls(device_id, PUT, state=state, sections=sections)

    @classmethod
    def replace(cls, device_id: str, state: dict, expected_version: int | None = None,
                sections: dict | None = None) -> "Operation":
        return cls(device_id, REPLACE, state=state, expected_version=expected_version, sections=sections)

    @classmethod
    def update(cls, device_id: str, update_fn, expected_version: int | None = None,
               condition: ConditionBase | None = None, section: str = STATE) -> "Operation":
        return cls(device_id, UPDATE, update_fn=update_fn, expected_version=expected_version, condition=condition,
                   section=check_section(section))

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
    lease_expires_at: float | None = None  # locked: when the lease in the way runs out (epoch seconds)


class InvalidTransaction(DeviceStateError, ValueError):
    """RequestRefused before anything was sent: no operations, too many, or a device twice."""


class TransactionTooLarge(ItemTooLarge):
    def __init__(self, size: int):
        super().__init__(f"the transaction would be about {size} bytes; DynamoDB's limit is {MAX_TRANSACTION_BYTES}")
        self.limit = "transaction-size"


class AnswerTooLarge(ItemTooLarge):
    """The devices the transaction would answer with do not fit the caller's answer (``answer_fits``):
    refused before anything is sent."""

    def __init__(self):
        super().__init__("the transaction's answer, the devices as written or checked, would not fit in one "
                         "answer; split it into smaller transactions")
        self.limit = "answer-size"


class TransactionFailed(DeviceStateError):
    """Nothing was written: ``failures`` names each operation that could not apply."""

    def __init__(self, failures: list[OperationFailure]):
        super().__init__("; ".join(f"operations[{f.index}] ({f.device_id}): {f.detail}" for f in failures))
        self.failures = failures


class TransactionRunner:
    """``DeviceStateManager.transact``: reads every device (consistently, in one batch),
    plans each operation with the same planners single writes use, and writes one
    TransactWriteItems with every condition. When a version moved under an operation
    without an expected version, or DynamoDB reports a TransactionConflict, it reads
    again and retries with backoff inside the attempt and time budget; any other failure
    raises ``TransactionFailed`` naming each failing operation, with nothing written.
    The ClientRequestToken makes a resend safe: a lost answer is sent again with it, and
    ``OutcomeUnknown`` only when that never gets an answer. Returns the devices in
    order: after the write, as deleted, or as checked. With ``answer_fits``, devices it finds
    False for are refused (``AnswerTooLarge``) before anything is sent, so a caller whose answer
    is bounded never learns of an applied transaction too late to be told."""

    def __init__(self, pipeline: WritePipeline, loop: RetryLoop,
                 recorded_results: Callable[[str, idem.IdempotencyKey], list | None], fence: Fence,
                 seen_by: str | None = None, holder: Holder | None = None,
                 answer_fits: Callable[[list[Device]], bool] | None = None):
        self._answer_fits = answer_fits
        self._pipeline = pipeline
        self._loop = loop
        self._recorded_results = recorded_results
        self._fence = fence
        self._seen_by, self._holder = seen_by, holder  # the device whose own transaction it is, its credential

    def run(self, operations: list, key: idem.IdempotencyKey | None) -> list[Device]:
        limit = MAX_OPERATIONS - (1 if key else 0)
        if not 1 <= len(operations) <= limit:
            raise InvalidTransaction(f"a transaction has 1 to {limit} operations, not {len(operations)}")
        seen = set()
        for index, operation in enumerate(operations):
            if not isinstance(operation, Operation):
                raise InvalidTransaction("operations must be Operation objects")
            validate_device_id(operation.device_id)
            if operation.device_id in seen:
                raise InvalidTransaction(f"device {operation.device_id!r} appears more than once")
            seen.add(operation.device_id)
            with _named(index, operation):
                if operation.state is not None:
                    check_state(operation.state)
                check_sections(operation.sections)
        partition = operations[0].device_id  # where a keyed transaction's record lives
        if key is not None:
            replay = self._replayed(partition, key, seen)
            if replay is not None:
                return replay
        try:
            return self._loop.run(partition, lambda _item, number: self._attempt(operations, key, partition, number),
                                  None, count_success=False)
        except (TransactionFailed, *idem.REFUSALS_SAME_KEY_MAY_CAUSE):
            replay = self._replayed(partition, key, seen) if key is not None else None  # see keyed.py
            if replay is None:
                raise
            return replay

    def _replayed(self, partition: str, key, devices: set[str]) -> list[Device] | None:
        """The devices a keyed transaction's record answers with, or None; never shown to a device
        whose credential was revoked since (``_check_holder``), nor that the key names another
        request (``IdempotencyKeyReused``)."""
        try:
            replay = self._recorded_results(partition, key)
        except IdempotencyKeyReused:
            self._check_holder(devices)
            raise
        if replay is None:
            return None
        self._check_holder(devices)
        return [device for device, _ in replay]

    def _check_holder(self, devices: set[str]) -> None:
        """For a replayed transaction of the device's own: one read, to find the credential it
        comes with on its item (``Holder.check``)."""
        if self._holder is not None and self._seen_by in devices:
            self._holder.check(self._seen_by, self._pipeline.store.get_state(self._seen_by),
                               self._pipeline.runtime.clock())

    def _attempt(self, operations: list, key, partition: str, number: int) -> list[Device]:
        pipeline = self._pipeline
        planner = pipeline.planner(self._fence, self._seen_by, holder=self._holder)
        table_name = pipeline.store.table_name
        items = pipeline.store.batch_get_states([operation.device_id for operation in operations])
        planned, failures = [], []
        for index, operation in enumerate(operations):
            item = items.get(operation.device_id)
            holder = planner.holder_of(operation.device_id)
            if holder is not None:  # the device's own: refused as its other requests are, before any failure shows it
                holder.check(operation.device_id, item, planner.now)
            try:
                with _named(index, operation):
                    planned.append(_plan(planner, operation, item))
            except (DeviceNotFound, DeviceAlreadyExists, VersionConflict, PatchTestFailed,
                    PatchNotApplicable) as error:
                live = item if schema.is_live_state(item, planner.now) else None
                failures.append(_failure_of(index, operation, error, live))
        if failures:
            raise TransactionFailed(sorted(failures + self._fenced_out(operations, items, planner.now, failures),
                                           key=lambda failure: failure.index))
        if self._answer_fits is not None and not self._answer_fits([plan.device for plan in planned]):
            raise AnswerTooLarge()
        record = []
        if key is not None:
            results = [(plan.device, plan.outcome) for plan in planned]
            record = idem.record_puts(table_name, partition, key, results, planner.now)
            if not _fits([plan.request for plan in planned] + record):  # the answer goes; the versions stay atomic
                record = idem.record_puts(table_name, partition, key, results, planner.now, with_states=False)
        requests = [plan.request for plan in planned] + record
        size = sum(item_size(_written_attributes(request)) for request in requests)
        if size > MAX_TRANSACTION_BYTES:
            raise TransactionTooLarge(size)
        token = key.client_request_token(table_name, partition, requests) if key else uuid.uuid4().hex
        try:
            pipeline.send_together(planner, planned, {RECORD: record}, token)  # NeverApplied: a lost answer, never applied
        except Refusals as refused:
            return self._refused(operations, planned, key, partition, refused)
        pipeline.runtime.observer.transaction_committed(len(operations), number)
        return [plan.device for plan in planned]

    def _fenced_out(self, operations: list, items: dict, now: float, failed: list) -> list:
        """A transaction refused before it is sent names the operations a lease refuses too, judged
        on the items as read (sent, each write's own condition would judge its device's lease), so
        that its report names each failing operation, not only those its plans refused."""
        named = {failure.index for failure in failed}
        found = []
        for index, operation in enumerate(operations):
            item = items.get(operation.device_id)
            if index in named or operation.action == CHECK or not schema.is_live_state(item, now):
                continue
            refusal = self._fence.error(operation.device_id, item, now)
            if refusal is not None:
                found.append(_failure_of_refusal(index, operation, refusal, item))
        return found

    def _refused(self, operations, planned, key, partition: str, refused: Refusals):
        """The recorded answer when the key's record exists already; otherwise raise what the
        cancellation means: ``TransactionFailed`` or ``Moved``."""
        if RECORD in refused.refused:
            replay = self._replayed(partition, key, {operation.device_id for operation in operations})
            if replay is not None:
                return replay
        failures, retry_reason = [], "conflict" if refused.conflict else None
        for index, (operation, refusal, old) in enumerate(zip(operations, refused.refusals, refused.items)):
            if refusal is None:
                continue
            live = old if schema.is_live_state(old, self._pipeline.runtime.clock()) else None
            failure = _failure_of_refusal(index, operation, refusal, live)
            if failure is None:
                retry_reason = retry_reason or "version"
            else:
                failures.append(failure)
        if failures:
            raise TransactionFailed(failures)
        self._pipeline.runtime.observer.transaction_retried(retry_reason or "unknown")
        raise Moved(None, reason=retry_reason or "unknown")


@contextmanager
def _named(index: int, operation: Operation):
    """A value one operation cannot store refuses the whole request: its detail says which."""
    try:
        yield
    except InvalidValue as invalid:
        invalid.args = (f"operations[{index}] ({operation.device_id}): {invalid}",)
        raise


def _plan(planner: Planner, operation: Operation, item: dict | None) -> Planned:
    action, device_id = operation.action, operation.device_id
    live = schema.is_live_state(item, planner.now)
    if action == CREATE or (action == PUT and not live):
        return planner.create(device_id, operation.state, item, operation.sections)
    if action == PUT:
        return planner.write_sections(item, replacing(operation.state, operation.sections), None, REPLACED)
    item = expect(device_id, item, operation.expected_version, planner.now)
    if action == REPLACE:
        return planner.write_sections(item, replacing(operation.state, operation.sections), None, REPLACED)
    if action == UPDATE:
        return planner.replace_state(item, operation.update_fn, operation.condition, UPDATED, operation.section)
    if action == DELETE:
        return planner.delete(item)
    return planner.check(item, operation.condition)


def _failure_of_refusal(index: int, operation: Operation, refusal: Exception,
                        live: dict | None) -> OperationFailure | None:
    """The failure of an operation whose condition DynamoDB refused (``outcomes.refusal``),
    or None when a retry may still succeed (its device moved under an operation that named
    no version, or a put found the device created or deleted meanwhile)."""
    device_id = operation.device_id
    if isinstance(refusal, DeviceAlreadyExists):
        return OperationFailure(index, device_id, EXISTS, "the device exists", refusal.current) \
            if operation.action == CREATE else None
    if isinstance(refusal, (DeviceLocked, LeaseNotHeld)):
        reason = LOCKED if isinstance(refusal, DeviceLocked) else LEASE_NOT_HELD
        return OperationFailure(index, device_id, reason, str(refusal),
                                Device.from_item(live) if live is not None else None,
                                refusal.lease_expires_at if isinstance(refusal, DeviceLocked) else None)
    if isinstance(refusal, DeviceNotFound):
        return OperationFailure(index, device_id, NOT_FOUND, "the device does not exist") \
            if operation.action != PUT else None
    if isinstance(refusal, Moved):
        if operation.expected_version is None:
            return None
        current = Device.from_item(refusal.item)
        return OperationFailure(index, device_id, VERSION,
                                f"the device is at version {current.version}, not {operation.expected_version}",
                                current)
    if isinstance(refusal, ConditionFailed):
        return OperationFailure(index, device_id, CONDITION, "the condition is not met", refusal.current)
    raise refusal


def _failure_of(index: int, operation: Operation, error: Exception, live: dict | None) -> OperationFailure:
    """The failure of an operation its plan refused, with the device as read (None when absent)."""
    reason = {DeviceNotFound: NOT_FOUND, DeviceAlreadyExists: EXISTS, VersionConflict: VERSION,
              PatchTestFailed: TEST_FAILED, PatchNotApplicable: NOT_APPLICABLE}[type(error)]
    return OperationFailure(index, operation.device_id, reason, str(error),
                            Device.from_item(live) if live is not None else None)


def _fits(requests: list[dict]) -> bool:
    return (len(requests) <= MAX_OPERATIONS
            and sum(item_size(_written_attributes(request)) for request in requests) <= MAX_TRANSACTION_BYTES)


def _written_attributes(request: dict) -> dict:
    """The attributes one transaction action sends, for DynamoDB's 4 MB transaction limit."""
    (kind, action), = request.items()
    if kind == "Put":
        return action["Item"]
    return {**action["Key"], **{name: value for name, value in action.get("ExpressionAttributeValues", {}).items()}}
