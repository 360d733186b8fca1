"""A device as the library returns it, and the timestamps it carries."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import table
from .sections import delta, entries_of, metadata
from .times import timestamp
from .values import from_attribute

__all__ = ["Device", "timestamp"]


@dataclass(frozen=True)
class Device:
    device_id: str
    version: int
    state: dict
    created_at: str
    updated_at: str
    # True when a keyed write was answered from its idempotency record (nothing written).
    replayed: bool = field(default=False, compare=False)
    desired: dict = field(default_factory=dict)
    reported: dict = field(default_factory=dict)
    # The stored per-leaf metadata entries of desired and reported (see sections.py).
    entries: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_item(cls, item: dict) -> "Device":
        return cls(
            device_id=item[table.PARTITION_KEY]["S"],
            version=int(item[table.VERSION]["N"]),
            state=from_attribute(item[table.STATE]),
            created_at=item[table.CREATED_AT]["S"],
            updated_at=item[table.UPDATED_AT]["S"],
            desired=from_attribute(item[table.DESIRED]) if table.DESIRED in item else {},
            reported=from_attribute(item[table.REPORTED]) if table.REPORTED in item else {},
            entries=entries_of(item),
        )

    def as_dict(self, include_metadata: bool = False) -> dict:
        """The resource as the API shows it; per-leaf metadata only when asked."""
        shown = {
            "deviceId": self.device_id,
            "version": self.version,
            "state": self.state,
            "desired": self.desired,
            "reported": self.reported,
            "delta": delta(self.desired, self.reported),
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        }
        if include_metadata:
            shown["metadata"] = metadata(self.desired, self.reported, self.entries)
        return shown
