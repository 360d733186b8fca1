"""Devices over mutual TLS on the real dev server (`TLS=1`), with real TLS clients: a device
certificate of the local CA is its device's whole credential (its own device's reads and
reports, nothing else), a certificate and a token together are refused, another CA's
certificate never gets past the handshake, and a client without one uses tokens as usual.
The CA lives in a temporary TLS_DIR, never in the checkout's .serve/."""

from __future__ import annotations

import json
import os
import socket
import signal
import ssl
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from functions.auth.credentials import certificate_principal
from localdev.tls import LocalCA
from tests.api.test_http import launch
from tests.auth import NO_CREDENTIALS, bearer
from tests.make_serve import REPO_ROOT

pytestmark = pytest.mark.dynamodb_local
READ_SECONDS = 2  # the server's deadline for a handshake and a request
MERGE = {"Content-Type": "application/merge-patch+json"}
CERTIFICATE_ONLY = {**NO_CREDENTIALS, **MERGE}


def client_context(ca: LocalCA, certificate: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A TLS client that trusts the local CA, presenting ``certificate`` (paths) if given."""
    context = ssl.create_default_context(cafile=ca.certificate_path)
    if certificate:
        context.load_cert_chain(*certificate)
    return context


@pytest.fixture(scope="module")
def local_ca(tmp_path_factory) -> LocalCA:
    return LocalCA.load_or_create(tmp_path_factory.mktemp("tls"))


def launch_with_lamps(dynamodb_local, local_ca: LocalCA, table_prefix: str, **env):
    """`make serve TLS=1` on a table of its own holding lamp-1 and lamp-2 (created by a
    back-end with a token, over TLS without a certificate)."""
    process, candidate = launch(tls=client_context(local_ca), DYNAMODB_ENDPOINT=dynamodb_local.endpoint,
                                TABLE_NAME=f"{table_prefix}-{uuid.uuid4().hex[:8]}", TLS="1",
                                TLS_DIR=str(local_ca.directory), **env)
    for device in ("lamp-1", "lamp-2"):
        status, _, body = candidate.request("POST", "/devices", {"deviceId": device, "state": {"power": "on"}},
                                            headers=bearer())
        assert status == 201, body
    return process, candidate


@pytest.fixture(scope="module")
def server(dynamodb_local, local_ca):
    process, candidate = launch_with_lamps(dynamodb_local, local_ca, "mtls", WORKERS="2", STREAM_PROCESSOR="off",
                                           REQUEST_READ_SECONDS=str(READ_SECONDS))
    yield candidate
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def lamp_1(local_ca) -> ssl.SSLContext:
    return client_context(local_ca, local_ca.device_certificate("lamp-1"))


def device(server, device_id: str) -> dict:
    status, _, body = server.request("GET", f"/devices/{device_id}", headers=bearer())
    assert status == 200, body
    return json.loads(body)


def problem_type(body: bytes) -> str:
    return json.loads(body)["type"].rsplit(":", 1)[-1]


def test_the_server_says_it_serves_https_and_where_its_ca_is(server, local_ca):
    assert f"Serving the device-state API on https://127.0.0.1:{server.port} " in server.log
    assert f"curl --cacert {local_ca.certificate_path}" in server.log


def test_a_device_certificate_reports_and_reads_its_own_device(server, lamp_1):
    before = device(server, "lamp-1")
    status, _, body = server.request("PATCH", "/devices/lamp-1/reported", {"brightness": 60},
                                     headers=CERTIFICATE_ONLY, tls=lamp_1)
    assert status == 200, body
    status, headers, body = server.request("GET", "/devices/lamp-1", headers=NO_CREDENTIALS, tls=lamp_1)
    assert status == 200, body
    assert json.loads(body)["reported"]["brightness"] == 60
    assert json.loads(body)["version"] == before["version"] + 1 == int(headers["etag"].strip('"'))
    for path in ("/devices/lamp-1/delta", "/devices/lamp-1/leases"):
        assert server.request("GET", path, headers=NO_CREDENTIALS, tls=lamp_1)[0] == 200, path


@pytest.mark.parametrize("method, path, body", [
    ("PATCH", "/devices/lamp-1", {"power": "off"}),
    ("PATCH", "/devices/lamp-1/desired", {"power": "off"}),
    ("PUT", "/devices/lamp-1", {"state": {}}),
    ("DELETE", "/devices/lamp-1", None),
    ("PATCH", "/devices/lamp-2/reported", {"brightness": 1}),
    ("GET", "/devices/lamp-2", None),
    ("GET", "/devices", None),
    ("POST", "/devices", {"deviceId": "lamp-3", "state": {}}),
])
def test_a_device_certificate_may_do_nothing_else_and_a_refusal_writes_nothing(server, lamp_1, method, path, body):
    before = {name: device(server, name) for name in ("lamp-1", "lamp-2")}
    status, headers, answer = server.request(method, path, body, headers=CERTIFICATE_ONLY, tls=lamp_1)
    assert status == 403, answer
    assert headers["content-type"] == "application/problem+json" and problem_type(answer) == "forbidden"
    assert {name: device(server, name) for name in before} == before
    assert server.request("GET", "/devices/lamp-3", headers=bearer())[0] == 404


@pytest.mark.parametrize("method, path, body", [
    ("PATCH", "/devices/lamp-1/reported", {"brightness": 5}),
    ("GET", "/devices/lamp-1", None),
    ("POST", "/devices/lamp-1/provision", None),  # a route that takes an assertion alone: it was 401
])
def test_a_certificate_and_a_token_together_are_a_400_problem_and_write_nothing(server, lamp_1, method, path, body):
    before = device(server, "lamp-1")
    status, headers, answer = server.request(method, path, body, headers={**bearer(), **MERGE}, tls=lamp_1)
    assert status == 400, answer
    assert headers["content-type"] == "application/problem+json" and problem_type(answer) == "mixed-credentials"
    assert device(server, "lamp-1") == before


def test_a_token_its_registered_certificate_got_is_refused_once_its_device_is_deleted_and_created_again(
        server, local_ca):
    """Deleting a device revokes its credentials and every token minted from them (identity.md). A
    token minted over mutual TLS from a registered certificate still opened the device created
    again (no certificate registered on it: the CA's rule), found by a hostile review; the
    certificate itself does, by that rule."""
    from functions.auth.principals import ADMIN_SCOPE

    paths = local_ca.device_certificate("lamp-9")
    own = client_context(local_ca, paths)
    assert server.request("POST", "/devices", {"deviceId": "lamp-9", "state": {}}, headers=bearer())[0] == 201
    status, _, body = server.request("POST", "/devices/lamp-9/credentials", {
        "type": "certificate", "certificate": paths[0].read_text()}, headers=bearer((ADMIN_SCOPE,)))
    assert status == 201, body
    status, _, body = server.request("POST", "/devices/lamp-9/token", headers=NO_CREDENTIALS, tls=own)
    assert status == 200, body
    minted = {"Authorization": f"Bearer {json.loads(body)['token']}"}
    assert server.request("GET", "/devices/lamp-9", headers=minted)[0] == 200
    assert server.request("DELETE", "/devices/lamp-9", headers=bearer())[0] == 204
    assert server.request("POST", "/devices", {"deviceId": "lamp-9", "state": {}}, headers=bearer())[0] == 201
    status, _, body = server.request("GET", "/devices/lamp-9", headers=minted)
    assert (status, problem_type(body)) == (401, "credential-revoked"), body
    assert server.request("GET", "/devices/lamp-9", headers=NO_CREDENTIALS, tls=own)[0] == 200


def test_another_cas_certificate_is_refused_at_the_handshake_and_the_server_keeps_serving(
        server, local_ca, lamp_1, tmp_path):
    stranger = LocalCA.load_or_create(tmp_path)  # same names as the local CA, another key
    context = client_context(local_ca, stranger.device_certificate("lamp-1"))
    before = device(server, "lamp-1")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        with pytest.raises(ssl.SSLError):  # the server's alert: unknown CA
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as connection:
                connection.recv(1)  # under TLS 1.3 the client learns of the refusal on its first read
    # A whole request: refused the same way (or, when the refusal meets the request on the
    # wire, the connection is reset), and nothing is written.
    with pytest.raises(OSError):
        server.request("PATCH", "/devices/lamp-1/reported", {"brightness": 1}, headers=CERTIFICATE_ONLY,
                       tls=context)
    assert device(server, "lamp-1") == before
    assert server.request("GET", "/devices/lamp-1", headers=NO_CREDENTIALS, tls=lamp_1)[0] == 200
    refusals = [line for line in server.log.splitlines() if "TLS handshake failed" in line]
    assert refusals and "certificate verify failed" in refusals[-1], server.log[-2000:]
    assert "Traceback" not in server.log


def test_a_stalled_handshake_holds_up_only_its_own_worker_until_the_deadline(server, lamp_1):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as stalled:  # sends no ClientHello
        time.sleep(0.3)  # a worker has accepted it and waits in the handshake
        started = time.monotonic()
        assert server.request("GET", "/devices/lamp-1", headers=NO_CREDENTIALS, tls=lamp_1)[0] == 200
        assert time.monotonic() - started < READ_SECONDS
        assert stalled.recv(1) == b""  # closed by the server at the deadline
    assert "Traceback" not in server.log


def test_without_a_client_certificate_tokens_work_as_usual(server):
    status, _, body = server.request("GET", "/devices", headers=bearer())
    assert status == 200 and {"lamp-1", "lamp-2"} <= {d["deviceId"] for d in json.loads(body)["items"]}
    status, _, body = server.request("PATCH", "/devices/lamp-2/reported", {"power": "on"},
                                     headers={**bearer(device="lamp-2"), **MERGE})
    assert status == 200, body
    status, headers, body = server.request("GET", "/devices/lamp-1", headers=NO_CREDENTIALS)
    assert status == 401 and problem_type(body) == "unauthorized" and headers["www-authenticate"] == "Bearer"


def test_a_device_long_poll_over_tls_waits_and_one_whose_client_hangs_up_is_stopped(server, lamp_1):
    version = device(server, "lamp-1")["version"]
    started = time.monotonic()
    status, _, body = server.request("GET", f"/devices/lamp-1/changes?since={version}&waitSeconds=2",
                                     headers=NO_CREDENTIALS, tls=lamp_1)
    assert status == 200 and time.monotonic() - started >= 1.9, body  # not taken for a hang-up at once
    request = (f"GET /devices/lamp-1/changes?since={version}&waitSeconds=20 HTTP/1.1\r\n"
               f"Host: 127.0.0.1\r\nContent-Length: 0\r\n\r\n").encode()
    with lamp_1.wrap_socket(socket.create_connection(("127.0.0.1", server.port)),
                            server_hostname="127.0.0.1") as connection:
        connection.sendall(request)
        time.sleep(0.5)  # the server has it and waits on it; then the client goes
    deadline = time.monotonic() + 5
    while "client hung up while waiting" not in server.log:
        assert time.monotonic() < deadline, server.log[-2000:]
        time.sleep(0.1)


@pytest.mark.toolchain
def test_make_device_cert_prints_the_certificate_and_then_the_key(tmp_path):
    env = {**os.environ, "TLS_DIR": str(tmp_path)}
    result = subprocess.run(["make", "-s", "device-cert", "DEVICE=lamp-1"], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    certificate, key = (Path(line) for line in result.stdout.splitlines())
    assert certificate.is_file() and key.is_file()
    assert certificate.is_relative_to(tmp_path) and key.stat().st_mode & 0o777 == 0o600
    assert certificate_principal(certificate.read_text()).device_id == "lamp-1"
    refused = subprocess.run(["make", "-s", "device-cert", "DEVICE=no/such"], cwd=REPO_ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and refused.stdout == "" and "DEVICE must be" in refused.stderr


def test_the_hang_up_watch_reads_the_tcp_stream_beneath_tls(local_ca, lamp_1):
    """Under TLS, a client that sends more while its request waits is still there (an SSLSocket
    refuses to peek, which the watch took for a hang-up), and one that closes after sending
    more (as a close_notify comes before a FIN) is gone."""
    from localdev import http_front

    signals = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: signals.append(1))
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        accepting = ThreadPoolExecutor(1).submit(
            lambda: local_ca.server_context().wrap_socket(listener.accept()[0], server_side=True))
        client = lamp_1.wrap_socket(socket.create_connection(listener.getsockname(), timeout=5),
                                    server_hostname="127.0.0.1")
        accepted = accepting.result(timeout=5)
        done = threading.Event()
        watch = threading.Thread(target=http_front.watch_for_hang_up, args=(accepted, done))
        watch.start()  # as the dev server watches a waiting request's connection
        client.sendall(b"more")
        time.sleep(0.5)
        assert signals == []
        client.close()
        watch.join(timeout=5)
        assert signals == [1] and not watch.is_alive()
        accepted.close()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        listener.close()
