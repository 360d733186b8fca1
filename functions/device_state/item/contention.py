"""Turns among read-modify-writes racing on one device, without a line of tickets.

Racing writers retry under the version check with jittered backoff; alone, that serves the
writer that has just arrived as readily as one that has lost for seconds, so under many
writers some wait past their budget. So a write that wins after racing for
``MARK_AFTER_SECONDS`` or more leaves a mark on the item, with the write itself (no request
of its own): its own instant plus how long it raced. The first such winner leaves
``racedUntil``, which holds no one back: one long race is the luck of the backoff as often
as a crowd. A second one while that mark is ahead leaves ``contendedUntil``: the device is
crowded. A read-modify-write that starts while ``contendedUntil`` is ahead holds back for
part of what is left of it before its first try, so the writers already racing go first.

A read-modify-write that wins after racing less than ``CLEAR_BELOW_SECONDS`` without having
held back removes the marks (the race is over; one that held back and then won at once only
shows the hold worked), as does any winner once they have passed, and every compiled patch
(which races no one): a device whose race has ended serves newcomers at once and carries no
mark. Only writes that will retry hold back (not a write naming the version it expects)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from ..model.values import item_size
from ..runtime import Runtime
from . import schema

MARK_AFTER_SECONDS = 0.5  # a winner that raced this long (its hold aside) marks the item
CLEAR_BELOW_SECONDS = 0.125  # a winner that raced less, without holding back, clears the marks
HOLD_LOW, HOLD_HIGH = 0.5, 1.0  # a newcomer holds back U(0.5, 1) of what is left of the mark
HOLD_SHARE_OF_BUDGET = 0.5  # and never more than this share of its budget
# No race outlasts this (the API's budget is 5 s): a mark further ahead, from a skewed clock or
# another writer, holds no one and goes with the next winner; a mark is set no further ahead.
HORIZON_SECONDS = 10.0


@dataclass(frozen=True)
class Raced:
    """How a read-modify-write came to its try: seconds it raced others (its hold aside; none
    on a first try), and whether it held back first."""

    seconds: float
    held: bool = False


def present(item: dict | None) -> list[str]:
    """The marks the item carries, well formed or not."""
    return [mark for mark in schema.CONTENTION_MARKS if mark in (item or {})]


def live_until(item: dict | None, mark: str, now: float) -> float | None:
    """Epoch seconds the item's ``mark`` is ahead until, when it is a well-formed instant
    after ``now`` and within the horizon; else None (absent, passed, or not to be believed)."""
    value = (item or {}).get(mark)
    try:
        until = float(Decimal(value["N"])) / 1000
    except (TypeError, KeyError, ArithmeticError, ValueError):
        return None
    return until if now < until <= now + HORIZON_SECONDS else None


def changes(item: dict | None, now: float, raced: Raced, room: float) -> tuple[dict[str, dict], list[str]]:
    """What a write that wins as ``raced`` leaves on the item: the marks it sets (as stored, by
    name) and those it removes. ``room``: bytes the state leaves under its limit; marks that
    would not fit there are not kept (they are a hint, and no state is refused for them)."""
    marks = present(item)
    live = [mark for mark in marks if live_until(item, mark, now) is not None]
    if raced.seconds >= MARK_AFTER_SECONDS:
        mark = schema.CONTENDED_UNTIL if live else schema.RACED_UNTIL
        sets = {mark: {"N": str(int((now + min(raced.seconds, HORIZON_SECONDS)) * 1000))}}
        removes = [other for other in marks if other != mark]
    elif not live or (raced.seconds < CLEAR_BELOW_SECONDS and not raced.held):
        sets, removes = {}, marks
    else:
        sets, removes = {}, [mark for mark in marks if mark not in live]
    kept = {**{mark: item[mark] for mark in marks if mark not in removes}, **sets}
    if kept and item_size(kept) > room:
        return {}, marks
    return sets, removes


class Race:
    """One read-modify-write's race on a device: when it began, and how long it held back.
    ``read`` wraps the loop's read so that its first read holds back on a crowded item."""

    def __init__(self, runtime: Runtime, device_id: str, budget_seconds: float, holds: bool):
        self._runtime = runtime
        self._device_id = device_id
        self._budget = budget_seconds
        self._holds = holds
        self._began = runtime.monotonic()
        self._held = 0.0

    def read(self, read):
        def first_holds_back():
            item = read()
            if self._holds:
                self._holds = False
                pause = self.hold(item)
                if pause > 0:
                    self._runtime.sleep(pause)
                    self._held = pause
                    self._runtime.observer.held(self._device_id, pause)
                    item = read()
            return item
        return first_holds_back

    def hold(self, item: dict | None) -> float:
        """Seconds to hold back before a first try on ``item``: none unless it is crowded."""
        now = self._runtime.clock()
        crowded = live_until(item, schema.CONTENDED_UNTIL, now)
        if crowded is None:
            return 0.0
        return self._runtime.rng.uniform(HOLD_LOW, HOLD_HIGH) * min(crowded - now, self._budget * HOLD_SHARE_OF_BUDGET)

    def raced(self, attempt: int) -> Raced:
        """How this write comes to its ``attempt``-th try; a first try raced no one (a slow
        read is no race)."""
        seconds = self._runtime.monotonic() - self._began - self._held if attempt > 1 else 0.0
        return Raced(seconds, self._held > 0)
