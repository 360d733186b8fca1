"""Device tokens, as AWS IoT's credentials provider gives them: a device that proves itself
with what it holds (its client certificate, an assertion signed with a registered key or
secret, or a device token it holds) gets a short-lived device-principal JWT from
``POST /devices/{id}/token`` (or from provisioning), which every route and the WebSocket API
accept, where no client certificate can be presented (API Gateway WebSocket APIs take none).
A token names the credential its device proved itself with (``cid``; ``cert`` for a client
certificate of the trusted CA): every request with it must find that credential on the device,
so revoking it shuts the token out at once.

The tokens are signed by the device-token issuer (``DEVICE_TOKEN_ISSUER``; verified with
``DEVICE_TOKEN_JWKS`` by ``credentials``) with a ``Signer``: a KMS key deployed
(``DEVICE_TOKEN_KMS_KEY``), a PEM key file locally (``DEVICE_TOKEN_KEY_FILE``).

Renewal is bounded: a token carries ``auth_time``, when its device last proved itself with
what it holds (a token from the main issuer counts from its own ``auth_time`` or ``iat``).
A token is renewed only within ``DEVICE_TOKEN_RENEWAL_SECONDS`` of it, and no token is issued
to outlive it (nor its credential's expiry), so a stolen token is good for that long at most;
then only the certificate or a new assertion gets a new one.

Configuration, read once and checked whole (``TokenSettings.from_environment``):
- ``DEVICE_TOKEN_SECONDS``: a token's lifetime (default 3600), 60 up to the stated maximum.
- ``DEVICE_TOKEN_MAX_SECONDS``: that maximum (default 3600); an operator who wants longer
  tokens raises it explicitly, up to ``MAX_SECONDS_CEILING``.
- ``DEVICE_TOKEN_RENEWAL_SECONDS``: the renewal bound (default 86400), at least a lifetime.
"""

from __future__ import annotations

import base64
import datetime
import functools
import json
import os
import time
import uuid
from dataclasses import dataclass

from .credentials import (CERTIFICATE_CLAIM, CREDENTIAL_CLAIM, CREDENTIAL_EXPIRES_CLAIM, CREDENTIAL_REGISTRATION_CLAIM,
                          DEVICE_TOKEN_AUDIENCE, DEVICE_TOKEN_ISSUER, LEEWAY_SECONDS, AuthConfigError)
from .principals import DEVICE, Principal
from .signers import ALGORITHM, KeyFileSigner, KmsSigner, Signer

DEVICE_TOKEN_KMS_KEY = "DEVICE_TOKEN_KMS_KEY"  # the KMS key's ARN (deployed)
DEVICE_TOKEN_KEY_FILE = "DEVICE_TOKEN_KEY_FILE"  # a PEM file of an EC P-256 key (locally)
DEVICE_TOKEN_KID = "DEVICE_TOKEN_KID"  # the key id the JWKS names the key file's key by
DEVICE_TOKEN_SECONDS = "DEVICE_TOKEN_SECONDS"
DEVICE_TOKEN_MAX_SECONDS = "DEVICE_TOKEN_MAX_SECONDS"
DEVICE_TOKEN_RENEWAL_SECONDS = "DEVICE_TOKEN_RENEWAL_SECONDS"
# What the API function reads beside the verification variables (credentials.DEVICE_TOKEN_VARIABLES).
ISSUING_VARIABLES = (DEVICE_TOKEN_KMS_KEY, DEVICE_TOKEN_KEY_FILE, DEVICE_TOKEN_KID, DEVICE_TOKEN_SECONDS,
                     DEVICE_TOKEN_MAX_SECONDS, DEVICE_TOKEN_RENEWAL_SECONDS)
DEFAULT_SECONDS = DEFAULT_MAX_SECONDS = 3600
MIN_SECONDS = 60
MAX_SECONDS_CEILING = 12 * 3600
DEFAULT_RENEWAL_SECONDS = 24 * 3600
MAX_RENEWAL_SECONDS = 30 * 24 * 3600
TOKEN_TYPE = "Bearer"


class RenewalRefused(Exception):
    """The caller's credential may not be renewed into a device token: its device last
    authenticated with its certificate too long ago (or it never says when)."""


@dataclass(frozen=True)
class TokenSettings:
    issuer: str
    audience: str
    lifetime_seconds: int = DEFAULT_SECONDS
    renewal_seconds: int = DEFAULT_RENEWAL_SECONDS
    kms_key: str | None = None
    key_file: str | None = None
    kid: str | None = None

    @classmethod
    def from_environment(cls, environ=os.environ) -> "TokenSettings":
        issuer = environ.get(DEVICE_TOKEN_ISSUER, "").strip()
        audiences = [name.strip() for name in environ.get(DEVICE_TOKEN_AUDIENCE, "").split(",") if name.strip()]
        kms_key = environ.get(DEVICE_TOKEN_KMS_KEY, "").strip() or None
        key_file = environ.get(DEVICE_TOKEN_KEY_FILE, "").strip() or None
        if not issuer or not audiences:
            raise AuthConfigError(f"device tokens need {DEVICE_TOKEN_ISSUER} and {DEVICE_TOKEN_AUDIENCE}")
        if (kms_key is None) == (key_file is None):
            raise AuthConfigError(f"device tokens need exactly one of {DEVICE_TOKEN_KMS_KEY} and "
                                  f"{DEVICE_TOKEN_KEY_FILE}")
        kid = environ.get(DEVICE_TOKEN_KID, "").strip() or None
        if key_file and not kid:
            raise AuthConfigError(f"{DEVICE_TOKEN_KEY_FILE} needs {DEVICE_TOKEN_KID}, its key's id in the JWKS")
        maximum = _seconds(environ, DEVICE_TOKEN_MAX_SECONDS, DEFAULT_MAX_SECONDS, MIN_SECONDS, MAX_SECONDS_CEILING)
        lifetime = _seconds(environ, DEVICE_TOKEN_SECONDS, min(DEFAULT_SECONDS, maximum), MIN_SECONDS, maximum)
        renewal = _seconds(environ, DEVICE_TOKEN_RENEWAL_SECONDS, DEFAULT_RENEWAL_SECONDS, lifetime,
                           MAX_RENEWAL_SECONDS)
        return cls(issuer, audiences[0], lifetime, renewal, kms_key, key_file, kid)


