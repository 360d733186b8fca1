"""The test suite's token issuer: a key pair minted per test process, whose AUTH_*
variables tests/conftest.py exports, so the in-process handler and every server a test
starts accept its tokens. ``bearer()`` is the one place tests get credentials from."""

from __future__ import annotations

from functions.auth.principals import SCOPES
from localdev.issuer import Issuer

ISSUER = Issuer.generate()
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
