"""Devices' identity through the Python clients (clients/python) against the real dev server on
DynamoDB Local: an admin's ``AppClient`` registers a key or a secret and the ``DeviceClient``
holding it gets its device token by signing assertions, renews it the same way, and is shut out
at the next request once the credential is revoked; a group enrollment's derived key provisions a
device (created from the enrollment's initial documents, once: provisioning again answers the
same credential), after which its tokens are renewed from the credential it registered; and the
admin's side of credentials and enrollments, answered and refused."""

from __future__ import annotations

import base64
import json
import uuid

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from functions.auth.principals import ADMIN_SCOPE, READ_SCOPE, WRITE_SCOPE
from tests.api.test_http import launch
from tests.auth import assertion, self_signed_certificate, token
from tests.make_serve import REPO_ROOT

import sys

sys.path.insert(0, str(REPO_ROOT / "clients" / "python"))  # the package as a device author installs it
from device_state_client import (AppClient, DeviceClient, EnrollmentCredentials, Forbidden,  # noqa: E402
                                 KeyCredentials, NotFound, SecretCredentials, TokenCredentials, Unauthorized,
                                 derive_device_key, sign_assertion)

pytestmark = pytest.mark.dynamodb_local


@pytest.fixture(scope="module")
def server(dynamodb_local):
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"id-{uuid.uuid4().hex[:8]}",
                                WORKERS="4", STREAM_PROCESSOR="off")
    yield candidate
    process.terminate()
    process.wait(timeout=30)


def _url(server) -> str:
    return f"http://127.0.0.1:{server.port}/"


@pytest.fixture
def admin(server) -> AppClient:
    return AppClient(_url(server), TokenCredentials(lambda: token((ADMIN_SCOPE,))))


@pytest.fixture
def app(server) -> AppClient:
    return AppClient(_url(server), TokenCredentials(lambda: token((READ_SCOPE, WRITE_SCOPE))))


def _public_pem(private_key) -> str:
    return private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _new_device(app) -> str:
    device = f"id-{uuid.uuid4().hex[:8]}"
    app.create(device, {"state": {"room": "hall"}})
    return device


