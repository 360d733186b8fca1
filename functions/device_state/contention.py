"""Turns among read-modify-writes racing on one device, without a line of tickets.

Racing writers retry under the version check with jittered backoff; alone, that serves the
writer that has just arrived as readily as one that has lost for seconds, so under many
writers some wait past their budget. A write that wins after racing for ``MARK_AFTER_SECONDS``
or more leaves on the item, with the write itself (no request of its own), the instant
``contendedUntil``: its own instant plus how long it raced. A read-modify-write that starts
while that instant is ahead holds back for part of what is left of it before its first try,
so the writers already racing go first. A read-modify-write that wins after racing less than
``CLEAR_BELOW_SECONDS``, or after the mark has passed, removes it, and so does every compiled
patch (which races no one): a device whose race has ended serves newcomers at once and
carries no mark. Only writes that will retry hold back (not a write naming the version it
expects)."""

from __future__ import annotations

from . import table
from .runtime import Runtime

MARK_AFTER_SECONDS = 0.5  # a winner that raced this long (its hold aside) marks the item
CLEAR_BELOW_SECONDS = 0.125  # a winner that raced less clears the mark
HOLD_LOW, HOLD_HIGH = 0.5, 1.0  # a newcomer holds back U(0.5, 1) of what is left of the mark
HOLD_SHARE_OF_BUDGET = 0.5  # and never more than this share of its budget


def marked_until(item: dict | None) -> float | None:
    """The item's ``contendedUntil`` in epoch seconds, if it carries one."""
    value = (item or {}).get(table.CONTENDED_UNTIL)
    return int(value["N"]) / 1000 if value and "N" in value else None


def mark(now: float, raced: float) -> int | None:
    """The ``contendedUntil`` (epoch ms) a write that wins after racing ``raced`` seconds
    leaves, or None when it raced too briefly to mark the item."""
    return int((now + raced) * 1000) if raced >= MARK_AFTER_SECONDS else None


def clears(item: dict | None, now: float, raced: float) -> bool:
    """True when a write that wins after racing ``raced`` seconds (and marks nothing)
    removes the item's mark: it raced briefly, or the mark has passed."""
    until = marked_until(item)
    return until is not None and (raced < CLEAR_BELOW_SECONDS or until <= now)


class Race:
    """One read-modify-write's race on a device: when it began, and how long it held back.
    ``read`` wraps the loop's read so that its first read holds back on a marked item."""

    def __init__(self, runtime: Runtime, device_id: str, budget_seconds: float, holds: bool):
        self._runtime = runtime
        self._device_id = device_id
        self._budget = budget_seconds
        self._holds = holds
        self._began = runtime.monotonic()
        self.held = 0.0

    def read(self, read):
        def first_holds_back():
            item = read()
            if self._holds:
                self._holds = False
                pause = self.hold(item)
                if pause > 0:
                    self._runtime.sleep(pause)
                    self.held = pause
                    self._runtime.observer.held(self._device_id, pause)
                    item = read()
            return item
        return first_holds_back

    def hold(self, item: dict | None) -> float:
        """Seconds to hold back before a first try on ``item``: none unless it is marked."""
        until = marked_until(item)
        if until is None:
            return 0.0
        left = min(until - self._runtime.clock(), self._budget * HOLD_SHARE_OF_BUDGET)
        return self._runtime.rng.uniform(HOLD_LOW, HOLD_HIGH) * left if left > 0 else 0.0

    def raced(self, attempt: int) -> float:
        """Seconds this write has raced others before its ``attempt``-th try, its hold
        aside; none on a first try (a slow read is no race)."""
        return self._runtime.monotonic() - self._began - self.held if attempt > 1 else 0.0
