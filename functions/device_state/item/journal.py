"""The write journal: answers "did my write land?" when a write's answer was lost. Every
state write carries a fresh ``WriteId`` and records, in the same request, the
attribute ``w:<write id>`` holding the version it produced; it also requires that
attribute to be absent, so no copy of the same write can ever apply twice. Every write
keeps the newest ``JOURNAL_KEEP`` entries, and every entry younger than
``JOURNAL_KEEP_SECONDS`` (up to ``JOURNAL_MAX``): a writer whose answer was lost settles
before its settle deadline, however many other writes land meanwhile; a device written once
a minute carries ``JOURNAL_KEEP`` entries, not a journal sized for a hot one. A write that drops entries raises a watermark to at least the
newest stamp it dropped, so an absent entry is proof of "never applied" only while the
watermarks are older than the write's own stamp: ``journalTrimmed``, SET by the writes
that read the item (their version condition makes it exact), and the highest of
``journalTrimmedStamps``, a number set to which compiled patches ADD the newest stamp
they dropped. Compiled patches read nothing and drop what their container last saw of
the journal; a set union is the same in whatever order containers apply it, so the
highest stamp is exact however many trim at once (an ADD to a number from each one's view
added up, and once stood decades ahead, turning every later settle into a 504). A patch
that sees ``TRIMMED_STAMPS_KEEP`` stamps DELETEs all but the highest it saw (never the
highest of all: nobody sees a higher one) and drops only entries the set already covers;
a write that reads the item folds the set into ``journalTrimmed`` and removes it.

A container remembers what it last saw of each device's journal (``RecentJournals``), so that
a compiled patch, which reads nothing, drops the entries it knows are old in its own request
instead of a request of its own.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from ..write.expressions import Expression
from . import schema

JOURNAL_KEEP = 1  # the newest entries every write leaves on the item (its own)
# and the entries younger than this (by the trimming writer's clock): longer than any settle
# may ask for one, its deadline (SETTLE_SECONDS, at most 15 s) after a read timeout (3 s)...
JOURNAL_KEEP_SECONDS = 20.0
JOURNAL_MAX = 16  # ...up to this many entries in all
TRIMMED_STAMPS_KEEP = 2  # a compiled patch that sees this many trimmed stamps prunes them instead of adding one
# A "never applied" marker must outlive every copy of its write: DynamoDB refuses a request
# signed more than 15 minutes before it arrives, so the newest MARKERS_KEEP markers stay that
# long and a minute more; beyond them (more lost answers on one device in that time) the
# older go after SETTLED_KEEP_SECONDS, which outlasts any copy held up for seconds.
SETTLED_KEEP_SECONDS = 60
SIGNED_KEEP_SECONDS = 16 * 60
MARKERS_KEEP = 8  # about 21 bytes each, in the journal's room (item/room.py)

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_STAMP_WIDTH = 9  # base 36 milliseconds, good past the year 5000
_NONCE_WIDTH = 6  # base 36: 31 bits, as many as 8 hex digits in two bytes fewer on every entry


@dataclass(frozen=True)
class WriteId:
    """One write's identity: when it was planned (ms, its writer's clock) and a nonce."""

    stamp_ms: int
    nonce: str

    @classmethod
    def new(cls, now: float) -> "WriteId":
        return cls(int(now * 1000), _base36(secrets.randbelow(36 ** _NONCE_WIDTH), _NONCE_WIDTH))

    @property
    def attribute(self) -> str:
        return f"{schema.JOURNAL_PREFIX}{_base36(self.stamp_ms, _STAMP_WIDTH)}{self.nonce}"

    @classmethod
    def parse(cls, attribute: str) -> "WriteId | None":
        body = attribute[len(schema.JOURNAL_PREFIX):]
        if not attribute.startswith(schema.JOURNAL_PREFIX) or len(body) <= _STAMP_WIDTH:
            return None
        try:
            return cls(int(body[:_STAMP_WIDTH], 36), body[_STAMP_WIDTH:])
        except ValueError:
            return None


def _base36(number: int, width: int) -> str:
    digits = ""
    while number:
        number, digit = divmod(number, 36)
        digits = _DIGITS[digit] + digits
    return digits.rjust(width, "0")


def journal(item: dict | None) -> list[tuple[WriteId, int]]:
    """The journal entries on an item: (write id, version it produced; 0 = never applied)."""
    entries = []
    for name, value in (item or {}).items():
        write = WriteId.parse(name) if name.startswith(schema.JOURNAL_PREFIX) else None
        if write is not None and "N" in value:
            entries.append((write, int(value["N"])))
    return entries


def written_version(item: dict | None, write: WriteId) -> int | None:
    """The version ``write`` produced per the item's journal, 0 if it was settled as
    never applied, None if the journal does not name it."""
    value = (item or {}).get(write.attribute)
    return int(value["N"]) if value and "N" in value else None


def trimmed_stamp(item: dict | None) -> int:
    """The newest write-id stamp the journal may have dropped: the highest watermark."""
    return max(watermark(item), max(trimmed_stamps(item), default=0))


def trimmed_stamps(item: dict | None) -> list[int]:
    """The stamps compiled patches added to ``journalTrimmedStamps``, lowest first."""
    value = (item or {}).get(schema.JOURNAL_TRIMMED_STAMPS)
    return sorted(int(stamp) for stamp in value["NS"]) if value else []


def watermark(item: dict | None) -> int:
    """``journalTrimmed``: the newest stamp the writes that read the item dropped (0: none)."""
    value = (item or {}).get(schema.JOURNAL_TRIMMED)
    return int(value["N"]) if value else 0


def trimming(expr: Expression, item: dict | None, keep: int, now: float,
             covered: int | None = None) -> tuple[list[str], int]:
    """Journal entries to drop so that the newest ``keep`` applied ones remain, and those
    younger than ``JOURNAL_KEEP_SECONDS`` up to ``JOURNAL_MAX`` in all (``keep`` and the
    maximum count the write's own entry); never-applied markers go once they are old (the
    newest ``MARKERS_KEEP`` after ``SIGNED_KEEP_SECONDS``, others after ``SETTLED_KEEP_SECONDS``).
    ``covered``: drop only applied entries stamped at or before it. Returns the names to
    REMOVE (placeholders from ``expr``) and the newest stamp of an applied entry dropped (0: none)."""
    entries = journal(item)
    applied = sorted(((version, write) for write, version in entries if version > 0),
                     key=lambda entry: entry[0], reverse=True)
    young_after = (now - JOURNAL_KEEP_SECONDS) * 1000
    kept = applied[:keep] + [entry for entry in applied[keep:] if entry[1].stamp_ms > young_after]
    kept = kept[:JOURNAL_MAX - (JOURNAL_KEEP - keep)]
    kept_writes = {write for _, write in kept}
    dropped = [write for _, write in applied
               if write not in kept_writes and (covered is None or write.stamp_ms <= covered)]
    markers = sorted((write for write, version in entries if version == 0), key=lambda write: write.stamp_ms,
                     reverse=True)
    old_markers = [write for rank, write in enumerate(markers)
                   if write.stamp_ms < (now - (SIGNED_KEEP_SECONDS if rank < MARKERS_KEEP else SETTLED_KEEP_SECONDS))
                   * 1000]
    newest_dropped = max((write.stamp_ms for write in dropped), default=0)
    return [expr.name(write.attribute) for write in dropped + old_markers], newest_dropped


MAX_DEVICES = 1024  # devices remembered per container (least recently seen forgotten first)


class RecentJournals:
    """The newest journal seen per device (by version), and at most one trimming write
    per device in flight: two trims from one view would both raise the watermark."""

    def __init__(self, max_devices: int = MAX_DEVICES):
        self._max_devices = max_devices
        self._journals: OrderedDict[str, dict] = OrderedDict()
        self._trimming: set[str] = set()
        self._lock = threading.Lock()

    def saw(self, device_id: str, item: dict | None) -> None:
        if not item or schema.VERSION not in item:
            return
        journal = {name: value for name, value in item.items()
                   if name.startswith(schema.JOURNAL_PREFIX) or name in (
                       schema.VERSION, schema.JOURNAL_TRIMMED, schema.JOURNAL_TRIMMED_STAMPS)}
        with self._lock:
            known = self._journals.get(device_id)
            if known is None or schema.StateItem.of(known).version <= schema.StateItem.of(item).version:
                self._journals[device_id] = journal
            self._journals.move_to_end(device_id)
            while len(self._journals) > self._max_devices:
                self._journals.popitem(last=False)

    def forget(self, device_id: str) -> None:
        with self._lock:
            self._journals.pop(device_id, None)

    @contextmanager
    def to_trim(self, device_id: str) -> Iterator[dict | None]:
        """The journal last seen, for one write at a time to trim from (None for others,
        and when nothing was seen). If the write fails its view is forgotten: it may have
        trimmed without this container seeing the result."""
        with self._lock:
            journal = None if device_id in self._trimming else self._journals.get(device_id)
            if journal is not None:
                self._trimming.add(device_id)
        try:
            yield journal
        except BaseException:
            self.forget(device_id)
            raise
        finally:
            if journal is not None:
                with self._lock:
                    self._trimming.discard(device_id)