class _Clock:
    """A monotonic clock the test moves, so that a token is renewed without waiting an hour."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("kind", ["EC", "RSA", "secret"])
def test_a_device_signs_assertions_with_its_key_or_secret_renews_its_token_and_is_shut_out_when_revoked(
        server, admin, app, kind):
    device = _new_device(app)
    clock = _Clock()
    if kind == "secret":
        added = admin.add_credential(device, "secret")
        credentials = SecretCredentials(added["credentialId"], added["secret"], clock=clock)
    else:
        key = ec.generate_private_key(ec.SECP256R1()) if kind == "EC" else rsa.generate_private_key(65537, 2048)
        added = admin.add_credential(device, "publicKey", public_key=_public_pem(key))
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        credentials = KeyCredentials(added["credentialId"], pem, clock=clock)
    assert added["type"] == ("secret" if kind == "secret" else "publicKey")
    assert [listed["credentialId"] for listed in admin.list_credentials(device)] == [added["credentialId"]]
    assert "secret" not in admin.list_credentials(device)[0]

    lamp = DeviceClient(_url(server), device, credentials)
    assert lamp.get()["state"] == {"room": "hall"}
    first = credentials.bearer_token(lamp)
    clock.now += 3600  # past 80 % of its life: the next request signs a new assertion
    assert lamp.report({"on": True})["reported"] == {"on": True}
    assert credentials.bearer_token(lamp) != first

    admin.revoke_credential(device, added["credentialId"])
    assert admin.list_credentials(device) == []
    with pytest.raises(Unauthorized) as refused:  # the token it holds, then a new assertion: both refused
        lamp.report({"on": False})
    assert refused.value.status == 401
    assert app.get(device)["reported"] == {"on": True}


def test_a_revoked_credentials_token_is_refused_on_every_route_of_the_device_the_reads_that_check_it_on_the_item_too(
        server, admin, app):
    """The routes that read the state item (the feed, a version, lease status, jobs) check the
    credential on the item they read; the others read it once; all refuse alike."""
    device = _new_device(app)
    added = admin.add_credential(device, "secret")
    status, _, body = server.request("POST", f"/devices/{device}/token", headers={
        "Authorization": f"Bearer {assertion(device, added['credentialId'], base64.b64decode(added['secret']))}"})
    assert status == 200
    bearer = {"Authorization": f"Bearer {json.loads(body)['token']}"}
    merge = {**bearer, "Content-Type": "application/merge-patch+json"}
    path = f"/devices/{device}"
    requests = [("GET", path, None, bearer), ("PATCH", f"{path}/reported", {"on": True}, merge),
                ("GET", f"{path}/delta", None, bearer), ("GET", f"{path}/changes?since=0", None, bearer),
                ("GET", f"{path}/changes?since=2", None, bearer), ("GET", f"{path}/versions/2", None, bearer),
                ("GET", f"{path}/leases", None, bearer), ("GET", f"{path}/jobs", None, bearer),
                ("POST", f"{path}/leases", {"ttlSeconds": 5}, bearer), ("POST", f"{path}/token", None, bearer)]
    for method, target, payload, headers in requests:
        assert server.request(method, target, payload, headers=headers)[0] in (200, 201), (method, target)
    admin.revoke_credential(device, added["credentialId"])
    # and what the token was never allowed, or sends in a form refused: 401 all the same, not the 403
    # or 400 its form or rights would hear (a device could not tell it had been revoked)
    refused = [("PATCH", f"{path}/desired", {"on": True}, merge), ("PATCH", f"{path}/reported", "{", merge),
               ("GET", f"{path}/versions/xyz", None, bearer), ("POST", f"{path}/desired/acks", {"x": 1}, bearer),
               ("GET", "/devices/another", None, bearer), ("GET", "/jobs", None, bearer),
               ("POST", "/transactions", {"operations": [{"op": "check", "deviceId": "another"}]}, bearer)]
    for method, target, payload, headers in requests + refused:
        status, _, body = server.request(method, target, payload, headers=headers)
        assert (status, json.loads(body)["type"]) == (401, "urn:device-state:problem:credential-revoked"), target
    assert app.get(device)["version"] == 2  # the report before the revocation, none after
    gone = _new_device(app)  # a deleted device's token: not 404 "no such device" for another device or /jobs
    added = admin.add_credential(gone, "secret")
    status, _, body = server.request("POST", f"/devices/{gone}/token", headers={
        "Authorization": f"Bearer {assertion(gone, added['credentialId'], base64.b64decode(added['secret']))}"})
    deleted = {"Authorization": f"Bearer {json.loads(body)['token']}"}
    app.delete(gone)
    for method, target, payload, headers in refused:
        status, _, body = server.request(method, target, payload, headers={**headers, **deleted})
        assert (status, json.loads(body)["type"]) == (401, "urn:device-state:problem:credential-revoked"), target


def test_a_revoked_credentials_token_gets_no_replay_lease_or_long_poll(server, admin, app):
    """After the revocation: keyed writes' replays (and their keys sent with other bodies), a
    lease's heartbeat and release, the waits (the delta's, the feed's caught-up one) are refused
    too, and so is a feed's long poll that was waiting when the credential was revoked."""
    import threading
    import time

    device = _new_device(app)
    added = admin.add_credential(device, "secret")
    status, _, body = server.request("POST", f"/devices/{device}/token", headers={
        "Authorization": f"Bearer {assertion(device, added['credentialId'], base64.b64decode(added['secret']))}"})
    bearer = {"Authorization": f"Bearer {json.loads(body)['token']}"}
    path = f"/devices/{device}"
    keyed = {**bearer, "Content-Type": "application/merge-patch+json", "Idempotency-Key": "k-report"}
    transaction = {"operations": [{"deviceId": device, "section": "reported", "mergePatch": {"t": 1}}]}
    keyed_transaction = {**bearer, "Idempotency-Key": "k-transaction"}
    assert server.request("PATCH", f"{path}/reported", {"on": True}, headers=keyed)[0] == 200
    assert server.request("POST", "/transactions", transaction, headers=keyed_transaction)[0] == 200
    status, _, body = server.request("POST", f"{path}/leases", {"ttlSeconds": 30}, headers=bearer)
    assert status == 201, body
    lease = json.loads(body)
    version = app.get(device)["version"]
    waiting = {}
    poll = threading.Thread(target=lambda: waiting.update(answer=server.request(
        "GET", f"{path}/changes?since={version}&waitSeconds=8", headers=bearer)))
    poll.start()
    time.sleep(1)
    admin.revoke_credential(device, added["credentialId"])
    poll.join(20)
    assert waiting["answer"][0] == 401, waiting["answer"]
    lease_headers = bearer
    other_transaction = {"operations": [{"deviceId": device, "section": "reported", "mergePatch": {"t": 2}}]}
    requests = [("PATCH", f"{path}/reported", {"on": True}, keyed),
                ("POST", "/transactions", transaction, keyed_transaction),
                # the same keys with other bodies: 401, not 422 (which would tell it the record is there)
                ("PATCH", f"{path}/reported", {"on": False}, keyed),
                ("POST", "/transactions", other_transaction, keyed_transaction),
                ("PUT", f"{path}/leases/{lease['leaseId']}", {"ttlSeconds": 30}, lease_headers),
                ("DELETE", f"{path}/leases/{lease['leaseId']}", None, lease_headers),
                ("GET", f"{path}/delta?waitSeconds=1", None, bearer),
                ("GET", f"{path}/changes?since={version}&waitSeconds=1", None, bearer),
                # refused on the request alone (a malformed lease id, a device's ttl over its cap, ending
                # another's lease): 401 all the same, as every request of the revoked credential is
                ("PUT", f"{path}/leases/not-a-lease", {"ttlSeconds": 30}, lease_headers),
                ("PUT", f"{path}/leases/{lease['leaseId']}", {"ttlSeconds": 600}, lease_headers),
                ("POST", f"{path}/leases", {"ttlSeconds": 600}, bearer),
                ("DELETE", f"{path}/leases/{lease['fencingToken']}", None, lease_headers)]
    for method, target, payload, headers in requests:
        status, _, body = server.request(method, target, payload, headers=headers)
        assert (status, json.loads(body)["type"]) == (401, "urn:device-state:problem:credential-revoked"), \
            (method, target, status, body)


