"""No secret of devices' identity appears where it must not: the real dev server runs the identity
flows (a registered HS256 secret, a group enrollment's key and the device keys derived from it,
assertions exchanged for tokens and replayed, assertions refused for their signature, provisioning
answered and refused, revocation, a device token in a WebSocket connect's URL, accepted and then
refused) with every logger at DEBUG and its metrics on, while everything its processes print (the
HTTP workers' request lines, Powertools' log and metric lines, the library's loggers, the WebSocket
process, the stream processor and the fan-out) is captured. Then the captured output,
every listing (credentials, enrollments, an enrollment, the device, the fleet), every other answer
and every error's body and headers are searched for each secret (the registered secret, the group
key, each derived device key: raw, base64, base64url, hex), each assertion's signature and each
device token's signature, in every form. Each may appear only in the one answer that hands it out
(a secret, a group key, a token once each). A pure test shows the search finds every form."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from dataclasses import dataclass, field

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from functions.auth.principals import ADMIN_SCOPE
from tests.api.test_http import launch
from tests.auth import assertion, bearer

pytestmark = pytest.mark.dynamodb_local

ADMIN = bearer((ADMIN_SCOPE,))
PREFIX_CHARS = 16  # a secret's form is found by its first 16 characters: a shortened print is found too


def forms(secret: bytes) -> dict[str, bytes]:
    """The ways a secret's bytes can be written down, each by its first ``PREFIX_CHARS``
    characters (the raw bytes whole)."""
    standard = base64.b64encode(secret).decode()
    written = {"base64": standard, "base64url": base64.urlsafe_b64encode(secret).decode(), "hex": secret.hex(),
               "HEX": secret.hex().upper(), "repr": repr(secret)[2:-1]}
    found = {name: text[:PREFIX_CHARS].encode() for name, text in written.items()}
    found["raw"] = secret
    return found


def signature_of(jwt: str) -> bytes:
    return base64.urlsafe_b64decode(jwt.rsplit(".", 1)[1] + "==")


def leaks(haystack: bytes, needles: dict[str, bytes]) -> list[str]:
    """The names of the needles' forms found in ``haystack``."""
    return [f"{name} as {form}" for name, secret in needles.items()
            for form, text in forms(secret).items() if text in haystack]


def test_the_search_finds_every_form_and_nothing_else():
    secret = hashlib.sha256(b"a secret").digest()
    for form, text in forms(secret).items():
        line = b'{"level":"INFO","message":"registered","detail":"' + text + b'..."}'
        assert f"s as {form}" in leaks(line, {"s": secret}), form
    written = {"unpadded": base64.b64encode(secret).rstrip(b"="), "hex in a sentence": f"key {secret.hex()}.".encode(),
               "base64url": base64.urlsafe_b64encode(secret)}
    for name, line in written.items():
        assert leaks(line, {"s": secret}), name
    assert leaks(b'{"level":"INFO","message":"registered"}', {"s": secret}) == []


@dataclass
class Exchange:
    """Every answer the flows got, and the secrets that each may show (the one answer handing one out)."""

    answers: list[tuple[str, int, bytes, frozenset[str]]] = field(default_factory=list)
    secrets: dict[str, bytes] = field(default_factory=dict)

    def call(self, server, label, method, path, body=None, headers=None, shows=(), expect=None) -> dict:
        status, response_headers, payload = server.request(method, path, body, headers=headers)
        if expect is not None:
            assert status == expect, (label, status, payload)
        text = json.dumps(response_headers).encode() + b"\n" + payload
        self.answers.append((label, status, text, frozenset(shows)))
        return json.loads(payload) if payload else {}

    def keep(self, name: str, secret: bytes) -> None:
        self.secrets[name] = secret


@pytest.fixture(scope="module")
def server(dynamodb_local):
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"sec-{uuid.uuid4().hex[:8]}",
                                WORKERS="2", POWERTOOLS_LOG_LEVEL="DEBUG", POWERTOOLS_METRICS_DISABLED="false")
    yield candidate, process
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=30)


def device_key(group_key: bytes, device: str) -> bytes:
    return hmac.new(group_key, device.encode(), hashlib.sha256).digest()


