"""Certificate -> token on the real dev server under TLS=1 (its WebSocket process, stream
processor and fan-out), with real TLS and WebSocket clients: a device with a client
certificate gets a device token from POST /devices/{id}/token and uses it on the HTTP routes and
on wss /ws, renews it with itself, and nobody else gets one; the device-token issuer's tokens
only ever name a device. The CA lives in a temporary TLS_DIR, never in the checkout's .serve/."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import jwt
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from functions.auth.device_tokens import DEFAULT_RENEWAL_SECONDS
from localdev.issuer import LOCAL_DEVICE_TOKEN_ISSUER
from tests.api.test_mtls import (client_context, lamp_1, launch_with_lamps, local_ca,  # noqa: F401 (fixtures)
                                 problem_type)
from tests.auth import DEVICE_TOKEN_ISSUER, ISSUER, NO_CREDENTIALS, bearer

pytestmark = pytest.mark.dynamodb_local
MERGE = {"Content-Type": "application/merge-patch+json"}
RECEIVE_SECONDS = 30
# The asyncio client over TLS: websockets' sync client reads and writes one TLS connection from
# two threads, which OpenSSL does not allow (measured: 12 of 1,500 of its wss handshakes to a
# plain websockets TLS server lost their request, none of 1,500 from the asyncio client).


def wss(server, local_ca, headers: dict, tls=None):
    return connect(f"wss://127.0.0.1:{server.port}/ws", ssl=tls or client_context(local_ca), additional_headers=headers,
                   open_timeout=10)


async def receive(client) -> dict:
    return json.loads(await asyncio.wait_for(client.recv(), RECEIVE_SECONDS))


@pytest.fixture(scope="module")
def server(dynamodb_local, local_ca):
    process, candidate = launch_with_lamps(dynamodb_local, local_ca, "tokens", WORKERS="3")
    yield candidate
    process.terminate()
    process.wait(timeout=30)


def get_token(server, device_id="lamp-1", tls=None, headers=None, body=None):
    return server.request("POST", f"/devices/{device_id}/token", body, headers=headers or NO_CREDENTIALS, tls=tls)


def claims_of(token: str) -> dict:
    return jwt.decode(token, options={"verify_signature": False})


def device_bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_a_certificate_device_gets_a_device_token_that_is_not_cached(server, lamp_1):
    before = int(time.time())
    status, headers, body = get_token(server, tls=lamp_1)
    assert status == 200, body
    assert headers["cache-control"] == "no-store" and headers["content-type"] == "application/json"
    answer = json.loads(body)
    assert set(answer) == {"token", "tokenType", "expiresIn", "expiresAt"} and answer["tokenType"] == "Bearer"
    claims = claims_of(answer["token"])
    assert jwt.get_unverified_header(answer["token"])["alg"] == "ES256"
    assert claims["iss"] == LOCAL_DEVICE_TOKEN_ISSUER and claims["aud"] == ISSUER.audience
    assert claims["sub"] == "device:lamp-1" and claims["device_id"] == "lamp-1" and "scope" not in claims
    # The certificate's time is taken when the request is authenticated, iat when it is signed (a read between).
    assert before - 1 <= claims["auth_time"] <= claims["iat"] == claims["nbf"] <= claims["auth_time"] + 2
    assert claims["iat"] <= time.time()
    assert claims["exp"] - claims["iat"] == answer["expiresIn"] == 3600 and len(claims["jti"]) == 32
    assert answer["expiresAt"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(claims["exp"]))
    # An empty JSON object is the same request; anything else is refused.
    assert get_token(server, tls=lamp_1, body={})[0] == 200
    status, _, body = get_token(server, tls=lamp_1, body={"lifetime": 60})
    assert status == 400, body


def test_the_token_works_on_rest_and_on_wss_where_no_certificate_goes(server, lamp_1, local_ca):
    token = json.loads(get_token(server, tls=lamp_1)[2])["token"]
    status, _, body = server.request("PATCH", "/devices/lamp-1/reported", {"power": "on"},
                                     headers={**device_bearer(token), **MERGE})
    assert status == 200, body
    version = json.loads(body)["version"]
    assert server.request("GET", "/devices/lamp-2", headers=device_bearer(token))[0] == 403

    async def follow():
        async with wss(server, local_ca, device_bearer(token)) as client:
            await client.send(json.dumps({"action": "subscribe", "deviceId": "lamp-1", "since": version,
                                          "sections": ["desired"]}))
            assert (await receive(client))["type"] == "subscribed"
            await client.send(json.dumps({"action": "subscribe", "deviceId": "lamp-2", "since": 0}))
            assert (await receive(client))["problem"]["status"] == 403
            written = await asyncio.to_thread(server.request, "PATCH", "/devices/lamp-1/desired", {"power": "off"},
                                              headers=MERGE)
            assert written[0] == 200, written
            message = await receive(client)
            assert message["type"] == "change" and message["version"] == version + 1
            assert message["delta"] == {"power": "off"}
            await client.send(json.dumps({"action": "ping"}))
            assert await receive(client) == {"type": "pong"}

    asyncio.run(follow())
    assert server.request("GET", "/openapi.json")[0] == 200  # the worker that relayed serves on


def test_wss_refuses_a_connect_without_a_valid_token(server, local_ca, lamp_1):
    async def refused(headers: dict, tls=None) -> int:
        with pytest.raises(InvalidStatus) as refusal:
            async with wss(server, local_ca, headers, tls):
                pass
        return refusal.value.response.status_code

    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        assert asyncio.run(refused(headers)) == 401
    # A certificate is not a WebSocket credential (API Gateway's WebSocket APIs take none).
    assert asyncio.run(refused({}, lamp_1)) == 401


def test_a_device_renews_its_token_with_its_token_and_the_certificate_time_is_kept(server, lamp_1):
    first = claims_of(json.loads(get_token(server, tls=lamp_1)[2])["token"])
    time.sleep(1)
    status, headers, body = get_token(server, headers=device_bearer(
        json.loads(get_token(server, tls=lamp_1)[2])["token"]))
    assert status == 200, body
    renewed = claims_of(json.loads(body)["token"])
    assert renewed["device_id"] == "lamp-1" and renewed["jti"] != first["jti"]
    assert renewed["auth_time"] >= first["auth_time"] and renewed["iat"] >= renewed["auth_time"]
    # A main-issuer device token renews too, its iat standing for its certificate time.
    status, _, body = get_token(server, headers=bearer(device="lamp-1"))
    assert status == 200, body


def test_renewal_past_the_bound_needs_the_certificate(server, lamp_1):
    now = int(time.time())
    stale = DEVICE_TOKEN_ISSUER.token(device="lamp-1", sub="device:lamp-1", auth_time=now - DEFAULT_RENEWAL_SECONDS - 1)
    assert server.request("GET", "/devices/lamp-1", headers=device_bearer(stale))[0] == 200  # still a valid token
    status, _, body = get_token(server, headers=device_bearer(stale))
    assert status == 403 and problem_type(body) == "certificate-required", body
    # A token within the bound is never issued to outlive it.
    near = DEVICE_TOKEN_ISSUER.token(device="lamp-1", sub="device:lamp-1", auth_time=now - DEFAULT_RENEWAL_SECONDS + 600)
    status, _, body = get_token(server, headers=device_bearer(near))
    assert status == 200 and 590 <= json.loads(body)["expiresIn"] <= 600, body
    assert get_token(server, tls=lamp_1)[0] == 200


@pytest.mark.parametrize("auth_time", ["10 days ahead", 1e30, float("inf"), float("nan")])
@pytest.mark.parametrize("issuer", ["device-token issuer", "main issuer"])
def test_a_token_whose_auth_time_lies_in_the_future_is_refused_on_every_route_and_at_renewal(
        server, local_ca, auth_time, issuer):
    claimed = int(time.time()) + 10 * 24 * 3600 if auth_time == "10 days ahead" else auth_time
    future = (DEVICE_TOKEN_ISSUER.token(device="lamp-1", sub="device:lamp-1", auth_time=claimed)
              if issuer == "device-token issuer" else ISSUER.token(device="lamp-1", auth_time=claimed))
    for method, path, body in (("GET", "/devices/lamp-1", None), ("PATCH", "/devices/lamp-1/reported", {"n": 1}),
                               ("POST", "/devices/lamp-1/token", None)):
        status, _, answer = server.request(method, path, body, headers={**device_bearer(future), **MERGE})
        assert status == 401 and problem_type(answer) == "unauthorized", (method, path, answer)

    async def connect() -> int:
        with pytest.raises(InvalidStatus) as refusal:
            async with wss(server, local_ca, device_bearer(future)):
                pass
        return refusal.value.response.status_code

    assert asyncio.run(connect()) == 401


def test_an_auth_time_within_the_clock_leeway_renews_counting_from_now(server):
    """A clock a little ahead of this one (up to LEEWAY_SECONDS) is no refusal, and the renewed
    token carries no time later than its own issue: the chain cannot stretch its bound."""
    ahead = DEVICE_TOKEN_ISSUER.token(device="lamp-1", sub="device:lamp-1", auth_time=int(time.time()) + 30)
    status, _, body = get_token(server, headers=device_bearer(ahead))
    assert status == 200, body
    renewed = claims_of(json.loads(body)["token"])
    assert renewed["auth_time"] == renewed["iat"] <= time.time()


def test_a_token_is_issued_only_for_a_device_that_exists(server, local_ca):
    lamp_3 = client_context(local_ca, local_ca.device_certificate("lamp-3"))
    lamp_9 = client_context(local_ca, local_ca.device_certificate("lamp-9"))
    for caller in ({"tls": lamp_9}, {"headers": bearer(device="lamp-9")}):  # never created
        status, _, body = get_token(server, "lamp-9", **caller)
        assert status == 404 and problem_type(body) == "device-not-found", body
    assert server.request("PUT", "/devices/lamp-3", {"state": {}}, headers=bearer())[0] == 201
    held = json.loads(get_token(server, "lamp-3", tls=lamp_3)[2])["token"]
    assert server.request("DELETE", "/devices/lamp-3", headers=bearer())[0] == 204
    for caller in ({"tls": lamp_3}, {"headers": device_bearer(held)}):  # deleted: by certificate, and renewal
        status, _, body = get_token(server, "lamp-3", **caller)
        assert status == 404 and problem_type(body) == "device-not-found", body
    assert server.request("PUT", "/devices/lamp-3", {"state": {}}, headers=bearer())[0] == 201  # the control
    assert get_token(server, "lamp-3", tls=lamp_3)[0] == 200
    # Whoever may not ask gets the answer it gets for a device that exists: nothing about lamp-9.
    for caller, status in (({"tls": lamp_3}, 403), ({"headers": bearer(device="lamp-3")}, 403),
                           ({"headers": bearer()}, 403), ({}, 401)):
        answers = [get_token(server, device, **caller) for device in ("lamp-9", "lamp-1")]
        assert [answer[0] for answer in answers] == [status, status], answers
        assert json.loads(answers[0][2])["detail"] == json.loads(answers[1][2])["detail"].replace("lamp-1", "lamp-9")


@pytest.mark.parametrize("who, status, slug", [
    ("another device's certificate", 403, "forbidden"),
    ("another device's token", 403, "forbidden"),
    ("a back-end with every scope", 403, "forbidden"),
    ("nobody", 401, "unauthorized"),
    ("a tampered token", 401, "unauthorized"),
    ("an expired token", 401, "unauthorized"),
    ("a device-token issuer token with scopes and no device", 401, "unauthorized"),
])
def test_nobody_else_gets_a_devices_token(server, local_ca, who, status, slug):
    lamp_2 = client_context(local_ca, local_ca.device_certificate("lamp-2"))
    good = DEVICE_TOKEN_ISSUER.token(device="lamp-1", sub="device:lamp-1")
    header, payload, signature = good.split(".")
    forged = json.loads(base64.urlsafe_b64decode(payload + "=="))
    forged["device_id"], forged["sub"] = "lamp-2", "device:lamp-2"
    tampered = ".".join([header, base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode(),
                         signature])
    requests = {
        "another device's certificate": {"tls": lamp_2},
        "another device's token": {"headers": bearer(device="lamp-2")},
        "a back-end with every scope": {"headers": bearer()},
        "nobody": {},
        "a tampered token": {"headers": device_bearer(tampered)},
        "an expired token": {"headers": device_bearer(DEVICE_TOKEN_ISSUER.token(
            device="lamp-1", sub="device:lamp-1", lifetime=-120))},
        "a device-token issuer token with scopes and no device": {"headers": device_bearer(
            DEVICE_TOKEN_ISSUER.token(sub="device:lamp-1"))},
    }
    got, headers, body = get_token(server, **requests[who])
    assert got == status and problem_type(body) == slug, body
    assert headers["content-type"] == "application/problem+json"


def test_a_device_token_issuer_token_carrying_scopes_gives_no_client_rights(server):
    scoped = DEVICE_TOKEN_ISSUER.token(device="lamp-1", sub="device:lamp-1", scope="devices.read devices.write")
    assert server.request("GET", "/devices/lamp-1", headers=device_bearer(scoped))[0] == 200  # a device, itself
    for method, path, body in (("GET", "/devices", None), ("GET", "/devices/lamp-2", None),
                               ("PATCH", "/devices/lamp-1/desired", {"power": "off"})):
        status, _, answer = server.request(method, path, body, headers={**device_bearer(scoped), **MERGE})
        assert status == 403, (method, path, answer)
    # A device-token issuer's token naming no device is no credential at all.
    unnamed = DEVICE_TOKEN_ISSUER.token(["devices.read"])
    assert server.request("GET", "/devices", headers=device_bearer(unnamed))[0] == 401