def test_a_lease_a_revoked_credential_waited_for_is_not_granted(server, admin, app):
    """A device's lease request queued behind a back-end's lease while its credential is revoked
    does not take the lease once the back-end releases it: 401, the lease left free."""
    import threading
    import time

    from tests.auth import bearer

    device = _new_device(app)
    added = admin.add_credential(device, "secret")
    status, _, body = server.request("POST", f"/devices/{device}/token", headers={
        "Authorization": f"Bearer {assertion(device, added['credentialId'], base64.b64decode(added['secret']))}"})
    as_device = {"Authorization": f"Bearer {json.loads(body)['token']}"}
    backend = bearer((READ_SCOPE, WRITE_SCOPE))
    status, _, body = server.request("POST", f"/devices/{device}/leases", {"ttlSeconds": 30}, headers=backend)
    assert status == 201, body
    held = json.loads(body)["leaseId"]
    waited = {}
    waiter = threading.Thread(target=lambda: waited.update(answer=server.request(
        "POST", f"/devices/{device}/leases", {"ttlSeconds": 30, "waitSeconds": 10}, headers=as_device)))
    waiter.start()
    time.sleep(1)  # queued behind the back-end's lease
    admin.revoke_credential(device, added["credentialId"])
    assert server.request("DELETE", f"/devices/{device}/leases/{held}", headers=backend)[0] == 204
    waiter.join(20)
    status, _, body = waited["answer"]
    assert status == 401, body
    assert json.loads(body)["type"] == "urn:device-state:problem:credential-revoked"
    status, _, body = server.request("GET", f"/devices/{device}/leases", headers=backend)
    assert json.loads(body)["holder"] is None, body


