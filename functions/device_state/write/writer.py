"""The body of every single-device write: plan from the item read, send through the
pipeline, classify, and go again (in the retry loop) while the device moved under a write
that named no version; keyed writes carry their idempotency record in the same transaction;
patches that compile to one UpdateItem go read-free first."""

from __future__ import annotations

from typing import Callable

from ..errors import ConditionFailed, DeviceAlreadyExists, DeviceNotFound, ItemTooLarge, RequestRefused, VersionConflict
from ..item import schema
from ..item.contention import Race
from ..item.credentials import Holder
from ..item.fencing import Fence
from ..item.journal import RecentJournals
from ..model.device import Device
from ..model.sections import STATE
from ..model.values import check_version
from . import keyed as idem
from .compiled import compile_patch
from .keyed import IdempotencyKey, RecordedAnswers
from .outcomes import RECORD, Moved, NeverApplied, Refusals
from .pipeline import WritePipeline
from .plan import Planned
from .planner import Planner
from .retry import RetryLoop


class DeviceWriter:
    def __init__(self, pipeline: WritePipeline, answers: RecordedAnswers):
        self._pipeline = pipeline
        self._answers = answers
        self._observer = pipeline.runtime.observer
        self._recent = RecentJournals()

    def write(self, loop: RetryLoop, fence: Fence, device_id: str, plan: Callable[[Planner, dict | None], Planned],
              idempotency: IdempotencyKey | None, *, expected_version: int | None = None,
              created_may_move: bool = False, counted: bool = False, seen_by: str | None = None,
              holder: Holder | None = None,
              holds: bool = True, first_item: dict | None = None) -> tuple[Device, str]:
        """Plan from the item read, send, classify, and go again while the device moved
        under a write that named no version. ``created_may_move`` (PUT, create or replace): a
        create that finds the device created meanwhile, or a replace that finds it deleted
        meanwhile, plans again instead of failing (POST's 409, a replace's 404).
        ``counted``: an update, whose attempts and successes the observer counts. ``holds``: it
        may hold back on a crowded device (``contention``); never when it names its version.
        ``first_item``: the item as a refused write just returned it, planned on in place of
        the first read."""
        if expected_version is not None:
            check_version(expected_version)
        if idempotency is not None:
            recorded = self._answers.results(device_id, idempotency)
            if recorded is not None:
                return recorded[0]
        store, observer = self._pipeline.store, self._observer
        # A write naming the version it expects does not retry: it has no turn to wait for.
        race = Race(self._pipeline.runtime, device_id, loop.budget_seconds, holds and expected_version is None)

        def attempt(item, number):
            self._recent.saw(device_id, item)
            planner = self._pipeline.planner(fence, seen_by, race.raced(number), holder)
            if holder is not None and schema.is_live_state(item, planner.now):
                # before planning: a refusal (a version, a test, a desire moved) tells what the device holds
                holder.check(device_id, item, planner.now)
            try:
                planned = plan(planner, item)
            except VersionConflict as conflict:
                observer.conflict(device_id, conflict.expected_version, conflict.current.version)
                raise
            if counted:
                observer.attempt(device_id, number)
            try:
                if idempotency is None:
                    return self._pipeline.send(planner, planned).device, planned.outcome
                return self._send_keyed(planner, planned, idempotency)
            except NeverApplied:
                raise
            except Moved as moved:
                current = Device.from_item(moved.item) if schema.is_live_state(moved.item, planner.now) else None
                if current is not None and planned.expected_version is not None:
                    observer.conflict(device_id, planned.expected_version, current.version)
                if expected_version is not None and current is not None:
                    raise VersionConflict(device_id, expected_version, current) from None
                raise
            except DeviceAlreadyExists as exists:
                if created_may_move:
                    raise Moved(store.get_state(device_id)) from None
                raise exists
            except DeviceNotFound as missing:  # a replace whose device was deleted after the read
                if created_may_move:
                    raise Moved(store.get_state(device_id)) from None
                raise missing
            except ConditionFailed:
                observer.condition_failed(device_id)
                raise

        given = [first_item] if first_item is not None else []

        def read():  # the item a refused write returned, once; every later read is the store's
            return given.pop() if given else store.get_state(device_id)

        try:
            return loop.run(device_id, attempt, race.read(read), count_success=counted)
        except idem.REFUSALS_SAME_KEY_MAY_CAUSE:
            recorded = self._answers.results(device_id, idempotency) if idempotency is not None else None
            if recorded is None:
                raise
            return recorded[0]

    def _send_keyed(self, planner: Planner, planned: Planned, idempotency: IdempotencyKey) -> tuple[Device, str]:
        """The change and its record in one transaction; DynamoDB's ClientRequestToken
        makes a resend of it safe, so the store sends it again on a lost answer."""
        device_id, table_name = planned.device_id, planner.table_name
        record = idem.record_puts(table_name, device_id, idempotency, [(planned.device, planned.outcome)],
                                  planner.now)
        token = idempotency.client_request_token(table_name, device_id, [planned.request, *record])
        try:
            self._pipeline.send_together(planner, [planned], {RECORD: record}, token)
        except Refusals as refused:
            if RECORD in refused.refused:  # the key's record exists: the write happened before
                recorded = self._answers.results(device_id, idempotency)
                if recorded is not None:
                    return recorded[0]
                raise Moved(None) from None  # the record expired meanwhile: try again
            if refused.refusal is not None:
                raise refused.refusal from None
            raise Moved(None) from None  # a TransactionConflict: try again
        return planned.device, planned.outcome

    def compiled(self, fence: Fence, device_id: str, update_fn, section: str = STATE,
                 seen_by: str | None = None, holder: Holder | None = None) -> tuple[Device | None, dict | None]:
        """Apply a patch that compiles to one UpdateItem: no read, and nothing for another
        writer to invalidate, so no conflict: (the device, None). (None, the item a refusal
        returned, if any) when it does not compile, or DynamoDB refuses it (a guard, a missing
        parent, a type): read-modify-write then decides, on that item when there is one.
        Desired and reported compile nested merge patches too (``compiled.compile_patch``)."""
        compiled = compile_patch(update_fn, section)
        if compiled is None:
            return None, None
        monotonic = self._pipeline.runtime.monotonic
        with self._recent.to_trim(device_id) as seen:
            planner = self._pipeline.planner(fence, seen_by, holder=holder)
            planned = planner.compiled(device_id, compiled, seen, section)
            if planned is None:
                return None, None
            started = monotonic()
            self._observer.attempt(device_id, 1)
            try:
                applied = self._pipeline.send(planner, planned)
            except Moved as refused:  # a guard refused it, returning the item (or it was settled as never applied)
                return None, refused.item
            except (ConditionFailed, RequestRefused, ItemTooLarge):
                # DynamoDB refused its form (expression size, too many names) or the item's size.
                return None, None
            device, item = applied.device, applied.item
            if item is None:  # settled as applied: what it trimmed was not seen
                self._recent.forget(device_id)
            self._recent.saw(device_id, item)
        self._observer.succeeded(device_id, 1, monotonic() - started)
        return device, None
