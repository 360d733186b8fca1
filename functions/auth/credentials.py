"""Verifying a request's credentials into a Principal: a bearer token (JWT) checked
against configuration, or a client certificate that TLS already verified.

Configuration (the same variables locally and deployed):
- ``AUTH_ISSUER``: the one issuer whose tokens are accepted (``iss``).
- ``AUTH_AUDIENCE``: comma-separated audiences; a token must name one in ``aud``, or, with
  no ``aud`` (Cognito access tokens), in ``client_id``.
- ``AUTH_JWKS``: the issuer's public keys, a JWKS document inline (``{...}``) or a file's
  path. Never fetched at request time: an unknown ``kid`` is a bad token, not a fetch.
- ``DEVICE_TOKEN_ISSUER``, ``DEVICE_TOKEN_AUDIENCE``, ``DEVICE_TOKEN_JWKS`` (optional, all or
  none): the issuer of device tokens (``POST /devices/{id}/token``, ``device_tokens``), trusted
  beside the main one; its tokens only ever name a device, never scopes.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from functions.device_state import CREDENTIAL_ID_PATTERN, DEVICE_ID_PATTERN, certificate_id

from .principals import Principal, scopes_of

AUTH_ISSUER = "AUTH_ISSUER"
AUTH_AUDIENCE = "AUTH_AUDIENCE"
AUTH_JWKS = "AUTH_JWKS"
VARIABLES = (AUTH_ISSUER, AUTH_AUDIENCE, AUTH_JWKS)
DEVICE_TOKEN_ISSUER = "DEVICE_TOKEN_ISSUER"
DEVICE_TOKEN_AUDIENCE = "DEVICE_TOKEN_AUDIENCE"
DEVICE_TOKEN_JWKS = "DEVICE_TOKEN_JWKS"
DEVICE_TOKEN_VARIABLES = (DEVICE_TOKEN_ISSUER, DEVICE_TOKEN_AUDIENCE, DEVICE_TOKEN_JWKS)
ALGORITHMS = {"RSA": "RS256", "EC": "ES256"}  # the one algorithm accepted for each key type
LEEWAY_SECONDS = 60
LAST_EPOCH_SECOND = 253_402_300_799  # 9999-12-31T23:59:59Z: the latest time a token's claim may name
MAX_TOKEN_LENGTH = 8192
DEVICE_URI_PREFIX = "urn:device:"
# A device token's claims naming the credential its device proved itself with (device_tokens):
# the credential's id, true when it is a client certificate of the trusted CA, and when the
# credential itself expires (epoch seconds; absent: never), which no WebSocket connection outlives.
CREDENTIAL_CLAIM, CERTIFICATE_CLAIM, CREDENTIAL_EXPIRES_CLAIM = "cid", "cert", "cexp"
# The credential's entry on the device's item the token was issued on (item/credentials.Holder).
CREDENTIAL_REGISTRATION_CLAIM = "creg"
_REGISTRATION = re.compile(r"[0-9]{1,12}(\.[0-9]{1,6})?")
# A browser's WebSocket cannot set Authorization: it offers the token as a subprotocol beside the
# service's own, new WebSocket(url, ["device-state", "bearer.<token>"]), and the connect answer
# selects "device-state" (a JWT is base64url and dots, all valid in a subprotocol name).
WEBSOCKET_SUBPROTOCOL = "device-state"
BEARER_SUBPROTOCOL_PREFIX = "bearer."


class AuthConfigError(RuntimeError):
    """The service's own authentication settings are missing or wrong (a fault, not the caller's)."""


class Unauthenticated(Exception):
    """No usable credentials. ``token_given``: a token came and failed (``invalid_token``)."""

    def __init__(self, detail: str, token_given: bool = False):
        super().__init__(detail)
        self.token_given = token_given


class MixedCredentials(Exception):
    """A request that carries both a client certificate and a token."""


@dataclass(frozen=True)
class TrustedIssuer:
    """One issuer whose tokens are accepted. ``devices_only``: its tokens must name a device
    (``device_id``, ``sub`` ``device:<id>``) and never give scopes (the device-token issuer)."""

    issuer: str
    audiences: frozenset
    keys: dict  # kid -> (key, algorithm)
    devices_only: bool = False


@dataclass(frozen=True)
class AuthConfig:
    """The trusted issuers, the main one (``AUTH_*``) first, then the device-token issuer if configured."""

    issuers: tuple[TrustedIssuer, ...]

    @classmethod
    def from_environment(cls, environ=os.environ) -> "AuthConfig":
        main = _trusted(environ, VARIABLES)
        if not any(environ.get(name, "").strip() for name in DEVICE_TOKEN_VARIABLES):
            return cls((main,))
        devices = _trusted(environ, DEVICE_TOKEN_VARIABLES, devices_only=True)
        if devices.issuer == main.issuer:
            raise AuthConfigError(f"{DEVICE_TOKEN_ISSUER} must differ from {AUTH_ISSUER}: a device token's issuer "
                                  "is what limits it to a device")
        return cls((main, devices))

    def trusted(self, issuer) -> TrustedIssuer | None:
        return next((trusted for trusted in self.issuers if trusted.issuer == issuer), None)


def _trusted(environ, names: tuple[str, str, str], devices_only: bool = False) -> TrustedIssuer:
    issuer_name, audience_name, jwks_name = names
    issuer = environ.get(issuer_name, "").strip()
    audiences = frozenset(name.strip() for name in environ.get(audience_name, "").split(",") if name.strip())
    raw = environ.get(jwks_name, "").strip()
    if not issuer or not audiences or not raw:
        raise AuthConfigError(f"{', '.join(names)} must all be set")
    return TrustedIssuer(issuer, audiences, _keys(_jwks_document(raw, jwks_name), jwks_name), devices_only)


def _jwks_document(raw: str, name: str = AUTH_JWKS) -> dict:
    try:
        text = raw if raw.startswith("{") else Path(raw).read_text()
        return json.loads(text)
    except (OSError, ValueError) as error:
        raise AuthConfigError(f"{name} is neither a JWKS document nor a readable file: {error}") from None


def _keys(document: dict, name: str = AUTH_JWKS) -> dict:
    import jwt

    keys = {}
    for entry in document.get("keys", []) if isinstance(document, dict) else []:
        algorithm = ALGORITHMS.get(entry.get("kty")) if isinstance(entry, dict) else None
        if algorithm is None or entry.get("use", "sig") != "sig" or entry.get("alg", algorithm) != algorithm:
            continue  # a key this service would never accept a signature from
        keys[entry.get("kid")] = (jwt.PyJWK.from_dict({**entry, "alg": algorithm}).key, algorithm)
    if not keys:
        raise AuthConfigError(f"{name} holds no RSA (RS256) or EC (ES256) signing key")
    return keys


@functools.lru_cache(maxsize=1)
def load_auth_config() -> AuthConfig:
    return AuthConfig.from_environment()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None when there is no header."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("Authorization must be 'Bearer <token>'")
    return token.strip()


def verify_token(token: str, config: AuthConfig | None = None) -> Principal:
    """The principal of a valid token; Unauthenticated (token_given) for any other."""
    import jwt

    config = config or load_auth_config()
    if len(token) > MAX_TOKEN_LENGTH:
        raise Unauthenticated("the token is too long", token_given=True)
    try:
        header = jwt.get_unverified_header(token)
        # The issuer named picks the keys and the rules; the signature is checked with those keys next.
        trusted = config.trusted(jwt.decode(token, options={"verify_signature": False}).get("iss"))
        if trusted is None:
            raise Unauthenticated("the token is from another issuer", token_given=True)
        kid = header.get("kid")
        if kid not in trusted.keys and not (kid is None and len(trusted.keys) == 1):
            raise Unauthenticated("the token's key is not one of the issuer's", token_given=True)
        key, algorithm = trusted.keys[kid] if kid in trusted.keys else next(iter(trusted.keys.values()))
        claims = jwt.decode(token, key, algorithms=[algorithm], issuer=trusted.issuer, leeway=LEEWAY_SECONDS,
                            options={"require": ["exp", "iss"], "verify_aud": False})
    except jwt.ExpiredSignatureError:
        raise Unauthenticated("the token has expired", token_given=True) from None
    except jwt.ImmatureSignatureError:
        raise Unauthenticated("the token is not valid yet", token_given=True) from None
    except jwt.InvalidIssuerError:
        raise Unauthenticated("the token is from another issuer", token_given=True) from None
    except jwt.InvalidAlgorithmError:
        raise Unauthenticated("the token's algorithm is not accepted", token_given=True) from None
    except jwt.PyJWTError:
        raise Unauthenticated("the token is malformed or its signature is invalid", token_given=True) from None
    for name in ("exp", "nbf", "iat", "auth_time"):  # RFC 7519: NumericDate, a JSON number (PyJWT would take "123")
        value = claims.get(name)
        # compared, not math.isfinite(): an int of 400 digits is no float (OverflowError, a 500); NaN fails both
        if name in claims and (isinstance(value, bool) or not isinstance(value, (int, float))
                               or not -LAST_EPOCH_SECOND <= value <= LAST_EPOCH_SECOND):
            raise Unauthenticated(f"the token's {name} is not a number of seconds", token_given=True)
    # PyJWT holds iat and nbf to the clock; auth_time bounds renewal (device_tokens), so it is held too.
    if claims.get("auth_time", -math.inf) > time.time() + LEEWAY_SECONDS:
        raise Unauthenticated("the token's auth_time is in the future", token_given=True)
    _check_audience(claims, trusted)
    if trusted.devices_only and ("device_id" not in claims or claims.get("sub") != f"device:{claims['device_id']}"):
        raise Unauthenticated("a device token must name its device (device_id, sub device:<id>)", token_given=True)
    return _principal(claims, trusted)


def _check_audience(claims: dict, config: TrustedIssuer) -> None:
    audience = claims.get("aud")
    named = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
    if audience is None and claims.get("token_use") == "access":
        named = [claims.get("client_id")]  # Cognito access tokens name their client, not an audience
    named = {name for name in named if isinstance(name, str)}
    if not named.intersection(config.audiences):
        raise Unauthenticated("the token is for another audience", token_given=True)


def _principal(claims: dict, trusted: TrustedIssuer) -> Principal:
    expires_at = int(claims["exp"])
    if "device_id" in claims:
        # When the device last proved itself with what it holds (a device token carries it
        # on), else when this token was issued: what bounds renewing it (device_tokens).
        auth_time = claims.get("auth_time", claims.get("iat"))
        credential = claims.get(CREDENTIAL_CLAIM) if trusted.devices_only else None
        if credential is not None and (not isinstance(credential, str) or not CREDENTIAL_ID_PATTERN.fullmatch(credential)):
            raise Unauthenticated("the token's cid is no credential id", token_given=True)
        credential_expires = claims.get(CREDENTIAL_EXPIRES_CLAIM) if credential is not None else None
        if credential_expires is not None and (type(credential_expires) is not int or credential_expires < 0):
            raise Unauthenticated("the token's cexp is no time", token_given=True)
        registration = claims.get(CREDENTIAL_REGISTRATION_CLAIM) if credential is not None else None
        if registration is not None and not (isinstance(registration, str) and _REGISTRATION.fullmatch(registration)):
            raise Unauthenticated("the token's creg is no credential entry", token_given=True)
        return device_principal(claims["device_id"], expires_at, None if auth_time is None else int(auth_time),
                                credential, credential is not None and claims.get(CERTIFICATE_CLAIM) is True,
                                credential_expires, registration)
    subject = claims.get("sub") or claims.get("client_id")
    if not isinstance(subject, str) or not subject:
        raise Unauthenticated("the token names no subject", token_given=True)
    return Principal.client(subject, scopes_of(claims.get("scope")), expires_at)


def device_principal(device_id, expires_at: int | None = None, auth_time: int | None = None,
                     credential_id: str | None = None, certificate: bool = False,
                     credential_expires_at: int | None = None, credential_registration: str | None = None) -> Principal:
    if not isinstance(device_id, str) or not DEVICE_ID_PATTERN.fullmatch(device_id):
        raise Unauthenticated("the credential names no valid device id", token_given=True)
    return Principal.device(device_id, expires_at, auth_time, credential_id, certificate, credential_expires_at,
                            credential_registration)


def certificate_principal(pem: str, now: float | None = None) -> Principal:
    """The device a client certificate (already verified by TLS against the truststore)
    names: its SAN ``URI:urn:device:<id>``, or failing that its subject CN; authenticated ``now``,
    with the certificate as its credential (``certificate_id`` of its SHA-256 thumbprint, which
    the device's state item names once the certificate is registered)."""
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import NameOID

    try:
        certificate = x509.load_pem_x509_certificate(pem.encode())
    except (ValueError, x509.InvalidVersion):  # InvalidVersion: no ValueError
        raise Unauthenticated("the client certificate cannot be read") from None
    held = certificate_id(hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).digest())
    auth_time = int(time.time() if now is None else now)
    # TLS checked the dates at the handshake; a session resumed later (a TLS ticket) brings the
    # certificate back unchecked, so they are checked here too (a minute's leeway before its start,
    # for the TLS front's clock against this one), and no token outlives it.
    not_after = int(certificate.not_valid_after_utc.timestamp())
    if not certificate.not_valid_before_utc.timestamp() - LEEWAY_SECONDS <= auth_time <= not_after:
        raise Unauthenticated("the client certificate is not valid now (expired, or not yet valid)")
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        # A URN's scheme and namespace are case-insensitive (RFC 8141); its id is not.
        uris = [uri for uri in names.get_values_for_type(x509.UniformResourceIdentifier)
                if uri[:len(DEVICE_URI_PREFIX)].lower() == DEVICE_URI_PREFIX]
    except x509.ExtensionNotFound:
        uris = []
    if len(uris) > 1:
        raise Unauthenticated("the client certificate names more than one device (urn:device: URIs)")
    if uris:
        return device_principal(uris[0][len(DEVICE_URI_PREFIX):], auth_time=auth_time, credential_id=held,
                                certificate=True, credential_expires_at=not_after)
    common_names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not common_names:
        raise Unauthenticated("the client certificate names no device (no urn:device: URI, no CN)")
    return device_principal(common_names[0].value, auth_time=auth_time, credential_id=held, certificate=True,
                            credential_expires_at=not_after)


