"""A device's identity as the API uses it: registering credentials (their secrets sealed), making
enrollments (their group keys sealed), and proving a device by an assertion, to get a token
(``proven``) or to provision it by an enrollment (``provision``). What is stored and how it is
written is the library's (``functions/device_state/identity``); what verifies a signature is
``assertions``; what seals a secret is ``sealing``."""

from __future__ import annotations

import secrets
import time
import uuid

from functions.device_state import (CERTIFICATE, CREDENTIAL_ID_PATTERN, ENROLLMENT_ID_PATTERN, PUBLIC_KEY, SECRET,
                                    CredentialRecord, CredentialRevoked, DeviceStateManager, Enrollment,
                                    EnrollmentNotFound, Provisioned, credential_entries, new_credential_id,
                                    registered_credentials)

from . import assertions
from .assertions import (HS256, AssertionAlgorithm, AssertionMalformed, AssertionSignature, CredentialExpired,
                         CredentialUnknown)
from .principals import Principal
from .sealing import Sealer, group_key_context, secret_context

SECRET_BYTES = 32  # a registered secret's, and an enrollment's group key
# One refusal for a kid that names nothing and for an assertion its credential does not verify.
NOT_PROVEN = "no credential of this device verifies the assertion: its kid names none, or it is not signed with it"
NOT_PROVEN_BY_ENROLLMENT = ("no enrollment verifies the assertion: its kid names none, or it is not signed with "
                            "the key the enrollment derives for this device")


def credential(kind: str, device_id: str, sealer: Sealer, *, public_key: str | None = None,
               certificate: str | None = None, expires_at: int | None = None) -> tuple[CredentialRecord, bytes | None]:
    """A new credential of ``kind`` for the device, and its secret (a secret's, shown once; None
    for the others). ``assertions.InvalidKey`` for a key or certificate that cannot verify."""
    if kind == PUBLIC_KEY:
        key, _ = assertions.public_key(public_key)
        return CredentialRecord(new_credential_id(), PUBLIC_KEY, public_key=assertions.public_key_pem(key),
                                expires_at=expires_at), None
    if kind == CERTIFICATE:
        # A certificate's registration ends at its notAfter at the latest: mutual TLS refuses it from
        # then on, and its key no longer signs assertions either (nor holds one of the device's slots).
        parsed = assertions.certificate(certificate)
        if parsed.not_after <= time.time():
            raise assertions.InvalidKey("the certificate has expired (its notAfter has passed)")
        until = parsed.not_after if expires_at is None else min(expires_at, parsed.not_after)
        return CredentialRecord(parsed.credential_id, CERTIFICATE, public_key=parsed.public_key,
                                thumbprint=parsed.thumbprint, expires_at=until), None
    if kind != SECRET:
        raise ValueError(f"unknown credential type {kind!r}")
    secret, credential_id = secrets.token_bytes(SECRET_BYTES), new_credential_id()
    return CredentialRecord(credential_id, SECRET, secret=sealer.seal(secret, secret_context(device_id, credential_id)),
                            expires_at=expires_at), secret


def enrollment(enrollment_id: str | None, id_pattern: str, max_devices: int, initial: dict, expires_at: int | None,
               sealer: Sealer) -> tuple[Enrollment, bytes]:
    """A new enrollment (its id generated unless given) and its group key, shown once."""
    enrollment_id = enrollment_id or uuid.uuid4().hex
    group_key = secrets.token_bytes(SECRET_BYTES)
    return Enrollment(enrollment_id, id_pattern, max_devices, initial,
                      sealer.seal(group_key, group_key_context(enrollment_id)), expires_at=expires_at), group_key


