"""How every stored and returned time is written."""

from __future__ import annotations

from datetime import datetime, timezone


def timestamp(epoch: float) -> str:
    """RFC 3339 UTC with milliseconds, as every stored and returned time is written."""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
