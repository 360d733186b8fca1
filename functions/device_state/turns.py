"""Turns: one read-modify-write at a time per device among the writers that share a
manager, in the order they asked.

Writers that race on one device through optimistic locking mostly lose: each conditional
write that finds the device moved is billed and wasted, and 16 threads racing on one
device lose about three writes per update. Writers in one process need not race: they wait
for their turn here (free: no call to DynamoDB), so only writers in other processes can
still move the device under them. Waiting counts against the writer's budget."""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from typing import Iterator


class DeviceTurns:
    def __init__(self):
        self._lock = threading.Lock()
        self._queues: dict[str, deque[threading.Event]] = {}

    @contextmanager
    def turn(self, device_id: str, timeout: float) -> Iterator[bool]:
        """Yields True once it is this writer's turn on the device (held until the block
        ends), or False, holding nothing, when ``timeout`` seconds passed first."""
        ticket = threading.Event()
        with self._lock:
            queue = self._queues.setdefault(device_id, deque())
            queue.append(ticket)
            if len(queue) == 1:
                ticket.set()
        if not ticket.wait(max(0.0, timeout)):
            with self._lock:
                gave_up = not ticket.is_set()  # else it was handed the turn just now
                if gave_up:
                    queue.remove(ticket)
            if gave_up:
                yield False
                return
        try:
            yield True
        finally:
            with self._lock:
                queue.popleft()
                if queue:
                    queue[0].set()
                else:
                    del self._queues[device_id]

    def waiting(self, device_id: str) -> int:
        """Writers holding or waiting for the device's turn."""
        with self._lock:
            return len(self._queues.get(device_id, ()))
