"""Small test doubles around a real DynamoDB client."""

from __future__ import annotations

import threading

import pytest


class RecordingClient:
    """Passes every call to a real client and records the operation names (and in
    ``requests``, each with its arguments), so a test can tell which requests were (or were
    not) sent."""

    def __init__(self, client):
        self._client = client
        self.calls: list[str] = []
        self.requests: list[tuple[str, dict]] = []
        self._lock = threading.Lock()

    def __getattr__(self, name):
        attribute = getattr(self._client, name)
        if not callable(attribute) or name.startswith("_") or name in ("exceptions", "meta", "get_waiter"):
            return attribute

        def call(*args, **kwargs):
            with self._lock:
                self.calls.append(name)
                self.requests.append((name, kwargs))
            return attribute(*args, **kwargs)

        return call

    def count(self, operation: str) -> int:
        return self.calls.count(operation)

    @property
    def writes(self) -> list[str]:
        return [c for c in self.calls if c in ("put_item", "update_item", "delete_item", "transact_write_items")]


class Clock:
    """A wall clock (epoch seconds) that only moves when a test moves ``now``."""

    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeTime:
    """A monotonic clock that only moves when the code under test sleeps."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def served(server):
    """``server`` (a socketserver) serving on a daemon thread; returns a ``stop()`` that shuts it down
    and closes it. It looks for its shutdown every 5 ms: at the default half second, or the 50 ms
    tests used, each test that stops a server waited that long for nothing."""
    threading.Thread(target=server.serve_forever, args=(0.005,), daemon=True).start()

    def stop():
        server.shutdown()
        server.server_close()
    return stop


def once(action):
    """``action`` the first time it is called only (a fault's ``then`` runs for each lost answer)."""
    calls = []

    def run():
        if not calls:
            calls.append(1)
            action()
    return run


class Stall:
    """DynamoDB Local (``engine``) stalled (``pause()``) as the next ``target`` request whose body
    matches ``when`` reaches the forwarder, which then sends that very request on to wait in the
    stopped engine. With ``more`` predicates, each request one matches is held in the forwarder
    until each predicate has matched one; the engine is stopped then, and they go on to wait in it.
    A held request's resend (its client gave up waiting) is held too, as the stopped engine would
    hold it. ``held()`` once the engine is held; a pause that failed raises there, in the test,
    not in the forwarder's thread. ``disarm()`` takes the hooks back and lets what they hold go on
    (else a late request would stop the engine after the test resumed it)."""

    def __init__(self, forwarder, engine, target: str, when, *more):
        self._came, self._errors = threading.Event(), []
        predicates = (when, *more)
        self.came_for: set[int] = set()  # the predicates a request has matched (their positions)
        go, lock, hooks = threading.Event(), threading.Lock(), []  # go: the engine stopped, or disarmed

        def arm(index: int) -> None:
            hooks.append(forwarder.before(target, lambda: hold(index), when=predicates[index]))

        def hold(index: int) -> None:
            with lock:
                last = index not in self.came_for and len(self.came_for) == len(predicates) - 1
                self.came_for.add(index)
                if not go.is_set():
                    arm(index)
            if last:
                try:
                    engine.pause()
                except Exception as error:  # noqa: BLE001 - raised in the test by held()
                    self._errors.append(error)
                finally:
                    self._came.set()
                    go.set()
            go.wait(60)

        def disarm() -> None:
            with lock:
                go.set()
                for take_back in hooks:
                    take_back()
        self.disarm = disarm
        for index in range(len(predicates)):
            arm(index)

    def held(self, timeout: float = 30) -> bool:
        came = self._came.wait(timeout)
        if self._errors:
            raise self._errors[0]
        return came


def run_writers(writers: int, per_writer: int, write) -> list[Exception]:
    """``write(index, step)`` for ``per_writer`` steps in each of ``writers`` threads, released
    together; the errors they raised (a writer stops at its first)."""
    barrier = threading.Barrier(writers)
    errors: list[Exception] = []

    def writer(index):
        barrier.wait()
        try:
            for step in range(per_writer):
                write(index, step)
        except Exception as error:  # noqa: BLE001 - returned to the test
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(index,)) for index in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


@pytest.fixture(scope="module", name="dynamodb_local")
def own_dynamodb_local():
    """A module's own DynamoDB Local, in place of the session's (import it into the module):
    DynamoDB Local builds an index added by UpdateTable (as ensure_table adds one) in the
    background, and under load was seen to fail DescribeTable meanwhile (InternalFailure) or
    leave the index CREATING with no error in its log; a JVM of the module's own keeps that
    apart from the rest of the suite."""
    from tests.conftest import started_dynamodb_local

    yield from started_dynamodb_local()
