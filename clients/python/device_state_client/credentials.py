"""How a caller proves who it is: a bearer token (given, from the environment, or printed by a
command and renewed before it expires), or a device's client certificate, its whole credential
on the HTTP API (mutual TLS), exchanged for a token for the WebSocket API, which takes tokens only."""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import threading
import time
from typing import Callable


class TokenCredentials:
    """A bearer token, or a callable that returns a valid one whenever it is called (it is
    called for every request and connection, so it should cache)."""

    def __init__(self, token: str | Callable[[], str]):
        self._source = token

    @classmethod
    def from_environment(cls, name: str = "DEVICE_STATE_TOKEN") -> TokenCredentials:
        """The token in the environment variable ``name``."""
        token = os.environ.get(name)
        if not token:
            raise CredentialsError(f"the environment variable {name} holds no token")
        return cls(token)

    @property
    def renewable(self) -> bool:
        return callable(self._source)

    @property
    def renews_refused_tokens(self) -> bool:
        """Whether a request refused 401 is worth sending once more with a renewed token."""
        return self.renewable

    def ssl_context(self, default: ssl.SSLContext | None) -> ssl.SSLContext | None:
        return default

    def rest_headers(self, client, renew: bool = False) -> dict:
        return {"Authorization": f"Bearer {self.bearer_token(client, renew)}"}

    def bearer_token(self, client, renew: bool = False) -> str:
        return self._source() if callable(self._source) else self._source


class CredentialsError(Exception):
    """No token could be had: an empty variable, a token command that failed or printed no token."""