def authenticate(authorization: str | None, client_certificate_pem: str | None,
                 config: AuthConfig | None = None) -> Principal:
    """The principal of a request's credentials: its certificate or its bearer token, never both."""
    if client_certificate_pem and authorization is not None:
        raise MixedCredentials("send a client certificate or a bearer token, not both")
    if client_certificate_pem:
        return certificate_principal(client_certificate_pem)
    token = bearer_token(authorization)
    if token is None:
        raise Unauthenticated("this route needs 'Authorization: Bearer <token>' or a device certificate")
    return verify_token(token, config)


def authenticate_event(event: dict, config: AuthConfig | None = None) -> Principal:
    """``authenticate`` over an API Gateway event (HTTP API proxy, WebSocket, REQUEST authorizer):
    its Authorization header and the client certificate mutual TLS verified, if any. A
    WebSocket connect may carry the token instead (browsers cannot set headers) as a
    ``bearer.<token>`` subprotocol beside ``device-state`` (``websocket_token``), or as
    ``?token=``: one of them, once."""
    return authenticate(*_request_credentials(event), config)


def assertion_of(event: dict, config: AuthConfig | None = None) -> str | None:
    """The bearer token of a request that is no trusted issuer's token (by its unverified
    ``iss``): an assertion the route verifies itself (``functions/auth/assertions.py``); None
    when the request carries a trusted issuer's token, a certificate or nothing."""
    import jwt

    authorization, certificate = _request_credentials(event)
    if certificate or authorization is None:
        return None
    token = bearer_token(authorization)
    try:
        issuer = jwt.decode(token, options={"verify_signature": False}).get("iss")
    except jwt.PyJWTError:
        return token  # no JWT at all: refused as a malformed assertion
    return token if (config or load_auth_config()).trusted(issuer) is None else None


