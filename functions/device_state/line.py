"""The line: turns on a device across processes, for read-modify-write writers that
``turns.py`` cannot order because they live in different processes (every Lambda).

On the state item, ``turnsTaken`` hands out tickets, ``turnsServed`` counts the turns that
ended (the holder's write adds one in the same request), ``turnsMovedAt`` (ms) says when
either last moved, and each waiter's ``turn:<nonce>`` holds its ticket (negative once it
left the line), so a writer whose ticket's answer was lost can read it back. A writer
joins once it has lost a race, or at once when it reads a line that is moving: it takes a
ticket, reads the item until ``turnsServed`` reaches the turn before its own, and writes
from that read. A write that lands meanwhile (a compiled patch, a newcomer) costs it a
retry at once, still in its turn. A waiter moves the line on past a ticket whose writer
left, at once, and past one that stood still for ``STALL_TURNS`` turns (as long as this
process has seen turns take, within ``STALL_SECONDS``: its writer crashed).

The line only orders attempts: every write keeps its version condition, so a wrong view of
the line costs a failed write or a wait, never a wrong result."""

from __future__ import annotations

import random
import secrets
from typing import Callable

from . import table
from .expressions import LIVE, names_in, number
from .observer import UpdateObserver
from .errors import ItemTooLarge, StorageUnavailable
from .store import ONCE, Rejected, Store

STALL_TURNS = 8  # a line that has not moved for this many turns has lost its holder...
STALL_SECONDS = (0.1, 0.5)  # ...but never sooner or later than these
FIRST_TURN_SECONDS = 0.01  # how long a turn takes, until this process has seen some
TURN_SECONDS_RANGE = (0.002, 0.05)
MAX_POLL_SECONDS = 0.1
MAX_WAITERS = 16  # a longer line is not joined (its tickets' room on the item is in BOOKKEEPING_BYTES)


# What a bookkeeping write of the line may meet; it is advisory, so the caller goes on.
LINE_REFUSALS = (Rejected, StorageUnavailable, ItemTooLarge)


def _count(item: dict | None, name: str) -> int:
    value = (item or {}).get(name)
    return int(value["N"]) if value else 0


class DeviceLine:
    """One process's side of every device's line: tickets, waits and the turn length it
    has measured."""

    def __init__(self, store: Store, observer: UpdateObserver, clock: Callable[[], float],
                 monotonic: Callable[[], float], sleep: Callable[[float], None], rng: random.Random):
        self.store, self.observer = store, observer
        self.clock, self.monotonic, self.sleep, self.rng = clock, monotonic, sleep, rng
        self.turn_seconds = FIRST_TURN_SECONDS

    def place(self, device_id: str, deadline: float, give_up: Callable[[str], Exception]) -> "Place":
        """A place for one update, in no line yet; ``give_up(reason)`` is raised when its
        wait would pass ``deadline`` (monotonic seconds)."""
        return Place(self, device_id, deadline, give_up)

    def moving(self, item: dict | None) -> bool:
        """Whether the item shows a line that moved lately (within the longest stall)."""
        return (_count(item, table.TURNS_TAKEN) > _count(item, table.TURNS_SERVED)
                and self.clock() * 1000 - _count(item, table.TURNS_MOVED_AT) < STALL_SECONDS[1] * 1000)

    def take(self, device_id: str, taker: str) -> int | None:
        """A ticket, recorded under ``taker``; None when the device is gone or the ticket
        cannot be known."""
        try:
            answer = self._send(device_id, "SET #turnsTaken = if_not_exists(#turnsTaken, :zero) + :one, "
                                           "#taker = if_not_exists(#turnsTaken, :zero) + :one, #turnsMovedAt = :nowMs",
                                {"#turnsTaken": table.TURNS_TAKEN, "#taker": taker}, {":zero": number(0)},
                                ReturnValues="UPDATED_NEW")
            ticket = _count(answer.get("Attributes"), taker)
        except (Rejected, ItemTooLarge):  # gone, or no room left on the item: race
            return None
        except StorageUnavailable:  # the answer was lost (or never came): read the ticket back
            try:
                ticket = _count(self.store.get_state(device_id), taker)
            except StorageUnavailable:
                ticket = 0
        if not ticket:
            return None
        self.observer.joined_line(device_id)
        return ticket

    def move_on(self, device_id: str, served: int, takers: list[str]) -> None:
        """End the turn after ``served`` (ours, left without a write, or a stalled one),
        unless the line moved meanwhile, and drop the ``takers`` it ended."""
        condition = "#turnsServed = :served" if served else "attribute_not_exists(#turnsServed)"
        names = {"#turnsServed": table.TURNS_SERVED, **{f"#t{index}": taker for index, taker in enumerate(takers)}}
        update = "ADD #turnsServed :one SET #turnsMovedAt = :nowMs"
        if takers:
            update += " REMOVE " + ", ".join(f"#t{index}" for index in range(len(takers)))
        try:
            self._send(device_id, update, names, {":served": number(served)} if served else {}, condition=condition)
        except LINE_REFUSALS:  # moved meanwhile, or unknown: the next waiter looks again
            pass

    def leave(self, device_id: str, taker: str, ticket: int) -> None:
        """Mark ``ticket`` as left, so that the line moves past it without a stall."""
        try:
            self._send(device_id, "SET #taker = :left", {"#taker": taker}, {":left": number(-ticket)},
                       condition="attribute_exists(#taker)")
        except LINE_REFUSALS:
            pass

    def forget(self, device_id: str, taker: str) -> None:
        """Drop the ticket of a writer the line moved on past."""
        try:
            self._send(device_id, "REMOVE #taker", {"#taker": taker}, {})
        except LINE_REFUSALS:
            pass

    @property
    def stall_seconds(self) -> float:
        low, high = STALL_SECONDS
        return min(high, max(low, STALL_TURNS * self.turn_seconds))

    def learn(self, turns: int, seconds: float) -> None:
        low, high = TURN_SECONDS_RANGE
        self.turn_seconds = min(high, max(low, 0.7 * self.turn_seconds + 0.3 * seconds / turns))

    def _send(self, device_id: str, update: str, names: dict, values: dict, *, condition: str | None = None,
              **request) -> dict:
        """One UpdateItem of the line's bookkeeping, on a live device only, sent once."""
        expression = LIVE + (f" AND {condition}" if condition else "")
        values = {**values, ":nowEpoch": number(self.clock())}
        if ":nowMs" in update:
            values[":nowMs"] = number(int(self.clock() * 1000))
        if ":one" in update:
            values[":one"] = number(1)
        return self.store.send("update_item", ONCE, Key=table.state_key(device_id), UpdateExpression=update,
                               ConditionExpression=expression, ExpressionAttributeNames=names_in(expression + update, names),
                               ExpressionAttributeValues=values, **request)