def run_the_flows(server) -> Exchange:
    seen = Exchange()
    sensor, meter, stranger = (f"{kind}-{uuid.uuid4().hex[:8]}" for kind in ("sensor", "meter", "other"))
    seen.call(server, "create", "POST", "/devices", {"deviceId": sensor, "state": {"room": "cellar"}}, expect=201)

    # A registered secret, assertions signed with it, a replay and a bad signature.
    added = seen.call(server, "register", "POST", f"/devices/{sensor}/credentials", {"type": "secret"}, ADMIN,
                      shows={"secret"}, expect=201)
    secret = base64.b64decode(added["secret"])
    seen.keep("secret", secret)
    first = assertion(sensor, added["credentialId"], secret)
    seen.keep("first assertion's signature", signature_of(first))
    minted = seen.call(server, "token", "POST", f"/devices/{sensor}/token",
                       headers={"Authorization": f"Bearer {first}"}, shows={"sensor's token"}, expect=200)
    seen.keep("sensor's token", signature_of(minted["token"]))
    as_sensor = {"Authorization": f"Bearer {minted['token']}"}
    seen.call(server, "replayed", "POST", f"/devices/{sensor}/token", headers={"Authorization": f"Bearer {first}"},
              expect=401)
    forged = assertion(sensor, added["credentialId"], b"not the secret" * 3)
    seen.keep("forged assertion's signature", signature_of(forged))
    seen.call(server, "forged", "POST", f"/devices/{sensor}/token", headers={"Authorization": f"Bearer {forged}"},
              expect=401)
    # a good assertion's signature over other claims (another jti): refused, the signature still good
    unspent = assertion(sensor, added["credentialId"], secret)
    seen.keep("unspent assertion's signature", signature_of(unspent))
    header, claims, signature = unspent.split(".")
    other_claims = {**json.loads(base64.urlsafe_b64decode(claims + "==")), "jti": uuid.uuid4().hex}
    tampered = ".".join((header, base64.urlsafe_b64encode(json.dumps(other_claims).encode()).decode().rstrip("="),
                         signature))
    seen.call(server, "tampered", "POST", f"/devices/{sensor}/token",
              headers={"Authorization": f"Bearer {tampered}"}, expect=401)
    seen.call(server, "device reads itself", "GET", f"/devices/{sensor}", headers=as_sensor, expect=200)
    with connect(f"ws://127.0.0.1:{server.port}/ws?token={minted['token']}", open_timeout=10) as websocket:
        websocket.send(json.dumps({"action": "subscribe", "deviceId": sensor, "since": 0}))  # the token in the URL
        assert json.loads(websocket.recv(10))["type"] in ("subscribed", "change")
    seen.call(server, "credentials listed", "GET", f"/devices/{sensor}/credentials", headers=ADMIN, expect=200)

    # A group enrollment, a device provisioning itself by its derived key, again, and refusals.
    made = seen.call(server, "enroll", "POST", "/enrollments", {
        "idPattern": "meter-[0-9a-f]{8}", "maxDevices": 5, "initial": {"desired": {"interval": 60}}}, ADMIN,
        shows={"group key"}, expect=201)
    group_key = base64.b64decode(made["groupKey"])
    seen.keep("group key", group_key)
    derived = device_key(group_key, meter)
    seen.keep("meter's derived key", derived)
    signed = assertion(meter, made["enrollmentId"], derived)
    seen.keep("provisioning assertion's signature", signature_of(signed))
    provisioned = seen.call(server, "provision", "POST", f"/devices/{meter}/provision",
                            headers={"Authorization": f"Bearer {signed}"}, shows={"meter's token"}, expect=201)
    seen.keep("meter's token", signature_of(provisioned["token"]))
    again = assertion(meter, made["enrollmentId"], derived)
    seen.keep("second provisioning assertion's signature", signature_of(again))
    renewed = seen.call(server, "provision again", "POST", f"/devices/{meter}/provision",
                        headers={"Authorization": f"Bearer {again}"}, shows={"meter's second token"}, expect=200)
    seen.keep("meter's second token", signature_of(renewed["token"]))
    by_credential = assertion(meter, provisioned["credentialId"], derived)
    seen.keep("meter's assertion's signature", signature_of(by_credential))
    third = seen.call(server, "meter's token", "POST", f"/devices/{meter}/token",
                      headers={"Authorization": f"Bearer {by_credential}"}, shows={"meter's third token"}, expect=200)
    seen.keep("meter's third token", signature_of(third["token"]))
    outsider = f"meter-{uuid.uuid4().hex[:8]}"
    seen.keep("outsider's derived key", device_key(group_key, outsider))
    wrong_key = assertion(outsider, made["enrollmentId"], device_key(group_key, meter))  # another device's key
    seen.keep("wrong-key assertion's signature", signature_of(wrong_key))
    seen.call(server, "provision with another's key", "POST", f"/devices/{outsider}/provision",
              headers={"Authorization": f"Bearer {wrong_key}"}, expect=401)
    not_allowed = assertion(stranger, made["enrollmentId"], device_key(group_key, stranger))
    seen.keep("refused id's assertion's signature", signature_of(not_allowed))
    seen.call(server, "provision refused by pattern", "POST", f"/devices/{stranger}/provision",
              headers={"Authorization": f"Bearer {not_allowed}"}, expect=403)
    seen.call(server, "enrollments listed", "GET", "/enrollments", headers=ADMIN, expect=200)
    seen.call(server, "enrollment shown", "GET", f"/enrollments/{made['enrollmentId']}", headers=ADMIN, expect=200)
    seen.call(server, "meter's credentials listed", "GET", f"/devices/{meter}/credentials", headers=ADMIN, expect=200)
    seen.call(server, "meter read", "GET", f"/devices/{meter}?include=metadata", expect=200)
    seen.call(server, "fleet listed", "GET", "/devices?limit=100", expect=200)

    # Revocation: the tokens of the revoked credentials refused; provisioning refused after.
    seen.call(server, "revoke", "DELETE", f"/devices/{sensor}/credentials/{added['credentialId']}", headers=ADMIN,
              expect=204)
    seen.call(server, "revoked token", "GET", f"/devices/{sensor}", headers=as_sensor, expect=401)
    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://127.0.0.1:{server.port}/ws?token={minted['token']}", open_timeout=10)
    assert refused.value.response.status_code == 401
    seen.call(server, "revoke meter's", "DELETE", f"/devices/{meter}/credentials/{provisioned['credentialId']}",
              headers=ADMIN, expect=204)
    after = assertion(meter, made["enrollmentId"], derived)
    seen.keep("after-revocation assertion's signature", signature_of(after))
    seen.call(server, "provision after revocation", "POST", f"/devices/{meter}/provision",
              headers={"Authorization": f"Bearer {after}"}, expect=403)
    revoked = assertion(meter, provisioned["credentialId"], derived)
    seen.keep("revoked credential's assertion's signature", signature_of(revoked))
    seen.call(server, "revoked credential's assertion", "POST", f"/devices/{meter}/token",
              headers={"Authorization": f"Bearer {revoked}"}, expect=401)
    seen.call(server, "credentials listed after", "GET", f"/devices/{sensor}/credentials", headers=ADMIN, expect=200)
    return seen


