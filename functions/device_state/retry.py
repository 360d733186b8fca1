"""Backoff, and the one retry loop every optimistic write runs in."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Callable

from .errors import RetriesExhausted
from .observer import UpdateObserver

logger = logging.getLogger("device_state")


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: attempt n sleeps U(0, min(cap, base * 2^(n-1)))."""

    base_seconds: float = 0.01
    cap_seconds: float = 0.5

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.cap_seconds, self.base_seconds * 2 ** (attempt - 1)))


class Moved(Exception):
    """This attempt wrote nothing and another may succeed: another writer got there first
    (``item`` is the newer item when the failed write returned it), or a write whose
    answer was lost was settled as never applied."""

    def __init__(self, item: dict | None = None, reason: str = "version"):
        super().__init__(reason)
        self.item = item
        self.reason = reason


@dataclass
class RetryLoop:
    """Runs ``attempt(item, number)`` until it returns. On ``Moved`` after a first
    conflict it runs again at once on the item the failed write returned (as fresh as a
    read); after later ones, after a full-jitter backoff and a fresh ``read()``. Gives up
    with ``RetriesExhausted`` (nothing written) at ``max_attempts`` or before a sleep
    would cross the budget."""

    max_attempts: int
    budget_seconds: float
    backoff: Backoff
    monotonic: Callable[[], float]
    sleep: Callable[[float], None]
    rng: random.Random
    observer: UpdateObserver

    def run(self, device_id: str, attempt: Callable, read: Callable[[], dict | None] | None, *,
            count_success: bool = True):
        started = self.monotonic()
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
                delay = self.backoff.delay(number, self.rng)
                if self.monotonic() + delay > deadline:
                    raise self.exhausted(device_id, number, started, f"{self.budget_seconds} s budget") from None
                self.sleep(delay)
                item = read() if read else None  # after a sleep a returned item is likely stale
                continue
            if count_success:
                self.observer.succeeded(device_id, number, self.monotonic() - started)
            return result

    def exhausted(self, device_id: str, attempts: int, started: float, reason: str) -> RetriesExhausted:
        """Logs and counts giving up, and returns the error to raise."""
        elapsed = self.monotonic() - started
        logger.warning("retries exhausted", extra={"device_id": device_id, "attempts": attempts, "reason": reason,
                                                   "elapsed_seconds": round(elapsed, 4)})
        self.observer.exhausted(device_id, attempts, elapsed)
        return RetriesExhausted(device_id, attempts, elapsed, reason)
