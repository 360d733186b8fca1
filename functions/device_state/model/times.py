"""How every stored and returned time is written."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def timestamp(epoch: float) -> str:
    """RFC 3339 UTC with milliseconds, as every stored and returned time is written."""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
