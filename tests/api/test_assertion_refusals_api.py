"""An assertion its sender cannot prove tells the sender nothing (through lambda_handler, moto and
DynamoDB Local): whoever knows a credential's id (a certificate's is its thumbprint's, shown at
every mutual-TLS handshake) or guesses an enrollment's gets one and the same 401 whether the device
or the enrollment exists, holds that credential, or was deleted. Only a holder of the key learns
what became of its credential (revoked)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from tests.auth import assertion

WRONG_KEY = b"k" * 32


def secret_of(api, device: str) -> tuple[str, bytes]:
    """A device created and given a secret: (its credential id, the secret's bytes)."""
    assert api("POST", "/devices", {"deviceId": device, "state": {}}).status == 201
    added = api("POST", f"/devices/{device}/credentials", {"type": "secret"}).json
    return added["credentialId"], base64.b64decode(added["secret"])


def refusal(result) -> tuple:
    problem = result.json
    return result.status, problem["type"], problem["title"], problem["detail"]


def es256(device: str, kid: str) -> str:
    """An assertion signed with a key of the sender's own, under another algorithm than a secret's."""
    now = int(time.time())
    return jwt.encode({"sub": device, "aud": "device-state", "iat": now, "exp": now + 300, "jti": uuid.uuid4().hex},
                      ec.generate_private_key(ec.SECP256R1()), algorithm="ES256", headers={"kid": kid})


def token_answer(api, device: str, signed: str):
    return api("POST", f"/devices/{device}/token", headers={"Authorization": f"Bearer {signed}"})


def test_a_credentials_id_with_the_wrong_key_is_refused_alike_for_every_device(api):
    held, _ = secret_of(api, "holder")
    gone, gone_secret = secret_of(api, "gone")
    assert api("DELETE", "/devices/gone").status == 204
    secret_of(api, "other")  # exists, holds another credential
    answers = {(device, kind): refusal(token_answer(api, device, signed))
               for device, kid in (("holder", held), ("gone", gone), ("other", held), ("never", held))
               for kind, signed in (("hs256", assertion(device, kid, WRONG_KEY)), ("es256", es256(device, kid)))}
    assert len(set(answers.values())) == 1, answers
    assert next(iter(answers.values()))[:2] == (401, "urn:device-state:problem:credential-unknown")
    # the key's holder is told its credential was revoked with the device
    assert refusal(token_answer(api, "gone", assertion("gone", gone, gone_secret)))[1].endswith(":credential-revoked")


def test_an_enrollments_id_with_a_key_it_did_not_derive_is_refused_as_one_that_names_none(api):
    created = api("POST", "/enrollments", {"enrollmentId": "line-7", "idPattern": "meter-[0-9]+", "maxDevices": 5})
    assert created.status == 201
    derived = hmac.new(base64.b64decode(created.json["groupKey"]), b"meter-1", hashlib.sha256).digest()
    provision = lambda kid, key: api("POST", "/devices/meter-1/provision",  # noqa: E731
                                     headers={"Authorization": f"Bearer {assertion('meter-1', kid, key)}"})
    assert refusal(provision("line-7", WRONG_KEY)) == refusal(provision("line-8", WRONG_KEY))
    assert refusal(provision("line-7", WRONG_KEY))[:2] == (401, "urn:device-state:problem:credential-unknown")
    assert provision("line-7", derived).status == 201


@pytest.mark.parametrize("kid", ["never-registered", "c0ffee"])
def test_a_kid_that_names_nothing_is_the_same_refusal(api, kid):
    held, _ = secret_of(api, "holder")
    assert refusal(token_answer(api, "holder", assertion("holder", kid, WRONG_KEY))) == \
        refusal(token_answer(api, "holder", assertion("holder", held, WRONG_KEY)))


def test_each_refused_assertion_has_a_log_line_saying_why_and_never_the_assertion(api, caplog):
    """The runbook's line (docs/operations.md, AssertionsRefused): a fleet whose key was rotated
    shows as signatures not verified, guessing as kids that name nothing."""
    held, _ = secret_of(api, "holder")
    forged, guessed = assertion("holder", held, WRONG_KEY), assertion("holder", "nothing-here", WRONG_KEY)
    caplog.clear()
    token_answer(api, "holder", forged)
    token_answer(api, "holder", guessed)
    lines = [record for record in caplog.records if record.getMessage() == "request refused"]
    assert [(line.problem_type, line.device_id, line.cause.split(":")[0]) for line in lines] == [
        ("urn:device-state:problem:credential-unknown", "holder", "not verified"),
        ("urn:device-state:problem:credential-unknown", "holder", "kid names nothing")]
    logged = json.dumps([vars(line) for line in lines], default=str)
    assert all(token.rsplit(".", 1)[1] not in logged for token in (forged, guessed))


def test_an_expired_credential_is_credential_expired_also_once_a_later_registration_dropped_it(api):
    """A registration keeps only the unexpired entries on the device's item: an assertion of a
    credential that had expired was then answered credential-revoked (found by a hostile review)."""
    import datetime

    assert api("POST", "/devices", {"deviceId": "ending", "state": {}}).status == 201
    until = int(time.time()) + 2
    added = api("POST", "/devices/ending/credentials", {
        "type": "secret", "expiresAt": datetime.datetime.fromtimestamp(until, datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ")}).json
    kid, secret = added["credentialId"], base64.b64decode(added["secret"])
    time.sleep(max(0.0, until - time.time()) + 0.2)
    assert refusal(token_answer(api, "ending", assertion("ending", kid, secret)))[:2] == (
        401, "urn:device-state:problem:credential-expired")
    assert api("POST", "/devices/ending/credentials", {"type": "secret"}).status == 201
    assert refusal(token_answer(api, "ending", assertion("ending", kid, secret)))[:2] == (
        401, "urn:device-state:problem:credential-expired")
