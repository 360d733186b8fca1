"""The device client's requests, against a small HTTP(S) server of the test's own that records
what it is sent and answers from a script: the shape of an ack (tests/api/test_device_client.py
sends acks to the real route too), retries of a
write under one Idempotency-Key after 504 and 429 honouring Retry-After, and a certificate
exchanged for a token over mutual TLS, renewed at 80 % of its life and waited out on 429/503."""

from __future__ import annotations

import base64
import http.server
import json
import re
import ssl
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from localdev.tls import LocalCA
from tests.helpers import served
from tests.make_serve import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "clients" / "python"))
from device_state_client import (ApiError, Backoff, CertificateCredentials, DeviceClient,  # noqa: E402
                                 OutcomeUnknown, TokenCredentials)
from device_state_client.client import retry_after  # noqa: E402
from device_state_client.credentials import token_expiry  # noqa: E402

DEVICE = {"deviceId": "lamp-1", "version": 8, "state": {}, "desired": {}, "reported": {}, "delta": {}}


class ScriptedServer:
    """Answers each request with the next ``(status, headers, body)`` of ``script`` (the last
    one repeated; a body of None answers with none, bytes as they are) and records ``(method, path, headers,
    body, client certificate)``, the body's numbers as sent (``Decimal``), its bytes in ``raw``."""

    def __init__(self, script, tls: ssl.SSLContext | None = None):
        self.script, self.requests, self.raw = list(script), [], []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw, parse_float=Decimal) if length else None
                peer = self.connection.getpeercert() if tls else None
                recorder.requests.append((self.command, self.path, dict(self.headers), body, peer))
                recorder.raw.append(raw)
                status, headers, answer = recorder.script.pop(0) if len(recorder.script) > 1 else recorder.script[0]
                payload = answer if isinstance(answer, bytes) else b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _answer

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self.close = served(self._server)


