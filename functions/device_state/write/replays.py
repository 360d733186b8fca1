"""Recorded answers of keyed writes: the record an idempotency key left, read back as the
devices it answered (``idempotency.recorded_results``), each at its version from the state
item while it is there, else from the change log's history."""

from __future__ import annotations

from . import keyed as idem
from ..item import schema
from ..feed.log import ChangeLog, VersionNotFound
from ..model.device import Device
from ..errors import StorageUnavailable
from .keyed import IdempotencyKey
from ..runtime import Runtime
from .store import Store

REPLAY_HISTORY_WAIT_SECONDS = 5.0  # a replay waits this long for the feed to record a version


class RecordedAnswers:
    def __init__(self, store: Store, history: ChangeLog, runtime: Runtime):
        self._store = store
        self._history = history
        self._runtime = runtime

    def results(self, partition: str, key: IdempotencyKey) -> list[tuple[Device, str]] | None:
        """(device, outcome) per device of the keyed write recorded in ``partition``, or None
        when there is none; ``IdempotencyKeyReused`` when the key was used for another request."""
        record = self._store.get(idem.record_key(partition, key))
        results = idem.recorded_results(partition, key, record, self._runtime.clock(), self._store.get,
                                        self._device_at)
        if results is not None:
            self._runtime.observer.replayed(partition)
        return results

    def _device_at(self, device_id: str, version: int) -> Device:
        """The device at ``version`` (state and sections): its state item while it is there, else the
        feed's history (written a moment after the version; waited for that long)."""
        runtime = self._runtime
        deadline = runtime.monotonic() + REPLAY_HISTORY_WAIT_SECONDS
        while True:
            item = self._store.get_state(device_id)
            if item is not None and schema.VERSION in item and int(item[schema.VERSION]["N"]) == version \
                    and schema.STATE in item:
                return Device.from_item(item)
            try:
                return self._history.at_version(device_id, version)
            except VersionNotFound:
                if runtime.monotonic() >= deadline:
                    raise StorageUnavailable(f"the recorded answer of {device_id} at version {version} cannot be "
                                             "read back yet") from None
            runtime.sleep(0.1)