class CommandCredentials(TokenCredentials):
    """A bearer token printed by a shell command (``make -s token``; for Cognito's
    client-credentials flow, the ``curl`` that asks its token endpoint): its output is the
    token alone, or a JSON object with ``access_token`` (or ``token``) and ``expires_in``. The
    command runs again once ``renew_at`` of the token's life has passed (its JWT ``exp``, else
    ``expires_in``), and when the service refuses the token (401)."""

    renewable = True

    def __init__(self, command: str, renew_at: float = 0.8, timeout: float = 60,
                 clock: Callable[[], float] = time.time):
        self.command, self.renew_at, self.timeout, self._clock = command, renew_at, timeout, clock
        self._token: str | None = None
        self._renew_after: float | None = None
        self._lock = threading.Lock()  # a lease's heartbeat thread shares the credentials

    def bearer_token(self, client=None, renew: bool = False) -> str:
        with self._lock:
            stale = self._renew_after is not None and self._clock() >= self._renew_after
            if renew or self._token is None or stale:
                self._token, self._renew_after = self._run()
            return self._token

    def _run(self) -> tuple[str, float | None]:
        try:
            done = subprocess.run(self.command, shell=True, capture_output=True, text=True, timeout=self.timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise CredentialsError(f"the token command did not finish in {self.timeout:g} s: {self.command}") from None
        if done.returncode != 0:
            said = done.stderr.strip().splitlines()[-1:] or [""]
            raise CredentialsError(f"the token command exited {done.returncode}: {self.command}: {said[0]}")
        now, output = self._clock(), done.stdout.strip()
        lifetime = None
        if output.startswith("{"):
            try:
                answer = json.loads(output)
                output = answer.get("access_token") or answer.get("token") or ""
                lifetime = answer.get("expires_in", answer.get("expiresIn"))
            except (ValueError, AttributeError):
                output = ""
        if not isinstance(output, str) or not output or any(character.isspace() for character in output):
            raise CredentialsError(f"the token command printed no single token: {self.command}")
        expires = token_expiry(output)
        if expires is None and isinstance(lifetime, (int, float)):
            expires = now + lifetime
        return output, None if expires is None else now + self.renew_at * max(expires - now, 0)


class CertificateCredentials:
    """A device's client certificate (PEM files). REST requests go over mutual TLS with it and
    no token (the service refuses a certificate and a token together); the WebSocket gets a
    token from ``POST /devices/{id}/token``, renewed once ``renew_at`` of its life has passed."""

    renewable = True
    renews_refused_tokens = False  # its HTTP requests carry no token

    def __init__(self, cert_file: str, key_file: str, ca_file: str | None = None, renew_at: float = 0.8,
                 clock: Callable[[], float] = time.monotonic):
        self.cert_file, self.key_file, self.ca_file = cert_file, key_file, ca_file
        self.renew_at, self._clock = renew_at, clock
        self._token: str | None = None
        self._renew_after = 0.0
        self._lock = threading.Lock()  # follow() may run in a thread beside the device's reports

    def ssl_context(self, default: ssl.SSLContext | None) -> ssl.SSLContext:
        context = default or ssl.create_default_context()
        if self.ca_file:  # beside the system's CAs, not instead: the WebSocket API's certificate is a public one
            context.load_verify_locations(cafile=self.ca_file)
        context.load_cert_chain(self.cert_file, self.key_file)  # sent only to a server that asks for it
        return context

    def rest_headers(self, client, renew: bool = False) -> dict:
        return {}

    def bearer_token(self, client, renew: bool = False) -> str:
        with self._lock:
            if renew or self._token is None or self._clock() >= self._renew_after:
                answer = client.exchange_certificate()
                self._token = answer["token"]
                self._renew_after = self._clock() + self.renew_at * float(answer["expiresIn"])
            return self._token


def token_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (epoch seconds), read without verifying it (the server
    verifies): only to know when a connection opened with it will stop being served."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, KeyError, TypeError, ValueError):
        return None


# --- a device's own credentials: assertions it signs -----------------------------------------

ASSERTION_AUDIENCE = "device-state"
ASSERTION_SECONDS = 300  # an assertion's life (the service takes at most 600)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def derive_device_key(group_key: str, device_id: str) -> str:
    """What a factory stores on a device of a group enrollment: ``base64(HMAC-SHA256(
    base64decode(groupKey), deviceId))``, the key the device provisions itself with."""
    import hashlib
    import hmac

    return base64.b64encode(hmac.new(base64.b64decode(group_key), device_id.encode(), hashlib.sha256).digest()).decode()


def sign_assertion(device_id: str, kid: str, *, secret: str | None = None, private_key=None,
                   lifetime: float = ASSERTION_SECONDS, clock: Callable[[], float] = time.time) -> str:
    """A JWT proving the device holds a credential: header ``kid`` (the credential's id, or an
    enrollment's), claims ``sub`` (the device), ``aud``, ``iat``, ``exp``, a new ``jti``. HS256
    keyed with the base64-decoded ``secret``, or ES256 / RS256 with ``private_key`` (a
    ``cryptography`` private key: EC P-256 or RSA)."""
    import hashlib
    import hmac
    import uuid

    if (secret is None) == (private_key is None):
        raise ValueError("sign with a secret or a private key, one of them")
    now = int(clock())
    if private_key is None:
        algorithm = "HS256"
    else:
        from cryptography.hazmat.primitives.asymmetric import ec

        algorithm = "ES256" if isinstance(private_key, ec.EllipticCurvePrivateKey) else "RS256"
    header = {"alg": algorithm, "typ": "JWT", "kid": kid}
    claims = {"sub": device_id, "aud": ASSERTION_AUDIENCE, "iat": now, "exp": now + int(lifetime),
              "jti": uuid.uuid4().hex}
    signed = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}".encode()
    if private_key is None:
        signature = hmac.new(base64.b64decode(secret), signed, hashlib.sha256).digest()
    else:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec, padding
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        if algorithm == "ES256":
            r, s = decode_dss_signature(private_key.sign(signed, ec.ECDSA(hashes.SHA256())))
            signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
        else:
            signature = private_key.sign(signed, padding.PKCS1v15(), hashes.SHA256())
    return f"{signed.decode()}.{_b64url(signature)}"


def load_private_key(pem: str | bytes, password: bytes | None = None):
    """A private key from PEM text (or a file's path), for ``KeyCredentials``."""
    from cryptography.hazmat.primitives import serialization

    if isinstance(pem, str) and not pem.lstrip().startswith("-----"):
        with open(pem, "rb") as file:
            pem = file.read()
    return serialization.load_pem_private_key(pem.encode() if isinstance(pem, str) else pem, password=password)


