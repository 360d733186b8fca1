"""What a copy of an initialised process must renew. Lambda SnapStart starts many execution
environments from one memory snapshot taken after init, so a random generator created
before it would draw the same numbers in every copy (the same retry jitter everywhere),
and a pooled connection would be a socket of the process that was snapshotted.

The library's generators come from ``random_generator()``; ``after_restore()`` reseeds
every one of them from the operating system's entropy and runs what modules registered
with ``on_restore`` (the cached DynamoDB clients and managers are dropped, so the next
request creates them afresh). Write ids need nothing: their nonce comes from ``secrets``
(the operating system's generator, which Lambda keeps unique per restored environment).
``register_with_lambda()`` hands ``after_restore`` to the Lambda runtime's hook; outside
Lambda (no ``snapshot_restore_py``) it does nothing."""

from __future__ import annotations

import random
import threading
import weakref
from typing import Callable

_generators: "weakref.WeakSet[random.Random]" = weakref.WeakSet()
_renewals: list[Callable[[], None]] = []
_lock = threading.Lock()


def random_generator() -> random.Random:
    """A generator seeded from the operating system, reseeded after every restore."""
    generator = random.Random()
    with _lock:
        _generators.add(generator)
    return generator


def on_restore(renew: Callable[[], None]) -> Callable[[], None]:
    """Run ``renew`` after every restore (e.g. a cache's ``cache_clear``)."""
    with _lock:
        _renewals.append(renew)
    return renew


def after_restore() -> None:
    with _lock:
        generators, renewals = list(_generators), list(_renewals)
    for generator in generators:
        generator.seed()  # from os.urandom: fresh in each restored copy
    for renew in renewals:
        renew()


def register_with_lambda() -> bool:
    """Register ``after_restore`` with the Lambda runtime's SnapStart hooks, where there are any."""
    try:
        from snapshot_restore_py import register_after_restore
    except ImportError:  # not in Lambda's Python runtime: nothing is ever restored
        return False
    register_after_restore(after_restore)
    return True
