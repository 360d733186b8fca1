"""A caller's handle on one lease (``DeviceStateManager.lease``): acquire, heartbeat on a
background thread, release, and the manager that writes under it."""

from __future__ import annotations

import threading

from ..errors import CredentialRevoked, LeaseLost, OutcomeUnknown, StorageError, StorageUnavailable
from ..item.credentials import Holder
from .queue import LeaseGrant, LeaseQueue, check_ttl


class Lease:
    """One caller's lease on a device. As a context manager it acquires, heartbeats on a
    background thread every ttl/2 and releases on exit (also on an exception); or call
    ``acquire()``, ``heartbeat()`` and ``release()`` yourself. ``manager`` writes to the
    device under this lease's fencing token and refuses once the lease is lost. ``credential``: the
    device's own lease (``DeviceStateManager.as_device``), taken, heartbeaten and released only
    while the device holds it."""

    def __init__(self, queue: LeaseQueue, manager, device_id: str, ttl_seconds: float, wait_seconds: float,
                 owner: str | None, credential: Holder | None = None):
        self._queue = queue
        self._credential = credential
        self._manager = manager  # the DeviceStateManager ``manager`` fences
        self.device_id = device_id
        self.ttl_seconds = check_ttl(ttl_seconds)
        self.wait_seconds = wait_seconds
        self.owner = owner
        self.grant: LeaseGrant | None = None
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lease_id(self) -> str | None:
        return self.grant.lease_id if self.grant else None

    @property
    def fencing_token(self) -> int | None:
        return self.grant.fencing_token if self.grant else None

    @property
    def lease_token(self) -> str | None:
        return self.grant.lease_token if self.grant else None

    @property
    def expires_at(self) -> float | None:
        return self.grant.expires_at if self.grant else None

    @property
    def manager(self):
        """The device-state manager, fenced by this lease."""
        return self._manager.fenced({self.device_id: self})

    def lease_token_if_held(self) -> str:
        if self.grant is None or self.lost or self._queue.runtime.clock() >= self.grant.expires_at:
            raise LeaseLost(self.device_id, self.lease_id or "(not acquired)")
        return self.grant.lease_token

    def acquire(self) -> "Lease":
        self.grant = self._queue.acquire(self.device_id, self.ttl_seconds, self.wait_seconds, self.owner,
                                         self._credential)
        self.lost = False
        return self

    def heartbeat(self) -> "Lease":
        if self.grant is None:
            raise LeaseLost(self.device_id, "(not acquired)")
        try:
            self.grant = self._queue.heartbeat(self.device_id, self.grant.lease_id, self.ttl_seconds,
                                               self._credential)
        except (LeaseLost, CredentialRevoked):
            self.lost = True
            raise
        return self

    def release(self) -> bool:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        if self.grant is None:
            return False
        released = self._queue.release(self.device_id, self.grant.lease_id, self._credential)
        self.lost = True  # nothing may be written under it any more
        return released

    def __enter__(self) -> "Lease":
        self.acquire()
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat_loop, name=f"lease-{self.device_id}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def _heartbeat_loop(self) -> None:
        """Heartbeat every ttl/2, counted from each heartbeat's send (a slow answer does not push
        the next one later: the lease was extended when it was written); a failed heartbeat
        (storage trouble) is tried again sooner, and the lease counts as lost once it is refused
        or its expiry has passed."""
        interval = self.ttl_seconds / 2
        while not self._stop.wait(interval):
            sent = self._queue.runtime.monotonic()
            try:
                self.heartbeat()
                interval = max(0.0, self.ttl_seconds / 2 - (self._queue.runtime.monotonic() - sent))
            except (LeaseLost, CredentialRevoked):
                return
            except (StorageError, StorageUnavailable, OutcomeUnknown):  # try again sooner
                if self._queue.runtime.clock() >= self.grant.expires_at:
                    self.lost = True
                    self._queue.runtime.observer.lease_lost(self.device_id)
                    return
                interval = max(0.05, min(interval / 2, self.grant.expires_at - self._queue.runtime.clock()) / 2)
