"""What the library takes of the outside world, in one object every collaborator
receives: the clocks, sleep, randomness, backoff and the observer (``UpdateObserver``: how
the library reports what its write loops do, without depending on any metrics or logging
framework; subclass it and override what you need). Tests drive time by passing their own."""

from __future__ import annotations

import contextlib
import contextvars
import random
import time
from dataclasses import dataclass, field
from typing import Callable

from .client import LONGEST_SEND_SECONDS
from .restore import random_generator

# When the caller must have its answer (monotonic seconds), if it said (``answer_by``).
_ANSWER_BY: contextvars.ContextVar[float | None] = contextvars.ContextVar("answer_by", default=None)


@contextlib.contextmanager
def answer_by(deadline: float | None):
    """Within it, no resend to DynamoDB and no step of a settle starts that could still be
    unanswered at ``deadline`` (monotonic; a Lambda's end, less the time to answer): the caller
    hears what is known by then (nothing written, or the outcome unknown). A request's first send
    always goes: a read or a withdrawal it needs to tell the truth is never held back. Outside
    it, there is no such bound."""
    token = _ANSWER_BY.set(deadline)
    try:
        yield
    finally:
        _ANSWER_BY.reset(token)


def last_send_start() -> float | None:
    """The latest moment (monotonic) a request may start within ``answer_by``; None outside."""
    deadline = _ANSWER_BY.get()
    return None if deadline is None else deadline - LONGEST_SEND_SECONDS


class UpdateObserver:
    """Receives one call per event of a conditional write loop; the default ignores them."""

    def attempt(self, device_id: str, attempt: int) -> None:
        """A conditional write is about to be sent (``attempt`` counts from 1)."""

    def conflict(self, device_id: str, expected_version: int, found_version: int) -> None:
        """A conditional write met a newer version than it expected."""

    def held(self, device_id: str, seconds: float) -> None:
        """A read-modify-write held back ``seconds`` before its first try, for writers
        that had raced longer on the device (``contention``)."""

    def condition_failed(self, device_id: str) -> None:
        """The caller's extra condition did not hold (not retried)."""

    def succeeded(self, device_id: str, attempts: int, elapsed: float) -> None:
        """The write landed after ``attempts`` conditional writes."""

    def exhausted(self, device_id: str, attempts: int, elapsed: float) -> None:
        """The loop gave up; nothing was written."""

    def transaction_committed(self, operations: int, attempts: int) -> None:
        """A multi-device transaction was written after ``attempts`` tries."""

    def transaction_retried(self, reason: str) -> None:
        """A transaction was cancelled and will be tried again: ``"conflict"`` (DynamoDB's
        TransactionConflict) or ``"version"`` (a device moved under it)."""

    def replayed(self, device_id: str) -> None:
        """A keyed write was answered from its idempotency record; nothing was written."""

    def outcome_unknown(self, device_id: str) -> None:
        """A write's answer was lost and whether it applied could not be settled."""

    def lease_acquired(self, device_id: str, waited: float) -> None:
        """A lease was acquired after waiting ``waited`` seconds in the queue."""

    def lease_busy(self, device_id: str) -> None:
        """A lease was not acquired within its wait; the ticket was withdrawn."""

    def lease_reclaimed(self, device_id: str, rows: int) -> None:
        """Expired queue rows (crashed holders or waiters) were found and deleted."""

    def lease_lost(self, device_id: str) -> None:
        """A heartbeat was refused (or could not be sent before expiry): the lease is lost."""

    def consumed(self, operation: str, read_units: float, write_units: float) -> None:
        """DynamoDB's ConsumedCapacity for one request the library sent (``operation``: its
        boto3 name, e.g. ``update_item``): what the request is billed."""


NULL_OBSERVER = UpdateObserver()


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with full jitter: attempt n sleeps U(0, min(cap, base * 2^(n-1)))."""

    base_seconds: float = 0.05
    cap_seconds: float = 1.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        return rng.uniform(0, min(self.cap_seconds, self.base_seconds * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class Runtime:
    clock: Callable[[], float] = time.time  # epoch seconds: stamps, expiries, lease ttls
    monotonic: Callable[[], float] = time.monotonic  # deadlines and budgets
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random_generator)  # jitter
    backoff: Backoff = Backoff()
    observer: UpdateObserver = NULL_OBSERVER

    def pause(self, attempt: int) -> None:
        """Sleep the backoff of ``attempt``."""
        self.sleep(self.backoff.delay(attempt, self.rng))
