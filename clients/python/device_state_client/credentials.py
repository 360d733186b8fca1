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
        if not output or any(character.isspace() for character in output):
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