def _seconds(environ, name: str, default: int, low: int, high: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise AuthConfigError(f"{name}={raw!r} is not a whole number of seconds")
    if not low <= int(raw) <= high:
        raise AuthConfigError(f"{name}={raw} is outside {low}..{high}"
                              + (f" (raise {DEVICE_TOKEN_MAX_SECONDS} for longer tokens)"
                                 if name == DEVICE_TOKEN_SECONDS else ""))
    return int(raw)


def _base64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _timestamp(seconds: int) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def issue(principal: Principal, signer: Signer, settings: TokenSettings, now: float | None = None,
          credential_expires_at: int | None = None, credential_registration: str | None = None) -> dict:
    """The answer of ``POST /devices/{id}/token`` for ``principal`` (a device, authorized
    already): a signed token naming its credential and the entry the device's item holds for it
    (``credential_registration``: a credential registered again since opens nothing with the
    token), and when it expires (never after ``credential_expires_at``, the credential's own
    expiry). RenewalRefused past the renewal bound; the signer's SigningFailed when the token
    cannot be signed now."""
    now = int(time.time() if now is None else now)
    if principal.kind != DEVICE or principal.auth_time is None:
        raise RenewalRefused("this credential cannot be renewed: call with the device's certificate or an assertion")
    if principal.auth_time > now + LEEWAY_SECONDS:  # verify_token refuses such a token; a principal built elsewhere
        raise RenewalRefused("the credential says its device authenticated in the future: call with its certificate")
    # A time ahead of this clock (within the leeway) counts from now: the bound never starts later than the
    # renewal that carries it on, and the chain carries no future time.
    auth_time = min(principal.auth_time, now)
    renewable_until = auth_time + settings.renewal_seconds
    if now >= renewable_until:
        raise RenewalRefused(f"the device last proved itself with its certificate or an assertion more than "
                             f"{settings.renewal_seconds} s ago: call with its certificate or a new assertion")
    if credential_expires_at is not None and now >= credential_expires_at:  # it would be born expired
        raise RenewalRefused("the credential the device proved itself with has expired: call with one it holds")
    expires_at = min(now + settings.lifetime_seconds, renewable_until, credential_expires_at or renewable_until)
    claims = {"iss": settings.issuer, "aud": settings.audience, "sub": principal.subject,
              "device_id": principal.device_id, "iat": now, "nbf": now, "exp": expires_at,
              "auth_time": auth_time, "jti": uuid.uuid4().hex}
    if principal.credential_id is not None:
        claims[CREDENTIAL_CLAIM] = principal.credential_id
        if principal.certificate:
            claims[CERTIFICATE_CLAIM] = True
        if credential_expires_at:
            claims[CREDENTIAL_EXPIRES_CLAIM] = int(credential_expires_at)
        if credential_registration is not None:
            claims[CREDENTIAL_REGISTRATION_CLAIM] = credential_registration
    header = {"alg": ALGORITHM, "typ": "JWT", "kid": signer.kid}
    signing_input = ".".join(_base64url(json.dumps(part, separators=(",", ":")).encode())
                             for part in (header, claims))
    token = f"{signing_input}.{_base64url(signer.sign(signing_input.encode()))}"
    return {"token": token, "tokenType": TOKEN_TYPE, "expiresIn": expires_at - now,
            "expiresAt": _timestamp(expires_at)}


def signer_for(settings: TokenSettings, kms_client_factory=None) -> Signer:
    if settings.key_file:
        try:
            return KeyFileSigner.from_file(settings.key_file, settings.kid)
        except (OSError, ValueError) as error:
            raise AuthConfigError(f"{DEVICE_TOKEN_KEY_FILE}: {error}") from None
    return KmsSigner(settings.kms_key, (kms_client_factory or kms_client)())


def kms_client():
    """KMS's client: one attempt (a throttled Sign is answered 429 at once, so devices back off
    instead of the function retrying into the same quota), short timeouts (503 rather than a
    request held for KMS)."""
    from botocore.config import Config

    from functions.device_state import new_client

    return new_client("kms", config=Config(retries={"max_attempts": 1, "mode": "standard"},
                                           connect_timeout=2, read_timeout=3))


@functools.lru_cache(maxsize=1)
def device_token_issuer() -> tuple[TokenSettings, Signer]:
    """The settings and signer from the environment, made once per container."""
    settings = TokenSettings.from_environment()
    return settings, signer_for(settings)
