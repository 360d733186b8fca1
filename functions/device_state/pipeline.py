"""The write pipeline's single step: send one planned write through the store's door and
classify what happened — applied (ours), moved or refused (nothing written), or, when
the answer was lost, settled through the write journal; unknown only when it cannot be
settled."""

from __future__ import annotations

import logging
import random
import time
from typing import Callable

from . import table
from .device import Device
from .errors import ItemTooLarge, OutcomeUnknown, StorageUnavailable
from .observer import UpdateObserver
from .restore import random_generator
from .retry import Backoff, Moved
from .store import ONCE, Ambiguous, FailedAnswer, Rejected, Store
from .writes import Planned, Planner, refusal, settle_request, trimmed_stamp, written_version

logger = logging.getLogger("device_state")

DEFAULT_SETTLE_SECONDS = 10.0


class WritePipeline:
    def __init__(self, store: Store, *, observer: UpdateObserver, backoff: Backoff,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None,
                 settle_seconds: float = DEFAULT_SETTLE_SECONDS):
        self.store = store
        self.observer = observer
        self.backoff = backoff
        self.settle_seconds = settle_seconds
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._rng = rng or random_generator()

    def send(self, planner: Planner, device_id: str, planned: Planned) -> tuple[Device, dict | None]:
        """Send one planned UpdateItem. Returns the device after it when it applied (once),
        with the item DynamoDB returned (ALL_NEW) if any; raises its refusal or ``Moved``
        when nothing was written, ``OutcomeUnknown`` when that cannot be settled."""
        try:
            attributes = self.store.send("update_item", ONCE, **planned.request["Update"]).get("Attributes")
        except Rejected as rejected:
            version = written_version(rejected.item, planned.write)
            if version:  # a resend (by a retrying client) of our own landed write
                return self._applied(device_id, planned, version, rejected.item), None
            raise refusal(planned, device_id, rejected.item, planner.fence, self._clock()) from None
        except Ambiguous as lost:
            return self.settle(device_id, planned, lost), None
        return planned.device or Device.from_item(attributes), attributes

    def settle(self, device_id: str, planned: Planned, lost: Ambiguous) -> Device:
        """Find out whether a write whose answer was lost applied, by marking it as never
        applied unless it already did (``Planner.settle``): then the journal tells. A write
        DynamoDB answered with a server error (``FailedAnswer``) that settles as never applied
        is ``StorageUnavailable`` (nothing written) rather than tried again."""
        deadline = self._monotonic() + self.settle_seconds
        failed_answer = isinstance(lost, FailedAnswer)
        on_versioned_item, attempt, cause = True, 0, str(lost)
        failure = cause
        logger.warning("write answer lost; settling", extra={"device_id": device_id, "cause": cause})
        while True:
            attempt += 1
            request = settle_request(device_id, planned.write, on_versioned_item, self._clock())
            try:
                marked = self.store.send("update_item", ONCE, **request)["Attributes"]
            except Rejected as rejected:
                version = written_version(rejected.item, planned.write)
                if version:
                    return self._applied(device_id, planned, version, rejected.item)
                if version == 0:  # our own mark, from an earlier settle attempt whose answer was lost
                    return self._never_applied(device_id, planned, rejected.item, failed_answer, failure)
                on_versioned_item = not on_versioned_item  # the item was not as this attempt assumed
                continue
            except ItemTooLarge:  # not even the mark fits: nothing can settle it
                self.observer.outcome_unknown(device_id)
                raise OutcomeUnknown(device_id, "the item has no room left to settle the write") from None
            except StorageUnavailable as error:  # Ambiguous too: try again until the deadline
                cause = str(error)
            else:
                return self._never_applied(device_id, planned, marked, failed_answer, failure)
            if self._monotonic() >= deadline:
                self.observer.outcome_unknown(device_id)
                raise OutcomeUnknown(device_id, f"DynamoDB did not answer ({cause})")
            self._sleep(self.backoff.delay(min(attempt, 6), self._rng))

    def _never_applied(self, device_id: str, planned: Planned, item: dict, failed_answer: bool,
                       cause: str) -> Device:
        if trimmed_stamp(item) >= planned.write.stamp_ms:
            # Many writes since: the journal may have dropped ours, so its absence proves nothing.
            self.observer.outcome_unknown(device_id)
            raise OutcomeUnknown(device_id, "too many other writes landed before it could be settled")
        if failed_answer:
            raise StorageUnavailable(f"DynamoDB failed the write ({cause}); it did not apply: nothing was written")
        raise Moved(None, reason="settled")

    def _applied(self, device_id: str, planned: Planned, version: int, item: dict | None) -> Device:
        if planned.device is not None:
            return planned.device
        # A compiled patch knows only its version: the device now holds it and maybe later changes.
        if table.is_live_state(item, self._clock()):
            return Device.from_item(item)
        return Device(device_id, version, {}, "", "")