def proven(manager: DeviceStateManager, device_id: str, token: str, sealer: Sealer,
           now: float) -> tuple[Principal, int | None, str]:
    """The device an assertion proves (authenticated ``now``, holding the assertion's credential),
    when that credential expires (None: never) and its entry on the device's item. One read (the
    credential and the device's item together), a KMS Decrypt for a secret, and the jti's write.
    Refusals are 401s
    (``assertions``): ``CredentialUnknown`` alike for a kid that names nothing and a credential
    that does not verify the assertion; only once it verifies, ``CredentialRevoked`` for a
    credential the device no longer holds, ``CredentialExpired``, ``AssertionReplayed`` for a jti
    used before."""
    assertion = assertions.read(token, device_id, now)
    if not CREDENTIAL_ID_PATTERN.fullmatch(assertion.kid):
        raise CredentialUnknown(NOT_PROVEN)
    record, item = manager.credential(device_id, assertion.kid)
    if record is None:
        raise CredentialUnknown(NOT_PROVEN)
    _verify_or_unknown(assertion, *_verifying_key(record, device_id, sealer))
    # Only the holder of the credential's key learns what became of it.
    held = registered_credentials(item)
    if assertion.kid in held:
        expires = held[assertion.kid] or None
    else:  # revoked, one of the items a deleted device left, or expired and dropped from the item by a
        expires = record.expires_at  # later registration (which keeps unexpired ones only)
        if expires is None or expires > now:
            raise CredentialRevoked(device_id)
    if expires is not None and expires <= now:
        raise CredentialExpired("the credential has expired: register another")
    manager.spend_assertion(device_id, assertion.jti, assertion.expires_at)
    return (Principal.device(device_id, auth_time=int(now), credential_id=record.credential_id), expires,
            credential_entries(item)[assertion.kid])


def _verify_or_unknown(assertion: assertions.Assertion, algorithm: str, key, detail: str = NOT_PROVEN) -> None:
    """An assertion its credential does not verify (another algorithm, another signature) is
    refused as one whose ``kid`` names nothing: whoever knows a certificate's id, or guesses an
    enrollment's, is answered the same whether the device or the enrollment exists."""
    try:
        assertions.verify(assertion, algorithm, key)
    except (AssertionAlgorithm, AssertionSignature, AssertionMalformed) as error:  # Malformed: unreadable
        raise CredentialUnknown(detail, cause=f"not verified: {error}") from None


def _verifying_key(record: CredentialRecord, device_id: str, sealer: Sealer):
    if record.kind == SECRET:
        return HS256, sealer.open(record.secret, secret_context(device_id, record.credential_id))
    key, algorithm = assertions.public_key(record.public_key)
    return algorithm, key


def provision(manager: DeviceStateManager, device_id: str, token: str, public_key: str | None, sealer: Sealer,
              now: float) -> tuple[Provisioned, Principal]:
    """Provisions the device an enrollment's assertion proves (HS256, keyed with the key the
    enrollment derives for it, ``kid`` = the enrollment's id), with ``public_key`` as its
    credential if given, else the derived key as a secret (sealed under the id the library gives
    it); and the device, authenticated ``now`` with that credential. The library's
    ``ProvisioningRefused`` and ``AssertionReplayed``; the assertion's refusals."""
    assertion = assertions.read(token, device_id, now)
    if not ENROLLMENT_ID_PATTERN.fullmatch(assertion.kid):
        raise CredentialUnknown(NOT_PROVEN_BY_ENROLLMENT)
    try:
        found = manager.enrollment(assertion.kid)
    except EnrollmentNotFound:
        raise CredentialUnknown(NOT_PROVEN_BY_ENROLLMENT) from None
    key = assertions.device_key(sealer.open(found.group_key, group_key_context(found.enrollment_id)), device_id)
    _verify_or_unknown(assertion, HS256, key, NOT_PROVEN_BY_ENROLLMENT)
    pem = assertions.public_key_pem(assertions.public_key(public_key)[0]) if public_key is not None else None

    def record(credential_id: str) -> CredentialRecord:
        if pem is not None:
            return CredentialRecord(credential_id, PUBLIC_KEY, public_key=pem)
        sealed = sealer.seal(key, secret_context(device_id, credential_id))
        return CredentialRecord(credential_id, SECRET, secret=sealed)

    provisioned = manager.provision(device_id, found, record, assertion.jti, assertion.expires_at)
    return provisioned, Principal.device(device_id, auth_time=int(now), credential_id=provisioned.credential_id)