def _request_credentials(event: dict) -> tuple[str | None, str | None]:
    """(the Authorization header, the client certificate's PEM) of an API Gateway event."""
    given = header_values(event, "authorization")
    if len(given) > 1:
        raise Unauthenticated("send one Authorization header", token_given=True)
    authorization = given[0] if given else None
    if is_websocket_connect(event):
        token = websocket_token(event)
        if token is not None and authorization is not None:  # one token in all, or which one is meant?
            raise Unauthenticated("send one token", token_given=True)
        authorization = authorization if token is None else f"Bearer {token}"
    identity = (event.get("requestContext") or {}).get("identity") or {}
    return authorization, (identity.get("clientCert") or {}).get("clientCertPem")


def header_values(event: dict, name: str) -> list[str]:
    """Every value of a header (any case) in an API Gateway event: its multiValueHeaders, else its headers."""
    return ([value for key, values in (event.get("multiValueHeaders") or {}).items() if key.lower() == name
             for value in values]
            or [value for key, value in (event.get("headers") or {}).items() if key.lower() == name])


def websocket_subprotocols(event: dict) -> list[str]:
    """The subprotocols a WebSocket connect offers (``Sec-WebSocket-Protocol``, comma-separated), in order."""
    return [entry.strip() for value in header_values(event, "sec-websocket-protocol")
            for entry in value.split(",") if entry.strip()]


def websocket_token(event: dict) -> str | None:
    """A WebSocket connect's token: the one ``bearer.<token>`` subprotocol, or the one ``?token=``.
    A browser can send either; the subprotocol keeps the token out of the URL, and so out of
    access logs and browser history. Two of them, of either kind, are refused."""
    offered = [entry[len(BEARER_SUBPROTOCOL_PREFIX):] for entry in websocket_subprotocols(event)
               if entry.startswith(BEARER_SUBPROTOCOL_PREFIX)]
    queried = (event.get("multiValueQueryStringParameters") or {}).get("token") or []
    query_token = (event.get("queryStringParameters") or {}).get("token")
    if not queried and query_token is not None:
        queried = [query_token]
    if len(offered) + len(queried) > 1:
        raise Unauthenticated("send one token", token_given=True)
    return (offered or queried or [None])[0]


def is_websocket_connect(event: dict) -> bool:
    """A WebSocket API's $connect (its request context says so; an HTTP request's never does)."""
    context = event.get("requestContext") or {}
    return context.get("routeKey") == "$connect" and context.get("eventType") == "CONNECT"
