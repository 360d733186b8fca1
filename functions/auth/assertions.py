"""Assertions: how a device proves itself with what it holds. An assertion is a short JWT the
device signs itself with a registered credential (``POST /devices/{id}/token``) or with the key
an enrollment derives for it (``POST /devices/{id}/provision``): header ``kid`` = the
credential's (or the enrollment's) id; claims ``sub`` = the device id, ``aud`` = ``AUDIENCE``,
``iat``, ``exp`` (in the future, at most ``MAX_LIFETIME_SECONDS`` after ``iat``) and ``jti``
(spent once, by the library). The algorithm is the credential's, never the header's choice:
ES256 for an EC P-256 key, RS256 for an RSA key of at least 2048 bits (a registered public key or
certificate), HS256 keyed with the bytes of a secret. An algorithm none of these (``none``) is
refused by ``read``; one other than the credential's (HS256 against a public key, RS256 against
an EC key) by ``verify``, which never verifies it.

Each refusal is a 401 of a problem type (``functions/api/problems.py``). ``read`` checks what
needs no key (before anything is read for the request); ``verify`` checks the signature with the
key the caller found, and its caller (``identity``) answers a failure of it as a kid that names
nothing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
from dataclasses import dataclass

from functions.device_state import certificate_id

from .credentials import LAST_EPOCH_SECOND, LEEWAY_SECONDS, MAX_TOKEN_LENGTH, Unauthenticated

AUDIENCE = "device-state"
MAX_LIFETIME_SECONDS = 600  # an assertion's exp at most this long after its iat
MAX_JTI_CHARS = 128
MAX_KID_CHARS = 64
ES256, RS256, HS256 = "ES256", "RS256", "HS256"
ALGORITHMS = (ES256, RS256, HS256)
MIN_RSA_BITS = 2048
MAX_PEM_CHARS = 16384  # a public key or certificate as registered
# One PEM block (RFC 7468), text around it ignored (openssl's -text, a PKCS#12 export's bag
# attributes): cryptography's loaders read the first block they find and drop whatever follows,
# so a second block (another key, a certificate's chain) would be registered unseen.
_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----[A-Za-z0-9+/=\s]+-----END \1-----")


class AssertionRefused(Unauthenticated):
    """An assertion that does not prove what it claims; the subclass says why."""

    def __init__(self, detail: str):
        super().__init__(detail, token_given=True)


class AssertionMalformed(AssertionRefused):
    """Not a JWT, or a claim missing, of the wrong type, or out of bounds."""


class AssertionExpired(AssertionRefused):
    pass


class AssertionAlgorithm(AssertionRefused):
    """An algorithm the service verifies none of (``none``: ``read``), or not the credential's (``verify``)."""


class AssertionAudience(AssertionRefused):
    pass


class AssertionSubject(AssertionRefused):
    """``sub`` names another device than the path."""


class AssertionSignature(AssertionRefused):
    pass


class CredentialUnknown(AssertionRefused):
    """No credential (or enrollment) of this device verifies the assertion: its ``kid`` names none,
    or the one it names does not verify it (``identity`` answers both alike). ``cause`` says which,
    for the service's own log only."""

    def __init__(self, detail: str, cause: str = "kid names nothing"):
        super().__init__(detail)
        self.cause = cause


class CredentialExpired(AssertionRefused):
    pass


class InvalidKey(ValueError):
    """A public key or certificate this service cannot verify assertions with; says why."""


@dataclass(frozen=True)
class Assertion:
    token: str
    kid: str
    algorithm: str
    claims: dict

    @property
    def jti(self) -> str:
        return self.claims["jti"]

    @property
    def expires_at(self) -> int:
        return math.ceil(self.claims["exp"])


def read(token: str, device_id: str, now: float) -> Assertion:
    """The assertion ``token`` for ``device_id``, its claims checked (not yet its signature)."""
    import jwt

    if len(token) > MAX_TOKEN_LENGTH:
        raise AssertionMalformed("the assertion is too long")
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        raise AssertionMalformed("the assertion is not a JWT (header.claims.signature, base64url JSON)") from None
    algorithm, kid = header.get("alg"), header.get("kid")
    if algorithm not in ALGORITHMS:
        raise AssertionAlgorithm(f"an assertion is signed with ES256, RS256 or HS256 (its credential's), "
                                 f"not {str(algorithm)[:16]!r}")
    if not isinstance(kid, str) or not 0 < len(kid) <= MAX_KID_CHARS:
        raise AssertionMalformed("the assertion's header needs kid: the id of the credential it is signed with")
    for name in ("iat", "exp"):
        value = claims.get(name)
        # compared, not math.isfinite(): an int of 400 digits is no float (OverflowError), NaN fails both
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= LAST_EPOCH_SECOND:
            raise AssertionMalformed(f"the assertion needs {name}, a number of seconds since the epoch")
    jti = claims.get("jti")
    if not isinstance(jti, str) or not 0 < len(jti) <= MAX_JTI_CHARS:
        raise AssertionMalformed(f"the assertion needs jti, a string of 1 to {MAX_JTI_CHARS} characters, new each time")
    if claims.get("sub") != device_id:
        raise AssertionSubject("the assertion's sub is not the device of the path")
    audience = claims.get("aud")
    named = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
    if AUDIENCE not in named:
        raise AssertionAudience(f"the assertion's aud must be {AUDIENCE!r}")
    if claims["iat"] > now + LEEWAY_SECONDS:
        raise AssertionMalformed("the assertion's iat is in the future")
    if claims["exp"] > claims["iat"] + MAX_LIFETIME_SECONDS:
        raise AssertionMalformed(f"the assertion's exp is more than {MAX_LIFETIME_SECONDS} s after its iat")
    if claims["exp"] <= now:
        raise AssertionExpired("the assertion has expired: sign a new one")
    return Assertion(token, kid, algorithm, claims)