@pytest.mark.parametrize("expires_at", ["9999-12-31T23:59:59-14:00", "2030-W01-1T00:00Z", "20300101T000000Z",
                                        "2030-01-01 00:00:00Z", "2030-01-01T00Z", "2030-02-30T00:00:00Z"])
def test_an_expiry_past_the_year_9999_or_not_rfc_3339_is_400_and_stores_nothing(server, admin, app, expires_at):
    """``9999-12-31T23:59:59-14:00`` is valid RFC 3339 but past what an answer can show (UTC
    year 10000); the others are ISO 8601 but not RFC 3339, or no day at all: each refused before
    anything is stored, so the listings still answer."""
    from tests.auth import bearer

    device = _new_device(app)
    admin_headers = bearer((ADMIN_SCOPE,))
    asked = [(f"/devices/{device}/credentials", {"type": "secret", "expiresAt": expires_at}),
             ("/enrollments", {"idPattern": f"late-{uuid.uuid4().hex[:6]}-[0-9]+", "maxDevices": 1, "initial": {},
                               "expiresAt": expires_at})]
    enrollments = len(json.loads(server.request("GET", "/enrollments", headers=admin_headers)[2])["items"])
    for path, body in asked:
        status, _, answer = server.request("POST", path, body, headers=admin_headers)
        assert status == 400, (path, status, answer)
    status, _, listed = server.request("GET", f"/devices/{device}/credentials", headers=admin_headers)
    assert status == 200 and json.loads(listed)["items"] == []
    status, _, listed = server.request("GET", "/enrollments", headers=admin_headers)
    assert status == 200 and len(json.loads(listed)["items"]) == enrollments


def test_the_last_fraction_of_the_year_9999_is_its_last_second_and_every_listing_shows_it(server, admin, app):
    """A fraction is cut, not rounded: 23:59:59.999999 rounded up was the year 10000, stored, and
    every later listing failed (500) with the secret or group key never shown."""
    from tests.auth import bearer

    device = _new_device(app)
    admin_headers = bearer((ADMIN_SCOPE,))
    last = "9999-12-31T23:59:59.999999Z"
    status, _, added = server.request("POST", f"/devices/{device}/credentials", {"type": "secret", "expiresAt": last},
                                      headers=admin_headers)
    assert status == 201 and json.loads(added)["expiresAt"].startswith("9999-12-31T23:59:59"), added
    status, _, enrolled = server.request(
        "POST", "/enrollments", {"idPattern": f"last-{uuid.uuid4().hex[:6]}-[0-9]+", "maxDevices": 1, "initial": {},
                                 "expiresAt": last}, headers=admin_headers)
    assert status == 201, enrolled
    status, _, listed = server.request("GET", f"/devices/{device}/credentials", headers=admin_headers)
    assert status == 200 and [item["expiresAt"][:19] for item in json.loads(listed)["items"]] == ["9999-12-31T23:59:59"]
    assert server.request("GET", "/enrollments", headers=admin_headers)[0] == 200
    assert server.request("DELETE", f"/enrollments/{json.loads(enrolled)['enrollmentId']}",
                          headers=admin_headers)[0] == 204


@pytest.mark.parametrize("claim", ["iat", "exp"])
@pytest.mark.parametrize("value", [10 ** 400, -1, 253_402_300_800], ids=["400-digits", "negative", "year-10000"])
def test_an_assertion_whose_time_is_no_epoch_second_is_401_not_500(server, admin, app, claim, value):
    device = _new_device(app)
    added = admin.add_credential(device, "secret")
    signed = assertion(device, added["credentialId"], base64.b64decode(added["secret"]), **{claim: value})
    status, _, problem = server.request("POST", f"/devices/{device}/token", headers={"Authorization": f"Bearer {signed}"})
    assert status == 401 and json.loads(problem)["type"].endswith(":assertion-invalid"), (status, problem)


