"""The one retry loop every optimistic write runs in."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from ..errors import RetriesExhausted
from ..runtime import Runtime
from .outcomes import Moved

logger = logging.getLogger("device_state")


@dataclass
class RetryLoop:
    """Runs ``attempt(item, number)`` until it returns. On ``Moved`` after a first
    conflict it runs again at once on the item the failed write returned (as fresh as a
    read); after later ones, after a full-jitter backoff and a fresh ``read()``. Gives up
    with ``RetriesExhausted`` (nothing written) at ``max_attempts`` or before a sleep
    would cross the budget."""

    max_attempts: int
    budget_seconds: float
    runtime: Runtime

    def run(self, device_id: str, attempt: Callable, read: Callable[[], dict | None] | None, *,
            count_success: bool = True):
        monotonic = self.runtime.monotonic
        started = monotonic()
        deadline = started + self.budget_seconds
        item = read() if read else None
        number = 0
        while True:
            number += 1
            try:
                result = attempt(item, number)
            except Moved as moved:
                if number >= self.max_attempts:
                    raise self.exhausted(device_id, number, started, f"{self.max_attempts} attempts") from None
                if number == 1 and moved.item is not None:
                    item = moved.item
                    continue
                delay = self.runtime.backoff.delay(number, self.runtime.rng)
                if monotonic() + delay > deadline:
                    raise self.exhausted(device_id, number, started, f"{self.budget_seconds} s budget") from None
                self.runtime.sleep(delay)
                item = read() if read else None  # after a sleep a returned item is likely stale
                continue
            if count_success:
                self.runtime.observer.succeeded(device_id, number, monotonic() - started)
            return result

    def exhausted(self, device_id: str, attempts: int, started: float, reason: str) -> RetriesExhausted:
        """Logs and counts giving up, and returns the error to raise."""
        elapsed = self.runtime.monotonic() - started
        logger.warning("retries exhausted", extra={"device_id": device_id, "attempts": attempts, "reason": reason,
                                                   "elapsed_seconds": round(elapsed, 4)})
        self.runtime.observer.exhausted(device_id, attempts, elapsed)
        return RetriesExhausted(device_id, attempts, elapsed, reason)
