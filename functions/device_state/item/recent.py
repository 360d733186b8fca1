"""What this container last saw of each device's write journal, so that a compiled patch
(which reads nothing) can drop the entries it knows are old in its own request instead
of a request of its own."""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator

from . import schema

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
            if known is None or int(known[schema.VERSION]["N"]) <= int(item[schema.VERSION]["N"]):
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
