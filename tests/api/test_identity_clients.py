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
from tests.auth import assertion, token
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
    for method, target, payload, headers in requests:
        status, _, body = server.request(method, target, payload, headers=headers)
        assert (status, json.loads(body)["type"]) == (401, "urn:device-state:problem:credential-revoked"), target
    assert app.get(device)["version"] == 2  # the report before the revocation, none after


def test_a_registered_certificate_signs_assertions_and_registering_it_twice_is_409(server, admin, app):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    device = _new_device(app)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device)])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now)
                   .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    pem = certificate.public_bytes(serialization.Encoding.PEM).decode()
    added = admin.add_credential(device, "certificate", certificate=pem)  # self-signed: any issuer
    assert added["type"] == "certificate"
    assert added["thumbprint"] == certificate.fingerprint(hashes.SHA256()).hex()
    lamp = DeviceClient(_url(server), device, KeyCredentials(added["credentialId"], key))
    assert lamp.report({"seen": 1})["reported"] == {"seen": 1}
    with pytest.raises(Exception) as twice:  # the same certificate again: refused, never a 5xx
        admin.add_credential(device, "certificate", certificate=pem)
    assert twice.value.status == 409 and twice.value.slug == "credential-exists"


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
    assert forged.value.slug == "assertion-signature"
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
