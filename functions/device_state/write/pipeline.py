"""The write pipeline: every request on a device's state item is planned by a ``Planner``
(``planner()``), sent here through the store's door, and classified here: applied (ours),
refused or moved (nothing written, ``outcomes``), or, when the answer was lost, settled
through the write journal; unknown only when it cannot be settled. ``send`` takes one
planned UpdateItem, ``send_together`` planned writes in one TransactWriteItems beside other
items, each part named (an idempotency record, a lease row)."""

from __future__ import annotations

import logging

from ..client import LONGEST_SEND_SECONDS
from ..errors import (
    AnswerLost,
    ConditionNotMet,
    ItemTooLarge,
    OutcomeUnknown,
    StorageError,
    StorageUnavailable,
)
from ..fleet.index import FleetIndex
from ..item import schema
from ..item.contention import Raced
from ..item.credentials import Holder
from ..item.fencing import Fence
from ..item.job_marks import JobMark
from ..item.journal import trimmed_stamp, written_version
from ..model.device import Device
from ..model.times import timestamp
from ..runtime import Runtime, last_send_start
from .outcomes import Applied, NeverApplied, Refusals, refusal
from .plan import DEFAULT_TOMBSTONE_SECONDS, Planned
from .planner import Planner
from .store import IDEMPOTENT, ONCE, THROTTLED_REASONS, Cancelled, FailedAnswer, Store

logger = logging.getLogger("device_state")

DEFAULT_SETTLE_SECONDS = 10.0
CONDITION_FAILED, CONFLICT = "ConditionalCheckFailed", "TransactionConflict"
# Cancellation reasons that mean "try later", nothing wrong with the request.