def test_no_secret_in_any_log_line_listing_or_error(server):
    candidate, process = server
    seen = run_the_flows(candidate)
    time.sleep(3)  # the stream processor and the fan-out take the changes (and log what they log)
    process.terminate()
    process.wait(timeout=30)
    log = candidate.log.encode()
    # The capture holds what the processes print: each request's line, and Powertools' metric lines.
    assert log.count(b" POST /devices/") >= 10 and b"/provision 201" in log, log[-2000:]
    assert b'"AssertionsRefused"' in log and b'"ProvisioningsRefused"' in log, log[-2000:]
    assert b'"level":"INFO"' in log, log[-2000:]  # and the loggers' lines (the stream processor's)
    found = leaks(log, seen.secrets)
    assert not found, f"in what the server printed: {found}"
    for label, status, text, shows in seen.answers:
        found = leaks(text, {name: secret for name, secret in seen.secrets.items() if name not in shows})
        assert not found, f"in the answer to {label} ({status}): {found}"
    # each secret handed out is in the one answer that hands it out (the search would find it)
    shown = {name for *_, shows in seen.answers for name in shows}
    for label, _, text, shows in seen.answers:
        for name in shows:
            assert leaks(text, {name: seen.secrets[name]}), (label, name)
    assert shown == {"secret", "group key", "sensor's token", "meter's token", "meter's second token",
                     "meter's third token"}
