"""A device as the library returns it, and the timestamps it carries."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone

from . import table
from .values import from_attribute


def timestamp(epoch: float) -> str:
    """RFC 3339 UTC with milliseconds, as every stored and returned time is written."""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Device:
    device_id: str
    version: int
    state: dict
    created_at: str
    updated_at: str
    # True when a keyed write was answered from its idempotency record (nothing written).
    replayed: bool = field(default=False, compare=False)

    @classmethod
    def from_item(cls, item: dict) -> "Device":
        return cls(
            device_id=item[table.PARTITION_KEY]["S"],
            version=int(item[table.VERSION]["N"]),
            state=from_attribute(item[table.STATE]),
            created_at=item[table.CREATED_AT]["S"],
            updated_at=item[table.UPDATED_AT]["S"],
        )

    def as_dict(self) -> dict:
        """The resource as the API shows it."""
        return {
            "deviceId": self.device_id,
            "version": self.version,
            "state": self.state,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        }