def _takers_of(item: dict | None, ticket: int) -> list[str]:
    """The taker attributes of ``ticket`` on the item (waiting, or left)."""
    return [name for name, value in (item or {}).items()
            if name.startswith(table.TURN_TAKER_PREFIX) and "N" in value and abs(int(value["N"])) == ticket]


def _waiting(item: dict | None) -> int:
    return _count(item, table.TURNS_TAKEN) - _count(item, table.TURNS_SERVED)


def _left(item: dict | None, ticket: int) -> bool:
    return any(int(item[name]["N"]) < 0 for name in _takers_of(item, ticket))


class Place:
    """One update's place in a device's line."""

    def __init__(self, line: DeviceLine, device_id: str, deadline: float, give_up: Callable[[str], Exception]):
        self.line, self.device_id, self.deadline, self.give_up = line, device_id, deadline, give_up
        self.taker = table.TURN_TAKER_PREFIX + secrets.token_hex(3)
        self.ticket: int | None = None
        self.in_turn = False  # the item it returned last shows this update's turn
        self.passed = False  # the line moved on past its ticket (or the device went)
        self.tries_in_turn = 0
        self.served = False  # a write that ended its turn landed

    @property
    def at_once(self) -> bool:
        """Whether a lost attempt should go again without a backoff: while waiting in line
        (the wait is its backoff) and after the first loss in its turn; a writer beaten in
        its turn again and again (by writers outside the line), or passed by the line,
        backs off as before."""
        return self.ticket is not None and not self.passed and (not self.in_turn or self.tries_in_turn < 2)

    def ready(self, item: dict | None, attempt: int) -> dict | None:
        """The item to plan this attempt from: the one given while racing (a first attempt
        on a device without a moving line, or when the line is full); once in line, one
        that shows its turn."""
        if self.ticket is None:
            if (attempt == 1 and not self.line.moving(item)) or _waiting(item) >= MAX_WAITERS:
                return item
            self.ticket = self.line.take(self.device_id, self.taker)
            if self.ticket is None:
                return item
        if self.passed:
            return item
        return self._wait(item)

    def done(self) -> None:
        """The update ended (written, refused or given up): unless its write ended its
        turn, end it, or leave the line, or drop the ticket the line already passed."""
        if self.ticket is None or self.served:
            return
        if self.in_turn:
            self.line.move_on(self.device_id, self.ticket - 1, [self.taker])
        elif self.passed:
            self.line.forget(self.device_id, self.taker)
        else:
            self.line.leave(self.device_id, self.taker, self.ticket)

    def _wait(self, item: dict | None) -> dict | None:
        line = self.line
        observed, since = None, line.monotonic()
        while True:
            served = _count(item, table.TURNS_SERVED)
            if not table.is_live_state(item, line.clock()) or served >= self.ticket - 1:
                self.in_turn = table.is_live_state(item, line.clock()) and served == self.ticket - 1
                self.passed = not self.in_turn  # gone, or moved on past it: it writes out of turn
                self.tries_in_turn += 1
                return item
            now = line.monotonic()
            if observed is None or served != observed:
                if observed is not None:
                    line.learn(served - observed, now - since)
                observed, since = served, now
            if _left(item, served + 1):  # the next turn's writer left: no need to wait for it
                line.move_on(self.device_id, served, _takers_of(item, served + 1))
                item = line.store.get_state(self.device_id)
                continue
            if now - since >= line.stall_seconds:
                line.observer.line_stalled(self.device_id)
                line.move_on(self.device_id, served, _takers_of(item, served + 1))
                since = now
            ahead = self.ticket - 1 - served
            # the next in line looks often, or its own looking would set the pace of the line
            pause = min(MAX_POLL_SECONDS, (ahead - 0.75) * line.turn_seconds * line.rng.uniform(0.8, 1.2))
            if now + pause >= self.deadline:
                raise self.give_up(f"its turn on the device did not come within its budget ({ahead} ahead)")
            line.sleep(pause)
            item = line.store.get_state(self.device_id)
