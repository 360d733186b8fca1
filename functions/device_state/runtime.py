"""What the library takes of the outside world, in one object every collaborator
receives: the clocks, sleep, randomness, backoff and the observer. Tests drive time by
passing their own."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable

from .observer import NULL_OBSERVER, UpdateObserver
from .restore import random_generator


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
