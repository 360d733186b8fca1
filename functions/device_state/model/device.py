"""A device as the library returns it, and the timestamps it carries."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..item import schema
from . import desires
from .connectivity import CONNECTIVITY, connectivity_of
from .sections import DESIRED, entries_of, metadata
from .times import epoch_of, stored_time, timestamp
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
    # The stored per-leaf entries: metadata of desired and reported, desired's statuses
    # (see model/sections.py, model/desires.py).
    entries: dict = field(default_factory=dict, compare=False)
    # A read's connectivity attributes (model/connectivity.py), as stored; None: not read with it.
    presence: dict | None = field(default=None, compare=False)

    @classmethod
    def from_item(cls, item: dict, with_connectivity: bool = False) -> "Device":
        """The device an item holds; ``with_connectivity``: a read, which shows it."""
        return cls(
            device_id=schema.StateItem.of(item).device_id,
            version=schema.StateItem.of(item).version,
            state=from_attribute(item[schema.STATE]),
            created_at=stored_time(item[schema.CREATED_AT]),
            updated_at=stored_time(item[schema.UPDATED_AT]),
            desired=from_attribute(item[schema.DESIRED]) if schema.DESIRED in item else {},
            reported=from_attribute(item[schema.REPORTED]) if schema.REPORTED in item else {},
            entries=entries_of(item),
            presence=({name: item[name] for name in schema.CONNECTIVITY_ATTRIBUTES if name in item}
                      if with_connectivity else None),
        )

    def delta(self, now: float | None = None) -> dict:
        """What the device is asked to act on at ``now``: desired leaves reported lacks or
        holds differently, less those it refused and those whose desire expired."""
        return desires.open_delta(self.desired, self.reported, self.entries, time.time() if now is None else now)

    def changed_since_written(self, now: float | None = None) -> bool:
        """Whether the delta changed after this version was written, with no write: a
        desire expired since. A cached copy of this version may then be out of date."""
        return desires.expired_since(self.desired, self.entries, epoch_of(self.updated_at),
                                     time.time() if now is None else now)

    def as_dict(self, include_metadata: bool = False, now: float | None = None) -> dict:
        """The resource as the API shows it at ``now``; per-leaf metadata only when asked."""
        now = time.time() if now is None else now
        shown = {
            "deviceId": self.device_id,
            "version": self.version,
            "state": self.state,
            "desired": self.desired,
            "reported": self.reported,
            "delta": self.delta(now),
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        }
        if self.presence is not None:
            shown[CONNECTIVITY] = connectivity_of(self.presence, now)
        if include_metadata:
            shown["metadata"] = metadata(self.desired, self.reported, self.entries)
            desires.annotate(shown["metadata"][DESIRED], self.desired, self.reported, self.entries, now)
        return shown
