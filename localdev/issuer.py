"""A token issuer for local use: an EC key pair made once under ``.serve/issuer/``, whose
JWKS ``make serve`` gives the server as ``AUTH_JWKS``, and whose tokens ``make -s token``
prints. Tests mint their own issuer the same way (``Issuer.generate()``).

    python -m localdev.issuer token [--scopes "devices.read devices.admin"] [--device lamp-1]
    python -m localdev.issuer env      # the AUTH_* variables a server needs to accept them
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import uuid
from pathlib import Path

from functions.auth.credentials import (AUTH_AUDIENCE, AUTH_ISSUER, AUTH_JWKS, DEVICE_TOKEN_AUDIENCE,
                                        DEVICE_TOKEN_ISSUER, DEVICE_TOKEN_JWKS)
from functions.auth.device_tokens import DEVICE_TOKEN_KEY_FILE, DEVICE_TOKEN_KID
from functions.auth.principals import DEFAULT_SCOPES, SCOPES

LOCAL_ISSUER = "urn:device-state:local-issuer"
# make serve's device tokens (POST /devices/{id}/token): the same key, under an issuer of their own.
LOCAL_DEVICE_TOKEN_ISSUER = "urn:device-state:local-device-tokens"
LOCAL_AUDIENCE = "device-state"
DEFAULT_DIRECTORY = Path(".serve/issuer")
KEY_FILE = "signing-key.pem"
JWKS_FILE = "jwks.json"
TOKEN_SECONDS = 3600


def create_once(path: Path, data: bytes) -> None:
    """Writes a secret to ``path`` (its owner's alone) unless it is there: whole or not at all,
    and of two made at once, the first linked is the one kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    try:
        os.link(partial, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(partial)


class Issuer:
    def __init__(self, private_key, kid: str, issuer: str = LOCAL_ISSUER, audience: str = LOCAL_AUDIENCE):
        self.private_key, self.kid, self.issuer, self.audience = private_key, kid, issuer, audience

    @classmethod
    def generate(cls, kind: str = "EC", **names) -> "Issuer":
        from cryptography.hazmat.primitives.asymmetric import ec, rsa

        key = ec.generate_private_key(ec.SECP256R1()) if kind == "EC" else rsa.generate_private_key(65537, 2048)
        return cls(key, uuid.uuid4().hex[:16], **names)

    @classmethod
    def load_or_create(cls, directory: Path = DEFAULT_DIRECTORY) -> "Issuer":
        """The checkout's own issuer: made on first use, the same key ever after."""
        from cryptography.hazmat.primitives import serialization

        directory = Path(directory)
        key_path = directory / KEY_FILE
        if not key_path.exists():
            issuer = cls.generate()
            create_once(key_path, issuer.private_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        issuer = cls(key, _thumbprint(key))
        partial = directory / f".{JWKS_FILE}.{os.getpid()}"
        partial.write_text(json.dumps(issuer.jwks(), indent=2) + "\n")
        os.replace(partial, directory / JWKS_FILE)  # for other servers to trust this issuer
        return issuer

    @property
    def algorithm(self) -> str:
        from cryptography.hazmat.primitives.asymmetric import ec

        return "ES256" if isinstance(self.private_key, ec.EllipticCurvePrivateKey) else "RS256"

    def jwks(self) -> dict:
        import jwt

        algorithm = jwt.get_algorithm_by_name(self.algorithm)
        entry = json.loads(algorithm.to_jwk(self.private_key.public_key()))
        return {"keys": [{**entry, "kid": self.kid, "use": "sig", "alg": self.algorithm}]}

    def environment(self) -> dict[str, str]:
        """The AUTH_* variables under which a server accepts this issuer's tokens."""
        return {AUTH_ISSUER: self.issuer, AUTH_AUDIENCE: self.audience, AUTH_JWKS: json.dumps(self.jwks())}

    def device_token_environment(self, key_file: Path) -> dict[str, str]:
        """The DEVICE_TOKEN_* variables under which a server signs device tokens with this
        issuer's key (saved in ``key_file``) as LOCAL_DEVICE_TOKEN_ISSUER, and accepts them."""
        return {DEVICE_TOKEN_ISSUER: LOCAL_DEVICE_TOKEN_ISSUER, DEVICE_TOKEN_AUDIENCE: self.audience,
                DEVICE_TOKEN_JWKS: json.dumps(self.jwks()), DEVICE_TOKEN_KEY_FILE: str(Path(key_file).resolve()),
                DEVICE_TOKEN_KID: self.kid}

    def save_key(self, path: Path) -> Path:
        """The private key as a PEM file (0600), for a server to sign with."""
        from cryptography.hazmat.primitives import serialization

        pem = self.private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption())
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(pem)
        return Path(path)

    def token(self, scopes=SCOPES, device: str | None = None, lifetime: float = TOKEN_SECONDS,
              headers: dict | None = None, **claims) -> str:
        """A signed token: for a back-end with ``scopes``, or for ``device``."""
        import jwt

        now = int(time.time())
        body = {"iss": self.issuer, "aud": self.audience, "iat": now, "nbf": now, "exp": int(now + lifetime),
                "sub": f"device-{device}" if device else "local-developer", "jti": uuid.uuid4().hex}
        if device:
            body["device_id"] = device
        else:
            body["scope"] = " ".join(scopes)
        body.update(claims)
        return jwt.encode({key: value for key, value in body.items() if value is not None}, self.private_key,
                          algorithm=self.algorithm, headers={"kid": self.kid, **(headers or {})})


def _thumbprint(key) -> str:
    """A stable key id: the public key's SHA-256, shortened."""
    import hashlib

    from cryptography.hazmat.primitives import serialization

    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()[:16]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="The local token issuer of make serve")
    parser.add_argument("command", choices=("token", "env"))
    parser.add_argument("--scopes", default="", help=f"space-separated, of {' '.join(SCOPES)} (default: "
                                                    f"{' '.join(DEFAULT_SCOPES)}; the admin scope only when named)")
    parser.add_argument("--device", default="", help="a device token for this device id (scopes are ignored)")
    parser.add_argument("--directory", default=str(DEFAULT_DIRECTORY))
    args = parser.parse_args(argv)
    issuer = Issuer.load_or_create(Path(args.directory))
    if args.command == "env":
        print("export " + " ".join(f"{name}={shlex.quote(value)}" for name, value in issuer.environment().items()))
        return
    scopes = args.scopes.split() or list(DEFAULT_SCOPES)
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        sys.exit(f"unknown scope {' '.join(unknown)}: the scopes are {' '.join(SCOPES)}")
    if args.device:
        from functions.auth.credentials import Unauthenticated, device_principal

        try:
            device_principal(args.device)
        except Unauthenticated:
            sys.exit("DEVICE must be 1-128 characters of A-Z a-z 0-9 . _ : -")
    print(issuer.token(scopes, device=args.device or None))


if __name__ == "__main__":
    main()
