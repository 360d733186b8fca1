"""The benchmarks' own token issuer: the dev servers they start trust it, and their
requests carry its token (as a deployed back-end's would carry Cognito's)."""

from __future__ import annotations

import secrets

from localdev.issuer import Issuer

ISSUER = Issuer.generate()
TOKEN = ISSUER.token(lifetime=12 * 3600)
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


CURSOR_KEY = secrets.token_hex(32)


def server_environment() -> dict[str, str]:
    """The AUTH_* variables for a dev server that accepts the benchmarks' token, and the key
    its listings' cursors are sealed with."""
    return {**ISSUER.environment(), "CURSOR_KEY": CURSOR_KEY}