@pytest.fixture
def scripted():
    servers = []

    def start(*script, tls=None):
        servers.append(ScriptedServer(script, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _client(server, sleeps=None, scheme="http", credentials=None) -> DeviceClient:
    return DeviceClient(f"{scheme}://127.0.0.1:{server.port}/", "lamp-1", credentials or TokenCredentials("t0k"),
                        sleep=(sleeps.append if sleeps is not None else lambda seconds: None))


def test_an_ack_is_posted_to_the_desired_acks_route_in_the_contracts_shape(scripted):
    server = scripted((200, {}, DEVICE))
    client = _client(server)
    assert client.ack("/brightness", 7, 400, "out of range 0-100") == DEVICE
    client.ack_many([{"path": "/power", "version": 7, "code": 200}, {"path": "/mode", "version": 8, "code": 422}])
    (method, path, headers, body, _), (_, _, _, many, _) = server.requests
    assert (method, path) == ("POST", "/devices/lamp-1/desired/acks")
    assert body == {"acks": [{"path": "/brightness", "version": 7, "code": 400, "reason": "out of range 0-100"}]}
    assert many == {"acks": [{"path": "/power", "version": 7, "code": 200}, {"path": "/mode", "version": 8, "code": 422}]}
    assert headers["Content-Type"] == "application/json" and headers["Authorization"] == "Bearer t0k"
    assert headers["Idempotency-Key"]


def test_an_ack_of_a_desire_that_has_moved_on_is_409_and_not_retried(scripted):
    server = scripted((409, {}, {"type": "urn:device-state:problem:conflict", "status": 409, "detail": "moved"}))
    with pytest.raises(ApiError) as refused:
        _client(server).ack("/brightness", 7, 200)
    assert refused.value.status == 409 and len(server.requests) == 1


def test_a_report_answered_504_is_resent_with_the_same_key_and_body(scripted):
    unknown = {"type": "urn:device-state:problem:outcome-unknown", "status": 504, "detail": "lost"}
    server = scripted((504, {}, unknown), (200, {"Idempotent-Replayed": "true"}, DEVICE))
    assert _client(server).report({"power": "on"}) == DEVICE
    first, second = server.requests
    assert first[:2] == second[:2] == ("PATCH", "/devices/lamp-1/reported")
    assert first[2]["Content-Type"] == "application/merge-patch+json"
    assert first[2]["Idempotency-Key"] == second[2]["Idempotency-Key"] and first[3] == second[3] == {"power": "on"}



def test_an_ack_whose_outcome_is_unknown_is_sent_again_under_the_key_it_raised_with(scripted):
    unknown = {"type": "urn:device-state:problem:outcome-unknown", "status": 504, "detail": "lost"}
    server = scripted((504, {}, unknown))
    lamp = _client(server)
    lamp.write_attempts = 2
    with pytest.raises(OutcomeUnknown) as raised:
        lamp.ack("/power", 3, 200)
    server.script[:] = [(200, {"Idempotent-Replayed": "true"}, DEVICE)]
    assert lamp.ack("/power", 3, 200, idempotency_key=raised.value.idempotency_key) == DEVICE
    assert lamp.ack_many([{"path": "/power", "version": 3, "code": 200}], idempotency_key="k-9") == DEVICE
    keys = [headers["Idempotency-Key"] for _, _, headers, _, _ in server.requests]
    assert keys == [raised.value.idempotency_key] * 3 + ["k-9"]

def test_429_and_503_are_waited_out_as_retry_after_says_and_4xx_is_not_retried(scripted):
    sleeps = []
    server = scripted((429, {"Retry-After": "3"}, {"status": 429}), (503, {"Retry-After": "1"}, {"status": 503}),
                      (200, {}, DEVICE))
    assert _client(server, sleeps).report({"power": "on"}, idempotency_key="k-1") == DEVICE
    assert sleeps == [3.0, 1.0] and {request[2]["Idempotency-Key"] for request in server.requests} == {"k-1"}
    refused = scripted((422, {}, {"status": 422, "detail": "key reused"}))
    with pytest.raises(ApiError):
        _client(refused).report({"power": "on"})
    assert len(refused.requests) == 1


def test_a_write_gives_up_after_its_attempts(scripted):
    server = scripted((503, {}, {"status": 503}))
    client = _client(server)
    client.write_attempts = 3
    with pytest.raises(ApiError) as failed:
        client.report({"power": "on"})
    assert failed.value.status == 503 and len(server.requests) == 3


def test_delta_long_polls_with_since_and_wait_seconds(scripted):
    server = scripted((200, {}, {"deviceId": "lamp-1", "version": 8, "delta": {}}))
    _client(server).delta(since=7, wait_seconds=20)
    _client(server).delta()
    assert [request[1] for request in server.requests] == ["/devices/lamp-1/delta?since=7&waitSeconds=20",
                                                           "/devices/lamp-1/delta"]


def _jwt(exp: int) -> str:
    part = base64.urlsafe_b64encode(json.dumps({"exp": exp}).encode()).rstrip(b"=").decode()
    return f"e30.{part}.sig"


@pytest.fixture(scope="module")
def local_ca(tmp_path_factory) -> LocalCA:
    return LocalCA.load_or_create(tmp_path_factory.mktemp("tls"))


def _mutual_tls(ca: LocalCA) -> ssl.SSLContext:
    context = ca.server_context()
    context.verify_mode = ssl.CERT_REQUIRED  # as the deployed device domain: no certificate, no handshake
    return context


def test_a_certificate_is_exchanged_for_a_token_over_mutual_tls_and_renewed_at_80_percent(scripted, local_ca):
    issued = {"token": _jwt(2_000_000_000), "tokenType": "Bearer", "expiresIn": 100,
              "expiresAt": "2033-05-18T03:33:20Z"}
    server = scripted((429, {"Retry-After": "2"}, {"status": 429}), (200, {}, issued), (200, {}, DEVICE),
                      (200, {}, issued), tls=_mutual_tls(local_ca))
    certificate, key = local_ca.device_certificate("lamp-1")
    now, sleeps = [0.0], []
    credentials = CertificateCredentials(str(certificate), str(key), str(local_ca.certificate_path),
                                         clock=lambda: now[0])
    client = _client(server, sleeps, scheme="https", credentials=credentials)
    assert credentials.bearer_token(client) == issued["token"]  # after waiting out the 429
    assert client.get() == DEVICE
    now[0] = 79
    assert credentials.bearer_token(client) == issued["token"]  # still young: no request
    now[0] = 81
    credentials.bearer_token(client)
    assert [(method, path) for method, path, *_ in server.requests] == [
        ("POST", "/devices/lamp-1/token"), ("POST", "/devices/lamp-1/token"), ("GET", "/devices/lamp-1"),
        ("POST", "/devices/lamp-1/token")]
    assert sleeps == [2.0]
    for _, _, headers, _, peer in server.requests:
        assert "Authorization" not in headers  # the certificate is the whole credential: never a token beside it
        assert dict(pair[0] for pair in peer["subject"])["commonName"] == "lamp-1"
    # The local CA is trusted beside the system's, not instead: the WebSocket API's certificate is a public one.
    assert client.ssl_context.cert_store_stats()["x509_ca"] == ssl.create_default_context().cert_store_stats()[
        "x509_ca"] + 1


def test_the_websocket_url_follows_the_apis_and_a_jwt_expiry_is_read(scripted):
    client = DeviceClient("https://api.example.com/prod", "lamp:1", TokenCredentials("t"))
    assert client.websocket_url == "wss://api.example.com/prod/ws"
    assert DeviceClient("http://127.0.0.1:3000", "x", TokenCredentials("t")).websocket_url == "ws://127.0.0.1:3000/ws"
    assert client._path == "devices/lamp%3A1"
    assert token_expiry(_jwt(1234)) == 1234.0 and token_expiry("not a jwt") is None


def test_backoff_grows_with_jitter_to_its_cap_and_retry_after_takes_seconds_or_a_date():
    backoff = Backoff(first=1, cap=8)
    delays = [backoff.next_delay() for _ in range(6)]
    for delay, ceiling in zip(delays, [1, 2, 4, 8, 8, 8]):
        assert ceiling / 2 <= delay <= ceiling
    backoff.reset()
    assert backoff.next_delay() <= 1
    assert retry_after({"Retry-After": "5"}) == 5.0 and retry_after({}) is None
    assert retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # a date in the past: at once
    assert retry_after({"Retry-After": "soon"}) is None


def test_the_package_imports_nothing_of_the_service():
    source = "\n".join(path.read_text() for path in Path(REPO_ROOT / "clients" / "python" / "device_state_client")
                       .glob("*.py"))
    assert "functions" not in source and "localdev" not in source


def test_the_leaves_a_change_wrote_are_read_from_its_patch_whatever_its_shape():
    from device_state_client import Change

    def change(patch):
        return Change("lamp-1", 2, 1, "updated", ("desired",), patch, {}, "2026-11-26T00:00:00Z")

    assert change([{"op": "replace", "path": "/desired/brightness", "value": 7},
                   {"op": "add", "path": "/reported/brightness", "value": 5}]).leaves_written() == {"/brightness": 7}
    assert change([{"op": "add", "path": "/desired/color", "value": {"r": 1, "a/b": {}}},
                   {"op": "remove", "path": "/desired/mode"}]).leaves_written() == {
        "/color/r": 1, "/color/a~1b": {}, "/mode": None}
    created = change([{"op": "add", "path": "/state", "value": {}},
                      {"op": "add", "path": "/desired", "value": {"power": "on", "levels": [1, 2]}}])
    assert created.leaves_written() == {"/power": "on", "/levels": [1, 2]}
    whole = change([{"op": "replace", "path": "", "value": {"state": {}, "desired": {"power": "off"}, "reported": {}}}])
    assert whole.leaves_written() == {"/power": "off"} and whole.leaves_written("reported") == {}
    assert change(None).leaves_written() is None


def test_the_package_readme_keeps_the_docs_rules():
    """Not among the documents tests/test_readme_examples.py runs, so its rules are checked
    here: every fenced block marked (the lamp runs in tests/api/test_device_client.py), no
    build-history phrases."""
    from tests.test_readme_examples import FENCE, MARK

    text = (REPO_ROOT / "clients" / "python" / "README.md").read_text()
    marks = [MARK.search(text[:block.start()]) for block in FENCE.finditer(text)]
    assert marks and all(marks), [mark and mark.groups() for mark in marks]
    assert ("readme-test", "lamp") in [mark.groups() for mark in marks]
    for number, line in enumerate(text.splitlines(), 1):
        assert not re.search(r"\bno longer\b|\banymore\b|\bnow\b|before,|\bissue \d+", line, re.I), (number, line)


# --- assertions a device signs (KeyCredentials, SecretCredentials, EnrollmentCredentials) -------


@pytest.mark.parametrize("kind", ["EC", "RSA", "secret"])
def test_the_clients_assertions_are_what_the_service_verifies(kind):
    """Signed by the client package alone (its own JWT code), read and verified by the service's
    functions/auth/assertions.py: the claims it checks, the algorithm of the credential."""
    import time

    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    from device_state_client import sign_assertion
    from functions.auth import assertions

    if kind == "secret":
        secret = base64.b64encode(b"s" * 32).decode()
        token = sign_assertion("lamp-1", "cred-1", secret=secret)
        algorithm, key = assertions.HS256, b"s" * 32
    else:
        private = ec.generate_private_key(ec.SECP256R1()) if kind == "EC" else rsa.generate_private_key(65537, 2048)
        token = sign_assertion("lamp-1", "cred-1", private_key=private)
        key = private.public_key()
        algorithm = assertions.key_algorithm(key)
    read = assertions.read(token, "lamp-1", time.time())
    assert (read.kid, read.algorithm) == ("cred-1", algorithm)
    assert read.claims["exp"] - read.claims["iat"] <= assertions.MAX_LIFETIME_SECONDS
    assertions.verify(read, algorithm, key)
    again = assertions.read(sign_assertion("lamp-1", "cred-1", secret="c2VjcmV0"), "lamp-1", time.time())
    assert again.jti != read.jti  # a new jti each time
    with pytest.raises(assertions.AssertionSubject):
        assertions.read(token, "lamp-2", time.time())


def test_the_derived_device_key_is_the_services_hmac_of_the_group_key():
    from device_state_client import derive_device_key
    from functions.auth import assertions

    group_key = bytes(range(32))
    derived = derive_device_key(base64.b64encode(group_key).decode(), "lamp-000123")
    assert base64.b64decode(derived) == assertions.device_key(group_key, "lamp-000123")


def test_a_key_credential_gets_its_token_by_assertion_and_renews_it_the_same_way(scripted):
    from cryptography.hazmat.primitives.asymmetric import ec

    from device_state_client import KeyCredentials

    now = [0.0]
    answer = (200, {}, {"token": "t-1", "tokenType": "Bearer", "expiresIn": 3600, "expiresAt": "x"})
    server = scripted(answer, (200, {}, DEVICE), answer, (200, {}, DEVICE))
    credentials = KeyCredentials("cred-1", ec.generate_private_key(ec.SECP256R1()), clock=lambda: now[0])
    client = _client(server, credentials=credentials)
    client.get()
    now[0] = 2900  # past 80 % of 3600 s
    client.get()
    paths = [(method, path) for method, path, *_ in server.requests]
    assert paths == [("POST", "/devices/lamp-1/token"), ("GET", "/devices/lamp-1")] * 2
    sent = [headers["Authorization"] for method, path, headers, *_ in server.requests]
    assert sent[1] == sent[3] == "Bearer t-1"
    assert sent[0] != sent[2] and sent[0].startswith("Bearer ey")  # a new assertion each time
