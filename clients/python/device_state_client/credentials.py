"""How a device proves who it is: a bearer token, or a client certificate that is its whole
credential on the REST API (mutual TLS) and is exchanged for a token for the WebSocket API,
which takes tokens only."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from typing import Callable


class TokenCredentials:
    """A bearer token, or a callable that returns a valid one whenever it is called (it is
    called for every request and connection, so it should cache)."""

    def __init__(self, token: str | Callable[[], str]):
        self._source = token

    @property
    def renewable(self) -> bool:
        return callable(self._source)

    def ssl_context(self, default: ssl.SSLContext | None) -> ssl.SSLContext | None:
        return default

    def rest_headers(self, client) -> dict:
        return {"Authorization": f"Bearer {self.bearer_token(client)}"}

    def bearer_token(self, client, renew: bool = False) -> str:
        return self._source() if callable(self._source) else self._source


class CertificateCredentials:
    """A device's client certificate (PEM files). REST requests go over mutual TLS with it and
    no token (the service refuses a certificate and a token together); the WebSocket gets a
    token from ``POST /devices/{id}/token``, renewed once ``renew_at`` of its life has passed."""

    renewable = True

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

    def rest_headers(self, client) -> dict:
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
