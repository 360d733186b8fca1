"""Exponential backoff with jitter, capped."""

from __future__ import annotations

import random


class Backoff:
    """Delays of ``first * 2**n`` seconds, at most ``cap``, each drawn between half and all of it
    (jitter, so a fleet cut off at once does not come back at once)."""

    def __init__(self, first: float = 0.5, cap: float = 30.0):
        self.first, self.cap = first, cap
        self.failures = 0

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.first * 2 ** self.failures)
        self.failures += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0
