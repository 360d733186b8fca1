"""The caller of one request: a back-end with scopes, or one device."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from functions.device_state import Holder

# The scopes a back-end token may carry (a Cognito resource server's scopes arrive as
# "<resource server>/<name>"; both spellings mean the same).
READ_SCOPE = "devices.read"
WRITE_SCOPE = "devices.write"
REPORT_SCOPE = "devices.report"
ADMIN_SCOPE = "devices.admin"  # manages devices' credentials and the enrollments devices provision themselves by
SCOPES = (READ_SCOPE, WRITE_SCOPE, REPORT_SCOPE, ADMIN_SCOPE)
DEFAULT_SCOPES = (READ_SCOPE, WRITE_SCOPE, REPORT_SCOPE)  # what a token is given when none are named
RESOURCE_SERVER = "device-state"

DEVICE = "device"
CLIENT = "client"


@dataclass(frozen=True)
class Principal:
    """``kind`` is DEVICE (its rights are those of ``device_id`` over itself) or CLIENT
    (its rights are its ``scopes``); ``subject`` names it for logs and idempotency keys.
    A device's ``credential_id`` names the registered credential (or the certificate) it proved
    itself with, which every request of its own must still find on its device (``holder``);
    ``certificate``: that credential is a client certificate of the trusted CA. A device token
    of ``AUTH_ISSUER`` (the operator's own issuer) names none."""

    kind: str
    subject: str
    scopes: frozenset = frozenset()
    device_id: str | None = None
    expires_at: int | None = None  # the credential's own expiry (a token's exp), if it has one
    auth_time: int | None = None  # a device's: when it last proved itself (see functions/auth/device_tokens.py)
    credential_id: str | None = None
    certificate: bool = False
    credential_expires_at: int | None = None  # when the credential it names expires, if it does
    credential_registration: str | None = None  # the credential's entry its token was issued on (Holder)

    def expired(self, now: float, leeway: float) -> bool:
        """Past its token's exp (with ``leeway`` for clocks), or at its credential's own end
        (``credential_expires_at``, the token's cexp: no leeway, as docs/api/feed-and-push.md says)."""
        return ((self.expires_at is not None and now > self.expires_at + leeway)
                or (self.credential_expires_at is not None and now >= self.credential_expires_at))

    @classmethod
    def device(cls, device_id: str, expires_at: int | None = None, auth_time: int | None = None,
               credential_id: str | None = None, certificate: bool = False,
               credential_expires_at: int | None = None, credential_registration: str | None = None) -> "Principal":
        return cls(DEVICE, f"{DEVICE}:{device_id}", frozenset(), device_id, expires_at, auth_time, credential_id,
                   certificate, credential_expires_at, credential_registration)

    def holder(self, required: bool = False) -> Holder | None:
        """The credential this device's requests come with, as its state item must hold it
        (``required``: the service requires every device to register its certificates,
        ``REQUIRE_REGISTERED_CREDENTIALS``); None for a back-end, or a device naming none."""
        if self.kind != DEVICE or self.credential_id is None:
            return None
        return Holder(self.credential_id, certificate=self.certificate, required=required,
                      registration=self.credential_registration)

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
                "authTime": str(self.auth_time or ""), "credentialId": self.credential_id or "",
                "certificate": "true" if self.certificate else "",
                "credentialExpiresAt": str(self.credential_expires_at or ""),
                "credentialRegistration": self.credential_registration or ""}

    @classmethod
    def from_context(cls, context: dict) -> "Principal | None":
        """The principal an authorizer put in the request context, or None if there is none."""
        kind = context.get("principalKind")
        expires = str(context.get("expiresAt") or "")
        expires_at = int(expires) if expires.isdigit() else None
        authenticated = str(context.get("authTime") or "")
        credential_expires = str(context.get("credentialExpiresAt") or "")
        if kind == DEVICE and context.get("deviceId"):
            return cls.device(context["deviceId"], expires_at, int(authenticated) if authenticated.isdigit() else None,
                              str(context.get("credentialId") or "") or None, context.get("certificate") == "true",
                              int(credential_expires) if credential_expires.isdigit() else None,
                              str(context.get("credentialRegistration") or "") or None)
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
