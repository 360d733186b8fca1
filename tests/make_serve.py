"""`make serve` exactly as a reader types it (in the repo, from make), on a free port: the
process group is started here and stopped with SIGTERM, as Ctrl-C would."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

from functions.auth.credentials import DEVICE_TOKEN_VARIABLES
from functions.auth.credentials import VARIABLES as AUTH_VARIABLES
from functions.auth.device_tokens import ISSUING_VARIABLES
from functions.auth.sealing import VARIABLES as SEALING_VARIABLES
from localdev.dynamodb_local import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
TLS_CA = ".serve/tls/ca.pem"  # make serve TLS=1's local CA (TLS_DIR's default)


def checkout_bearer() -> dict:
    """Credentials `make serve` accepts: a token of this checkout's issuer, as `make -s token` prints."""
    from localdev.issuer import DEFAULT_DIRECTORY, Issuer

    return {"Authorization": f"Bearer {Issuer.load_or_create(REPO_ROOT / DEFAULT_DIRECTORY).token()}"}


def get(port: int, path: str, tls: bool = False) -> tuple[int, dict, bytes]:
    """A GET of make serve's, over HTTPS trusting its local CA (under .serve/tls) with ``tls``."""
    if tls:
        context = ssl.create_default_context(cafile=str(REPO_ROOT / TLS_CA))
        connection = http.client.HTTPSConnection("localhost", port, timeout=30, context=context)
    else:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers=checkout_bearer())
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


class Served:
    def __init__(self, port: int, log):
        self.port = port
        self._log = log

    @property
    def output(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")


@contextlib.contextmanager
def make_serve(**environment: str):
    """Runs `make -s serve` with PORT free and the given variables; yields a Served. Like a
    reader's, it trusts this checkout's own issuer (`make -s token`), not the suite's, and seals
    cursors and secrets with this checkout's own keys (.serve/cursor-key, .serve/sealing-key)."""
    port = free_port()
    env = {key: value for key, value in os.environ.items()
           if key not in ("DYNAMODB_ENDPOINT", "TABLE_NAME", "DYNAMODB_DATA_DIR", "CURSOR_KEY", *AUTH_VARIABLES,
                          *DEVICE_TOKEN_VARIABLES, *ISSUING_VARIABLES, *SEALING_VARIABLES)}
    env.update(PORT=str(port), WORKERS="2", **environment)
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(["make", "-s", "serve"], cwd=REPO_ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        served = Served(port, log)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    # The workers answer as soon as they fork, a moment before the banner is printed.
                    if (get(port, "/openapi.json", tls=environment.get("TLS") == "1")[0] == 200
                            and "For scripts and the library:" in served.output):
                        break
                except (OSError, ssl.SSLError):  # not listening yet, or its CA not made yet
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"make serve did not start:\n{served.output}")
                time.sleep(0.3)
            yield served
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
            _wait_for_group_to_exit(process.pid)


def _wait_for_group_to_exit(group: int, timeout: float = 30) -> None:
    """The server and its DynamoDB Local are in the group too; wait until they are all gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _running_in_group(group):
            return
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)


def _running_in_group(group: int) -> bool:
    """Whether a process of the group still runs. One that has exited but is not yet reaped (a
    zombie) holds no port or file; the server, orphaned when make exits first, waits for the
    machine's init to reap it (about a second in some containers), and kill(0) still finds it."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # it exited meanwhile
            continue
        if int(fields[2]) == group and fields[0] != "Z":  # state, ppid, pgrp
            return True
    return False
