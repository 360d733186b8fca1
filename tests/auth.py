"""The test suite's token issuer: a key pair minted per test process, whose AUTH_*
variables tests/conftest.py exports, so the in-process handler and every server a test
starts accept its tokens. ``bearer()`` is the one place tests get credentials from."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from functions.auth.principals import SCOPES
from localdev.issuer import LOCAL_DEVICE_TOKEN_ISSUER, Issuer

ISSUER = Issuer.generate()


def _folder(prefix: str) -> Path:
    """A folder of this test process's own, removed when it exits (the servers it started stopped by then)."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return Path(folder)


# Device tokens (POST /devices/{id}/token) are signed with the same key under their own issuer,
# as make serve signs them; the key file is this test process's own.
DEVICE_TOKEN_ENVIRONMENT = ISSUER.device_token_environment(
    ISSUER.save_key(_folder("device-tokens-") / "signing-key.pem"))
# Tokens as the device-token issuer would sign them, for tests of what its tokens may carry.
DEVICE_TOKEN_ISSUER = Issuer(ISSUER.private_key, ISSUER.kid, issuer=LOCAL_DEVICE_TOKEN_ISSUER)
# Devices' secrets and enrollments' group keys are sealed under this test process's own key.
SEALING_ENVIRONMENT = {"SEALING_KEY_FILE": str(_folder("sealing-") / "sealing-key")}
Path(SEALING_ENVIRONMENT["SEALING_KEY_FILE"]).write_bytes(os.urandom(32))
NO_CREDENTIALS = {"Authorization": None}  # headers= this: the request goes without a token


def token(scopes=SCOPES, device: str | None = None, **claims) -> str:
    return ISSUER.token(scopes, device=device, **claims)


def bearer(scopes=SCOPES, device: str | None = None, **claims) -> dict:
    """``{"Authorization": "Bearer <token>"}`` for a back-end with ``scopes`` (all by default),
    or for ``device``."""
    return {"Authorization": f"Bearer {token(scopes, device, **claims)}"}


def with_credentials(headers: dict | None) -> dict:
    """The headers a test request goes with: a token with every scope unless the test
    gave its own Authorization (None: none at all)."""
    headers = dict(headers or {})
    for name in list(headers):
        if name.lower() == "authorization":
            if headers[name] is None:
                del headers[name]
            return headers
    return {**bearer(), **headers}


def assertion(device_id: str, kid: str, key: bytes, lifetime: int = 300, **claims) -> str:
    """An HS256 assertion for ``device_id`` as a device signs one (``kid``: its credential's id, or
    its enrollment's; ``key``: the secret's bytes, or the key its enrollment derives for it)."""
    import time
    import uuid

    import jwt

    now = int(time.time())
    body = {"sub": device_id, "aud": "device-state", "iat": now, "exp": now + lifetime, "jti": uuid.uuid4().hex}
    return jwt.encode({**body, **claims}, key, algorithm="HS256", headers={"kid": kid})


def self_signed_certificate(device: str, days: float = 1):
    """A self-signed P-256 certificate naming ``device`` (registered, any issuer goes), valid from
    now for ``days`` (for a negative ``days``, from two days ago until ``-days`` ago), and its key."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device)])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now if days > 0 else now - datetime.timedelta(days=2))
                   .not_valid_after(now + datetime.timedelta(days=days)).sign(key, hashes.SHA256()))
    return certificate, key