def verify(assertion: Assertion, algorithm: str, key) -> None:
    """Checks the assertion's signature with ``key`` (bytes for HS256, a public key object for
    ES256 and RS256) under ``algorithm``, the credential's."""
    import jwt

    if assertion.algorithm != algorithm:
        raise AssertionAlgorithm(f"this credential signs with {algorithm}, not {assertion.algorithm}")
    try:
        jwt.PyJWS().decode(assertion.token, key, algorithms=[algorithm])
    except jwt.InvalidSignatureError:
        raise AssertionSignature("the assertion's signature is not the credential's") from None
    except (jwt.InvalidAlgorithmError, jwt.InvalidKeyError):
        raise AssertionAlgorithm(f"the credential cannot verify {algorithm}") from None
    except jwt.PyJWTError:
        raise AssertionMalformed("the assertion's signature cannot be read") from None


def public_key(pem: str):
    """(the key, its algorithm) of a public key in PEM: an EC P-256 key (ES256) or an RSA key of at
    least ``MIN_RSA_BITS`` (RS256); ``InvalidKey`` for any other."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_public_key(_one_block(pem))
    except UnsupportedAlgorithm:  # a key of an algorithm cryptography does not know (no ValueError)
        raise InvalidKey(KEY_ALGORITHMS) from None
    except (ValueError, TypeError, UnicodeError):
        raise InvalidKey("publicKey is not one public key in PEM (-----BEGIN PUBLIC KEY-----)") from None
    return key, key_algorithm(key)


def _one_block(pem: str) -> bytes:
    """The one PEM block of ``pem`` (``_PEM_BLOCK``); ValueError for none, or more than one."""
    found = _PEM_BLOCK.search(pem) if isinstance(pem, str) and pem.count("-----BEGIN ") == 1 else None
    if found is None:
        raise ValueError("not one PEM block")
    return found.group(0).encode()


KEY_ALGORITHMS = f"the key must be EC P-256 (ES256) or RSA of at least {MIN_RSA_BITS} bits (RS256)"


def key_algorithm(key) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1":
        return ES256
    if isinstance(key, rsa.RSAPublicKey) and key.key_size >= MIN_RSA_BITS:
        return RS256
    raise InvalidKey(KEY_ALGORITHMS)


def public_key_pem(key) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@dataclass(frozen=True)
class Certificate:
    """What registering a certificate stores: its key (PEM), its SHA-256 thumbprint (hex) and the
    credential id mutual TLS derives from it; and its notAfter (epoch seconds)."""

    public_key: str
    thumbprint: str
    credential_id: str
    not_after: int


def thumbprint(der: bytes) -> bytes:
    return hashlib.sha256(der).digest()


def certificate(pem: str) -> Certificate:
    """A certificate in PEM (any issuer, self-signed included) whose key can verify assertions."""
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    try:
        parsed = x509.load_pem_x509_certificate(_one_block(pem))
    except (ValueError, TypeError, UnicodeError, x509.InvalidVersion):  # InvalidVersion: no ValueError
        raise InvalidKey("certificate is not one X.509 certificate in PEM (-----BEGIN CERTIFICATE-----): "
                         "a chain is the device's certificate alone") from None
    try:
        key = parsed.public_key()  # read only now: a key cryptography does not know fails here
    except (UnsupportedAlgorithm, ValueError):
        raise InvalidKey(KEY_ALGORITHMS) from None
    key_algorithm(key)
    digest = thumbprint(parsed.public_bytes(serialization.Encoding.DER))
    return Certificate(public_key_pem(key), digest.hex(), certificate_id(digest),
                       int(parsed.not_valid_after_utc.timestamp()))


def device_key(group_key: bytes, device_id: str) -> bytes:
    """The key an enrollment derives for a device at the factory: HMAC-SHA256(groupKey, deviceId)."""
    return hmac.new(group_key, device_id.encode(), hashlib.sha256).digest()


def encoded(key: bytes) -> str:
    """A secret or key as the API shows it once: base64."""
    return base64.b64encode(key).decode()
