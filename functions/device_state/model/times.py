"""How every stored and returned time is written."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
RFC3339_PATTERN = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:[0-5]\d)")
LAST_SECOND = 253_402_300_799  # 9999-12-31T23:59:59Z, the last second an answer can show


def timestamp(epoch: float) -> str:
    """RFC 3339 UTC with milliseconds, as every stored and returned time is written (a stored
    time past the year 9999 shows as its last second, so no stored value fails a read)."""
    epoch = min(epoch, LAST_SECOND)
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch_seconds(text: str) -> int:
    """The whole seconds since the epoch of an RFC 3339 time with its offset (a fraction is cut,
    not rounded: 23:59:59.9999999 stays in its second); ValueError for anything else, or for a
    time whose UTC is past ``LAST_SECOND``."""
    match = RFC3339_PATTERN.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError("not an RFC 3339 time with its offset")
    whole = text[:match.start(1)] + text[match.end(1):] if match.group(1) else text
    try:
        moment = datetime.fromisoformat(whole.upper().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("no such day, time or offset") from None
    try:
        seconds = (moment.astimezone(timezone.utc) - _EPOCH) // timedelta(seconds=1)
    except OverflowError:
        raise ValueError("in UTC, before the year 1 or past the year 9999") from None
    if seconds > LAST_SECOND:
        raise ValueError("in UTC, past the year 9999")
    return seconds


def epoch_of(stamp: str) -> float:
    """The epoch seconds of a time ``timestamp`` wrote."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def millis(epoch: float) -> int:
    """The epoch milliseconds ``timestamp(epoch)`` shows (computed on the same datetime, so
    ``timestamp(millis(epoch) / 1000) == timestamp(epoch)``)."""
    return (datetime.fromtimestamp(epoch, timezone.utc) - _EPOCH) // timedelta(milliseconds=1)


def stored_time(value: dict) -> str:
    """A stored time as ``timestamp`` writes it: the state item keeps its createdAt and
    updatedAt as epoch milliseconds (a number: half the bytes of the text, on every write);
    other items, and state items written earlier, as the text."""
    return timestamp(int(value["N"]) / 1000) if "N" in value else value["S"]


def time_attribute(epoch: float) -> dict:
    """How the state item stores createdAt and updatedAt (``stored_time`` reads it back)."""
    return {"N": str(millis(epoch))}