def test_a_deleted_devices_token_is_refused_at_the_websocket_connect_and_subscribe(server, admin, app):
    """Deleting a device revokes its credentials (docs/api/identity.md): a token minted from one
    neither opens a WebSocket connection nor subscribes on one it opened before, while no device
    of that id exists; else it would follow the device created again under that id."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    device = _new_device(app)
    added = admin.add_credential(device, "secret")
    status, _, body = server.request("POST", f"/devices/{device}/token", headers={
        "Authorization": f"Bearer {assertion(device, added['credentialId'], base64.b64decode(added['secret']))}"})
    assert status == 200
    url = f"ws://127.0.0.1:{server.port}/ws?token={json.loads(body)['token']}"
    with connect(url, open_timeout=10) as opened_before:
        app.delete(device)
        for since in (0, -1, "x"):  # a message refused on its own form too: 401 all the same
            opened_before.send(json.dumps({"action": "subscribe", "deviceId": device, "since": since}))
            answer = json.loads(opened_before.recv(10))
            assert (answer["type"], answer.get("problem", {}).get("status")) == ("error", 401), (since, answer)
        with pytest.raises(InvalidStatus) as refused:
            connect(url, open_timeout=10)
        assert refused.value.response.status_code == 401
    device_token = {"Authorization": f"Bearer {url.split('token=')[1]}"}  # its transaction: as its other requests
    status, _, body = server.request("POST", "/transactions", {"operations": [
        {"deviceId": device, "section": "reported", "mergePatch": {"t": 1}}]}, headers=device_token)
    assert (status, json.loads(body)["type"]) == (404, "urn:device-state:problem:device-not-found"), body


def test_a_device_deleted_and_provisioned_again_does_not_revive_the_tokens_its_delete_revoked(server, admin, app):
    """docs/api/identity.md: deleting a device revokes every credential it held, and a device
    created again under that id holds none of them; provisioning it again by the same enrollment
    registers a credential anew, which the tokens minted before the delete must not name."""
    prefix = f"re-{uuid.uuid4().hex[:6]}"
    enrollment = admin.create_enrollment(f"{prefix}-[0-9]+", 3, initial={"state": {"site": "line-7"}})
    device = f"{prefix}-1"
    key = base64.b64decode(derive_device_key(enrollment["groupKey"], device))

    def provision() -> tuple[int, dict]:
        status, _, body = server.request("POST", f"/devices/{device}/provision", headers={
            "Authorization": f"Bearer {assertion(device, enrollment['enrollmentId'], key)}"})
        return status, json.loads(body)

    status, first = provision()
    assert status == 201, first
    before = {"Authorization": f"Bearer {first['token']}"}
    assert server.request("GET", f"/devices/{device}", headers=before)[0] == 200
    app.delete(device)
    status, again = provision()
    assert status == 201, again
    assert server.request("GET", f"/devices/{device}", headers={"Authorization": f"Bearer {again['token']}"})[0] == 200
    status, _, body = server.request("GET", f"/devices/{device}", headers=before)
    assert status == 401, body  # the token of the incarnation deleted


def test_a_registered_certificate_signs_assertions_and_registering_it_twice_is_409(server, admin, app):
    from cryptography.hazmat.primitives import hashes

    device = _new_device(app)
    certificate, key = self_signed_certificate(device)
    pem = certificate.public_bytes(serialization.Encoding.PEM).decode()
    added = admin.add_credential(device, "certificate", certificate=pem)  # self-signed: any issuer
    assert added["type"] == "certificate"
    assert added["thumbprint"] == certificate.fingerprint(hashes.SHA256()).hex()
    lamp = DeviceClient(_url(server), device, KeyCredentials(added["credentialId"], key))
    assert lamp.report({"seen": 1})["reported"] == {"seen": 1}
    with pytest.raises(Exception) as twice:  # the same certificate again: refused, never a 5xx
        admin.add_credential(device, "certificate", certificate=pem)
    assert twice.value.status == 409 and twice.value.slug == "credential-exists"


def test_a_certificate_registered_again_opens_none_of_the_tokens_issued_before(server, admin, app):
    """A certificate's credential id comes from its thumbprint: the same at every registration.
    A token issued from it, then the certificate revoked and registered again, or its device
    deleted and created again under the id with the certificate registered on it: the token is
    401 on reads, writes and renewal (it named the entry of a registration since gone); a token
    issued from the new registration opens the device."""
    import time

    import jwt

    device = _new_device(app)
    certificate, key = self_signed_certificate(device)
    pem = certificate.public_bytes(serialization.Encoding.PEM).decode()

    def token_of(credential_id):
        signed = jwt.encode({"sub": device, "aud": "device-state", "iat": int(time.time()),
                             "exp": int(time.time()) + 300, "jti": uuid.uuid4().hex},
                            key, algorithm="ES256", headers={"kid": credential_id})
        status, _, body = server.request("POST", f"/devices/{device}/token",
                                         headers={"Authorization": f"Bearer {signed}"})
        assert status == 200, body
        return {"Authorization": f"Bearer {json.loads(body)['token']}"}

    def refused(bearer):
        merge = {**bearer, "Content-Type": "application/merge-patch+json"}
        for method, path, payload, headers in (("GET", f"/devices/{device}", None, bearer),
                                               ("PATCH", f"/devices/{device}/reported", {"forged": True}, merge),
                                               ("POST", f"/devices/{device}/token", None, bearer)):
            status, _, body = server.request(method, path, payload, headers=headers)
            assert (status, json.loads(body)["type"]) == (401, "urn:device-state:problem:credential-revoked"), \
                (method, path, status, body)

    credential_id = admin.add_credential(device, "certificate", certificate=pem)["credentialId"]
    stolen = token_of(credential_id)
    admin.revoke_credential(device, credential_id)
    assert admin.add_credential(device, "certificate", certificate=pem)["credentialId"] == credential_id
    refused(stolen)
    fresh = token_of(credential_id)
    assert server.request("GET", f"/devices/{device}", headers=fresh)[0] == 200
    app.delete(device)
    app.create(device, {"state": {"room": "hall"}})
    admin.add_credential(device, "certificate", certificate=pem)
    refused(stolen)
    refused(fresh)
    assert app.get(device)["reported"] == {}


def test_an_assertion_is_good_once_and_only_for_its_own_device(server, admin, app):
    device, other = _new_device(app), _new_device(app)
    added = admin.add_credential(device, "secret")
    assertion = sign_assertion(device, added["credentialId"], secret=added["secret"])
    lamp = DeviceClient(_url(server), device, TokenCredentials("unused"))
    assert lamp.exchange_assertion(assertion)["token"]
    with pytest.raises(Unauthorized) as replayed:
        lamp.exchange_assertion(assertion)
    assert replayed.value.slug == "assertion-replayed"
    with pytest.raises(Unauthorized) as elsewhere:
        DeviceClient(_url(server), other, TokenCredentials("unused")).exchange_assertion(
            sign_assertion(device, added["credentialId"], secret=added["secret"]))
    assert elsewhere.value.slug == "assertion-subject"


@pytest.mark.parametrize("with_key", [False, True])
def test_a_device_provisions_itself_by_its_enrollment_once_then_renews_from_its_registered_credential(
        server, admin, app, with_key):
    prefix = f"en-{uuid.uuid4().hex[:6]}"
    enrollment = admin.create_enrollment(f"{prefix}-[0-9]+", 2, initial={"state": {"site": "line-7"},
                                                                          "desired": {"power": "off"}})
    assert base64.b64decode(enrollment["groupKey"]) and enrollment["provisioned"] == 0
    device = f"{prefix}-1"
    device_key = derive_device_key(enrollment["groupKey"], device)  # at the factory
    key = ec.generate_private_key(ec.SECP256R1()) if with_key else None
    clock = _Clock()
    credentials = EnrollmentCredentials(enrollment["enrollmentId"], device_key, private_key=key, clock=clock)
    lamp = DeviceClient(_url(server), device, credentials)

    created = lamp.get()  # the first request provisions the device
    assert (created["state"], created["desired"]) == ({"site": "line-7"}, {"power": "off"})
    assert credentials.provisioned["deviceId"] == device
    registered = credentials.credential_id
    assert isinstance(credentials.registered, KeyCredentials if with_key else SecretCredentials)
    [listed] = admin.list_credentials(device)
    assert (listed["credentialId"], listed["type"]) == (registered, "publicKey" if with_key else "secret")
    clock.now += 3600
    assert lamp.report({"power": "off"})["version"] == created["version"] + 1  # a token from the registered key

    again = EnrollmentCredentials(enrollment["enrollmentId"], device_key, private_key=key)
    answer = DeviceClient(_url(server), device, again).provision()
    assert answer["credentialId"] == registered and answer["token"]
    assert admin.get_enrollment(enrollment["enrollmentId"])["provisioned"] == 1
    assert len(admin.list_credentials(device)) == 1

    with pytest.raises(Forbidden) as refused:  # an id its pattern does not allow
        DeviceClient(_url(server), f"{prefix}-x", EnrollmentCredentials(
            enrollment["enrollmentId"], derive_device_key(enrollment["groupKey"], f"{prefix}-x"))).get()
    assert refused.value.slug == "id-not-allowed"
    with pytest.raises(Unauthorized) as forged:  # a key not derived from the group key
        DeviceClient(_url(server), f"{prefix}-2", EnrollmentCredentials(
            enrollment["enrollmentId"], derive_device_key(base64.b64encode(b"k" * 32).decode(), f"{prefix}-2"))).get()
    assert forged.value.slug == "credential-unknown"  # as for an enrollment id that names none
    admin.delete_enrollment(enrollment["enrollmentId"])
    with pytest.raises(Forbidden) as ended:
        DeviceClient(_url(server), f"{prefix}-2", EnrollmentCredentials(
            enrollment["enrollmentId"], derive_device_key(enrollment["groupKey"], f"{prefix}-2"))).get()
    assert ended.value.slug == "enrollment-ended"
    assert lamp.get()["version"] == created["version"] + 1  # a provisioned device keeps its credential


def test_the_admin_calls_answer_and_refuse(server, admin, app):
    device = _new_device(app)
    with pytest.raises(Forbidden):  # credentials are the admin scope's alone
        app.add_credential(device, "secret")
    with pytest.raises(Forbidden):
        app.list_enrollments()
    added = [admin.add_credential(device, "secret") for _ in range(5)]
    with pytest.raises(Exception) as too_many:
        admin.add_credential(device, "secret")
    assert too_many.value.status == 409 and too_many.value.slug == "too-many-credentials"
    admin.revoke_credential(device, added[0]["credentialId"])
    with pytest.raises(NotFound):
        admin.revoke_credential(device, added[0]["credentialId"])
    assert {listed["credentialId"] for listed in admin.list_credentials(device)} == {
        credential["credentialId"] for credential in added[1:]}
    made = admin.create_enrollment("cli-[a-z]+", 10, enrollment_id=f"e-{uuid.uuid4().hex[:8]}",
                                   expires_at="2099-01-01T00:00:00Z")
    assert made["enrollmentId"] in {listed["enrollmentId"] for listed in admin.list_enrollments()}
    shown = admin.get_enrollment(made["enrollmentId"])
    assert "groupKey" not in shown and shown["maxDevices"] == 10 and shown["expiresAt"].startswith("2099-01-01")
    admin.delete_enrollment(made["enrollmentId"])
    with pytest.raises(NotFound):
        admin.get_enrollment(made["enrollmentId"])
