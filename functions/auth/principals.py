"""The caller of one request: a back-end with scopes, or one device."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# The scopes a back-end token may carry (a Cognito resource server's scopes arrive as
# "<resource server>/<name>"; both spellings mean the same).
READ_SCOPE = "devices.read"
WRITE_SCOPE = "devices.write"
REPORT_SCOPE = "devices.report"
SCOPES = (READ_SCOPE, WRITE_SCOPE, REPORT_SCOPE)
RESOURCE_SERVER = "device-state"

DEVICE = "device"
CLIENT = "client"


@dataclass(frozen=True)
class Principal:
    """``kind`` is DEVICE (its rights are those of ``device_id`` over itself) or CLIENT
    (its rights are its ``scopes``); ``subject`` names it for logs and idempotency keys."""

    kind: str
    subject: str
    scopes: frozenset = frozenset()
    device_id: str | None = None
    expires_at: int | None = None  # the credential's own expiry (a token's exp), if it has one
    auth_time: int | None = None  # a device's: when it last proved itself (see functions/auth/device_tokens.py)

    def expired(self, now: float, leeway: float) -> bool:
        return self.expires_at is not None and now > self.expires_at + leeway

    @classmethod
    def device(cls, device_id: str, expires_at: int | None = None, auth_time: int | None = None) -> "Principal":
        return cls(DEVICE, f"{DEVICE}:{device_id}", frozenset(), device_id, expires_at, auth_time)

    @classmethod
    def client(cls, subject: str, scopes, expires_at: int | None = None) -> "Principal":
        return cls(CLIENT, f"client:{subject}", frozenset(scopes), None, expires_at)

    @property
    def digest(self) -> str:
        """A short stable name (16 hex digits) for scoping what one caller stores."""
        return hashlib.sha256(self.subject.encode()).hexdigest()[:16]

    def as_context(self) -> dict[str, str]:
        """The authorizer context API Gateway passes on to the handler (strings only)."""
        return {"principalKind": self.kind, "subject": self.subject, "scopes": " ".join(sorted(self.scopes)),
                "deviceId": self.device_id or "", "expiresAt": str(self.expires_at or ""),
                "authTime": str(self.auth_time or "")}

    @classmethod
    def from_context(cls, context: dict) -> "Principal | None":
        """The principal an authorizer put in the request context, or None if there is none."""
        kind = context.get("principalKind")
        expires = str(context.get("expiresAt") or "")
        expires_at = int(expires) if expires.isdigit() else None
        authenticated = str(context.get("authTime") or "")
        if kind == DEVICE and context.get("deviceId"):
            return cls.device(context["deviceId"], expires_at, int(authenticated) if authenticated.isdigit() else None)
        if kind == CLIENT and str(context.get("subject", "")).startswith(f"{CLIENT}:"):
            return cls(CLIENT, context["subject"], frozenset(str(context.get("scopes") or "").split()), None,
                       expires_at)
        return None


def device_of(subject: str) -> str | None:
    """The device a principal's ``subject`` names, or None for a back-end's."""
    kind, _, name = subject.partition(":")
    return name if kind == DEVICE and name else None


def scopes_of(raw) -> frozenset:
    """The known scopes in a ``scope`` claim (space-separated); unknown ones are ignored."""
    if not isinstance(raw, str):
        return frozenset()
    names = {name.removeprefix(f"{RESOURCE_SERVER}/") for name in raw.split()}
    return frozenset(names.intersection(SCOPES))