class WritePipeline:
    def __init__(self, store: Store, runtime: Runtime, *, settle_seconds: float = DEFAULT_SETTLE_SECONDS,
                 tombstone_seconds: int = DEFAULT_TOMBSTONE_SECONDS, fleet_index: FleetIndex = FleetIndex()):
        self.store = store
        self.runtime = runtime
        self.settle_seconds = settle_seconds
        self.tombstone_seconds = tombstone_seconds
        self.fleet_index = fleet_index

    def planner(self, fence: Fence | None = None, seen_by: str | None = None, raced: Raced | None = None,
                holder: Holder | None = None, job: JobMark | None = None) -> Planner:
        """Plans requests now, under ``fence`` (the lease tokens writes present; none unless given);
        ``seen_by``: the device whose own writes these are (they set its lastSeen), ``holder``
        the credential they come with (``item/credentials``); ``raced``: how a read-modify-write
        came to this try (``contention``); ``job``: the job whose desired write they are
        (``item/job_marks``)."""
        return Planner(self.store.table_name, fence or Fence(), self.runtime.clock(), self.tombstone_seconds,
                       self.fleet_index, seen_by, raced, holder, job)

    def send(self, planner: Planner, planned: Planned) -> Applied:
        """Send one planned UpdateItem. ``Applied`` when it applied (once); raises its refusal,
        ``Moved`` or ``NeverApplied`` when nothing was written, ``OutcomeUnknown`` when that
        cannot be settled. A write without a journal entry (bookkeeping: connections, the lease
        holder) is the same when sent again, so the store may resend it."""
        journaled = planned.write is not None
        try:
            answer = self.store.send("update_item", ONCE if journaled else IDEMPOTENT, **planned.request["Update"])
        except ConditionNotMet as rejected:
            version = written_version(rejected.item, planned.write) if journaled else None
            if version:  # a resend (by a retrying client) of our own landed write
                return self._applied(planned, version, rejected.item)
            raise refusal(planned, rejected.item, planner) from None
        except AnswerLost as lost:
            return self._lost(planned, lost)
        attributes = answer.get("Attributes")
        whole = attributes if attributes and schema.VERSION in attributes else None  # not UPDATED_OLD's part
        device = planned.device or (Device.from_item(whole) if whole else None)
        return Applied(device, attributes, device.version if device is not None else None)

    def send_together(self, planner: Planner, planned: list[Planned], others: dict[str, list[dict]],
                      token: str) -> None:
        """The planned writes, then ``others`` (its parts by name: ``{"record": [...]}``), in one
        TransactWriteItems; its ClientRequestToken makes the store's resend after a lost answer
        safe. Returns when it applied; raises ``Refusals`` when DynamoDB cancelled it (naming the
        parts refused), ``NeverApplied`` when a lost answer settles as never applied,
        ``OutcomeUnknown`` when it cannot be known."""
        names = [name for name, requests in others.items() for _ in requests]
        try:
            self.store.send("transact_write_items", IDEMPOTENT, ClientRequestToken=token,
                            TransactItems=[plan.request for plan in planned] + [
                                request for requests in others.values() for request in requests])
        except AnswerLost as lost:  # every send's answer lost: one journal entry tells for all
            if not any(others.values()) and all("ConditionCheck" in plan.request for plan in planned):
                raise StorageUnavailable(f"{lost}; the transaction only checks, so nothing was written") from None
            if not planned:  # items of the caller's own: their conditions make sending them again safe
                raise
            journaled = next((plan for plan in planned if plan.write is not None), planned[0])
            self._lost(journaled, lost)
        except Cancelled as cancelled:
            reasons = cancelled.reasons + [{}] * (len(planned) + len(names) - len(cancelled.reasons))
            codes = [reason.get("Code") or "None" for reason in reasons]
            if any(code in THROTTLED_REASONS for code in codes) or not set(codes) - {"None"}:
                raise StorageUnavailable(f"DynamoDB cancelled the transaction ({cancelled.reasons or 'no reason'}); "
                                         "nothing was written") from None
            if any(code not in ("None", CONDITION_FAILED, CONFLICT) for code in codes):
                raise StorageError(f"transaction cancelled: {cancelled.reasons}") from None
            refusals = [refusal(plan, reason.get("Item"), planner) if code == CONDITION_FAILED
                        else None for plan, reason, code in zip(planned, reasons, codes)]
            refused = frozenset(name for name, code in zip(names, codes[len(planned):]) if code == CONDITION_FAILED)
            raise Refusals(refusals, [reason.get("Item") for reason in reasons[:len(planned)]], refused,
                           CONFLICT in codes) from None

    def _lost(self, planned: Planned, lost: AnswerLost) -> Applied:
        if planned.write is None:  # nothing to settle it by
            self.runtime.observer.outcome_unknown(planned.device_id)
            raise OutcomeUnknown(planned.device_id, str(lost))
        return self.settle(planned, lost)

    def settle(self, planned: Planned, lost: AnswerLost) -> Applied:
        """Find out whether a write whose answer was lost applied, by marking it as never
        applied unless it already did (``Planner.settle_mark``): then the journal tells. A
        write DynamoDB answered with a server error (``FailedAnswer``) that settles as never
        applied is ``StorageUnavailable`` (nothing written) rather than tried again."""
        runtime, device_id = self.runtime, planned.device_id
        deadline = runtime.monotonic() + self.settle_seconds
        latest = last_send_start()
        if latest is not None:  # its last look, a read, must be answered by then too
            deadline = min(deadline, latest - LONGEST_SEND_SECONDS)
        failed_answer = isinstance(lost, FailedAnswer)
        on_versioned_item, attempt, cause = True, 0, str(lost)
        failure = cause
        logger.warning("write answer lost; settling", extra={"device_id": device_id, "cause": cause})
        while latest is None or runtime.monotonic() < deadline:
            attempt += 1
            mark = self.planner().settle_mark(device_id, planned.write, on_versioned_item)
            try:
                marked = self.store.send("update_item", ONCE, **mark.request["Update"])["Attributes"]
            except ConditionNotMet as rejected:
                version = written_version(rejected.item, planned.write)
                if version:
                    return self._applied(planned, version, rejected.item)
                if version == 0:  # our own mark, from an earlier settle attempt whose answer was lost
                    return self._never_applied(planned, rejected.item, failed_answer, failure)
                on_versioned_item = not on_versioned_item  # the item was not as this attempt assumed
                continue
            except ItemTooLarge:  # not even the mark fits: nothing can settle it
                runtime.observer.outcome_unknown(device_id)
                raise OutcomeUnknown(device_id, "the item has no room left to settle the write") from None
            except StorageUnavailable as error:  # AnswerLost too: try again until the deadline
                cause = str(error)
            else:
                return self._never_applied(planned, marked, failed_answer, failure)
            if runtime.monotonic() >= deadline:
                break
            runtime.pause(min(attempt, 6))
        # A last look, when DynamoDB answered no mark: a consistent read, which it may answer
        # while it answers no write, shows the write's entry if it applied, or a mark that landed
        # unanswered (absent, it proves nothing: a copy may still land). None past the answer's
        # deadline, which it could not meet.
        item = self._last_look(device_id) if latest is None or runtime.monotonic() < latest else None
        version = written_version(item, planned.write)
        if version:
            return self._applied(planned, version, item)
        if version == 0:
            return self._never_applied(planned, item, failed_answer, failure)
        runtime.observer.outcome_unknown(device_id)
        raise OutcomeUnknown(device_id, f"DynamoDB did not answer ({cause})")

    def _last_look(self, device_id: str) -> dict | None:
        """The device's state item, read once (no answer: None), so the settle ends within one
        read's timeout of its deadline."""
        try:
            return self.store.get_state(device_id, deadline=self.runtime.monotonic())
        except (StorageUnavailable, StorageError):
            return None

    def _never_applied(self, planned: Planned, item: dict, failed_answer: bool, cause: str) -> Device:
        if trimmed_stamp(item) >= planned.write.stamp_ms:
            # Many writes since: the journal may have dropped ours, so its absence proves nothing.
            self.runtime.observer.outcome_unknown(planned.device_id)
            raise OutcomeUnknown(planned.device_id, "too many other writes landed before it could be settled")
        if failed_answer:
            raise StorageUnavailable(f"DynamoDB failed the write ({cause}); it did not apply: nothing was written")
        raise NeverApplied()

    def _applied(self, planned: Planned, version: int, item: dict | None) -> Applied:
        if planned.device is not None:
            return Applied(planned.device, None, version)
        # A compiled patch knows only its version: the device now holds it and maybe later changes.
        now = self.runtime.clock()
        if schema.is_live_state(item, now):
            return Applied(Device.from_item(item), None, version)
        deleted_since = timestamp(now)  # its state at that version is nowhere to read: shown empty
        return Applied(Device(planned.device_id, version, {}, deleted_since, deleted_since), None, version)