class _AssertionCredentials:
    """A device token got by signing an assertion (``POST /devices/{id}/token``), renewed the same
    way once ``renew_at`` of its life has passed, or when the service refuses it."""

    renewable = True
    renews_refused_tokens = True

    def __init__(self, renew_at: float = 0.8, clock: Callable[[], float] = time.monotonic):
        self.renew_at, self._clock = renew_at, clock
        self._token: str | None = None
        self._renew_after = 0.0
        self._lock = threading.Lock()  # follow() may run in a thread beside the device's reports

    def ssl_context(self, default: ssl.SSLContext | None) -> ssl.SSLContext | None:
        return default

    def rest_headers(self, client, renew: bool = False) -> dict:
        return {"Authorization": f"Bearer {self.bearer_token(client, renew)}"}

    def bearer_token(self, client, renew: bool = False) -> str:
        with self._lock:
            if renew or self._token is None or self._clock() >= self._renew_after:
                self._keep(self._new_token(client))
            return self._token

    def _keep(self, answer: dict) -> None:
        self._token = answer["token"]
        self._renew_after = self._clock() + self.renew_at * float(answer["expiresIn"])

    def _new_token(self, client) -> dict:
        raise NotImplementedError


class KeyCredentials(_AssertionCredentials):
    """A key the device registered (``POST /devices/{id}/credentials``, type ``publicKey`` or
    ``certificate``): ``credential_id`` as the service answered it, ``private_key`` the key's
    private half (a ``cryptography`` key, PEM text or a PEM file's path). Needs ``cryptography``
    (the ``keys`` extra)."""

    def __init__(self, credential_id: str, private_key, **options):
        super().__init__(**options)
        self.credential_id = credential_id
        self.private_key = load_private_key(private_key) if isinstance(private_key, (str, bytes)) else private_key

    def assertion(self, device_id: str) -> str:
        return sign_assertion(device_id, self.credential_id, private_key=self.private_key)

    def _new_token(self, client) -> dict:
        return client.exchange_assertion(lambda: self.assertion(client.device_id))


class SecretCredentials(_AssertionCredentials):
    """A secret the service made for the device (``POST /devices/{id}/credentials``, type
    ``secret``; base64, as answered once): assertions are HS256 keyed with its bytes."""

    def __init__(self, credential_id: str, secret: str, **options):
        super().__init__(**options)
        self.credential_id, self._secret = credential_id, secret

    def assertion(self, device_id: str) -> str:
        return sign_assertion(device_id, self.credential_id, secret=self._secret)

    def _new_token(self, client) -> dict:
        return client.exchange_assertion(lambda: self.assertion(client.device_id))


class EnrollmentCredentials(_AssertionCredentials):
    """A device of a group enrollment: the enrollment's id and the device key its factory stored
    (``derive_device_key``). The first token provisions the device (``POST
    /devices/{id}/provision``: created from the enrollment's initial documents, once); with
    ``private_key`` its public key is registered, else the device key as a secret. Every later
    token is signed with that registered credential (``registered``), which the device should
    keep (``credential_id``) though provisioning again answers the same one."""

    def __init__(self, enrollment_id: str, device_key: str, private_key=None, **options):
        super().__init__(**options)
        self.enrollment_id, self._device_key = enrollment_id, device_key
        self.private_key = load_private_key(private_key) if isinstance(private_key, (str, bytes)) else private_key
        self.registered: KeyCredentials | SecretCredentials | None = None
        self.provisioned: dict | None = None  # the provisioning's answer (deviceId, credentialId, ...)

    @property
    def credential_id(self) -> str | None:
        return None if self.registered is None else self.registered.credential_id

    def provision(self, client) -> dict:
        """Provisions the device now (again: 200 and a fresh token, the same credential) and
        keeps the token it answers."""
        with self._lock:
            answer = self._provision(client)
            self._keep(answer)
            return answer

    def _provision(self, client) -> dict:
        public_key = None
        if self.private_key is not None:
            from cryptography.hazmat.primitives import serialization

            public_key = self.private_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        answer = client.provision_with(
            lambda: sign_assertion(client.device_id, self.enrollment_id, secret=self._device_key), public_key)
        credential = answer["credentialId"]
        self.registered = (KeyCredentials(credential, self.private_key) if self.private_key is not None
                           else SecretCredentials(credential, self._device_key))
        self.provisioned = answer
        return answer

    def _new_token(self, client) -> dict:
        if self.registered is None:
            return self._provision(client)
        return client.exchange_assertion(lambda: self.registered.assertion(client.device_id))
