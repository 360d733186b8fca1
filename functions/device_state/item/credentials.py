"""A device's credentials as its state item records them, and the rule every request of the
device's own follows: it opens the device only while the credential it comes with is there.

The item holds ``schema.CREDENTIALS``, a map of each registered, unrevoked credential's id to its
expiry (epoch seconds; 0: none), ``schema.CERTIFICATE_REQUIRED`` once the device has registered a
certificate, and ``schema.ENROLLMENT``, the mark of the enrollment that provisioned it. Every
write of the item is billed by its size, so these are as short as the check needs: names of one
letter, ids of 8 characters (40 bits: an id names a credential among a device's few, and no
request can choose it), a mark in place of the enrollment's id: 14 bytes for a device's first
key or secret, 10 for each further one, which leave the reference device's report at 1 write
unit (docs/costs.md); a certificate's entry about 5 more (``certificate_entry``).

A device token names the credential it was issued for; a client certificate names its own id
(``certificate_id``, derived from its SHA-256 thumbprint, so no read finds it). A request
holding a credential (``Holder``) opens the device when:

- the item's map holds the credential's id, unexpired; or
- it is a certificate of the trusted CA the device never registered, while the device has
  registered no certificate at all and the service does not require registration.

Reads judge the item they read (``admits``); writes carry the same rule in their condition
(``condition``), so revoking a credential (its id leaves the map) shuts out the next request
of every token issued for it, at no cost per request. All pure."""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from decimal import Decimal

from ..errors import CredentialRevoked, DeviceNotFound
from ..write.expressions import Expression
from . import schema

MAX_CREDENTIALS = 5  # registered per device: a key rotates by adding the new one, then revoking the old
ID_BYTES = 5
ID_CHARS = ID_BYTES * 8 // 5
CREDENTIAL_ID_PATTERN = re.compile(f"[a-z2-7]{{{ID_CHARS}}}")  # base32, lower case
NO_EXPIRY = 0


def _id(raw: bytes) -> str:
    return base64.b32encode(raw[:ID_BYTES]).decode().lower()


def new_credential_id() -> str:
    """A random credential id."""
    return _id(secrets.token_bytes(ID_BYTES))


def certificate_id(thumbprint: bytes) -> str:
    """The credential id of a certificate, from its SHA-256 thumbprint, so a request over mutual
    TLS names it without a read. Another certificate opens a device that registered this one only
    if the trusted CA issued it naming the device and its id is the same: one in 2^40."""
    return _id(hashlib.sha256(b"device-state certificate\n" + thumbprint).digest())


# A certificate's entry is its registration's own: its id, from the thumbprint, is the same at
# every registration, so the entry is its expiry plus a random fraction of a second or, without
# one, a random second at or past CERTIFICATE_NEVER (the year 2096). A device token carries the
# entry it was issued on (``Holder.registration``), so a certificate registered again, on the
# device or on one created again under its id, opens none of the tokens issued before.
CERTIFICATE_NEVER = 4_000_000_000


# What a token issued for a certificate the device never registered names as its entry: no
# registration writes it, so once the certificate is registered (the device then requires
# registered certificates) the token opens nothing, whatever became of the registration.
UNREGISTERED_CERTIFICATE = "1"


def token_entry(item: dict | None, credential_id: str | None, certificate: bool) -> str | None:
    """The entry a device token issued now for ``credential_id`` names (``Holder.registration``):
    the item's; for a certificate it holds none, ``UNREGISTERED_CERTIFICATE``; None for a token
    that names no credential."""
    if credential_id is None:
        return None
    entry = entries(item).get(credential_id)
    return UNREGISTERED_CERTIFICATE if entry is None and certificate else entry


def certificate_entry(expires: int) -> str:
    """A certificate's entry (as stored) for a registration expiring at ``expires``."""
    if expires == NO_EXPIRY:
        return str(CERTIFICATE_NEVER + secrets.randbelow(10 ** 9))
    return f"{expires}.{secrets.randbelow(10 ** 6 - 1) + 1:06d}"


def entries(item: dict | None) -> dict[str, str]:
    """The item's credentials as stored: id -> its entry (a number's text)."""
    value = (item or {}).get(schema.CREDENTIALS)
    return {name: entry["N"] for name, entry in value["M"].items()} if value and "M" in value else {}


def _expiry(entry: str) -> int:
    number = Decimal(entry)
    return NO_EXPIRY if number == 0 or number >= CERTIFICATE_NEVER else int(number)


def registered(item: dict | None) -> dict[str, int]:
    """The item's credentials: id -> expiry (epoch seconds, ``NO_EXPIRY`` for none)."""
    return {name: _expiry(entry) for name, entry in entries(item).items()}


def expired(item: dict | None, now: float) -> list[str]:
    """The ids of the item's credentials whose expiry has passed: they open nothing, and a
    registration takes them off the item, so they hold no place among ``MAX_CREDENTIALS``."""
    return [name for name, expiry in registered(item).items() if expiry != NO_EXPIRY and expiry <= now]


def requires_certificate(item: dict | None) -> bool:
    return schema.CERTIFICATE_REQUIRED in (item or {})


@dataclass(frozen=True)
class Holder:
    """The credential a device's own request comes with: ``credential_id`` (a token's, or a
    certificate's ``certificate_id``); ``certificate``: it is a certificate of the trusted CA,
    which opens a device that registered none unless ``required`` (the service requires every
    device to register its credentials)."""

    credential_id: str
    certificate: bool = False
    required: bool = False
    # the entry a device token was issued on (None: any, as before tokens named it); a certificate's
    # token issued on one opens no device by the CA's rule: its registration, not the CA, let it in
    registration: str | None = None

    @property
    def by_the_cas_rule(self) -> bool:
        """Whether it may open a device that registered no certificate (the trusted CA's rule)."""
        return self.certificate and not self.required and self.registration in (None, UNREGISTERED_CERTIFICATE)

    def admits(self, item: dict | None, now: float) -> bool:
        """Whether the request may act on this state item as it is."""
        entry = entries(item).get(self.credential_id)
        if entry is not None:
            number = Decimal(entry)
            if self.registration is not None and number != Decimal(self.registration):
                return False  # registered again since the token was issued
            return number == NO_EXPIRY or number > now
        return self.by_the_cas_rule and not requires_certificate(item)

    def check(self, device_id: str, item: dict | None, now: float) -> None:
        """For a request of the device's own on the state ``item`` it read: ``DeviceNotFound``
        unless the item is live, ``CredentialRevoked`` unless it admits the request."""
        if not schema.is_live_state(item, now):
            raise DeviceNotFound(device_id)
        if not self.admits(item, now):
            raise CredentialRevoked(device_id)

    def condition(self, expr: Expression, now: float) -> str:
        """``admits`` as a condition of a write on the item, its placeholders from ``expr``."""
        entry = f"{expr.name(schema.CREDENTIALS)}.{expr.name(self.credential_id)}"
        held = (f"(attribute_exists({entry}) AND ({entry} = {expr.number(NO_EXPIRY)} OR "
                f"{entry} > {expr.number(int(now))}))")
        if self.registration is not None:
            held = f"({held} AND {entry} = {expr.value({'N': self.registration})})"
        if not self.by_the_cas_rule:
            return held
        return f"({held} OR attribute_not_exists({expr.name(schema.CERTIFICATE_REQUIRED)}))"


@dataclass(frozen=True)
class ProvisionedIdentity:
    """What a device an enrollment provisions holds from its first version: the enrollment's
    mark and its first credential."""

    enrollment_id: str
    credential_id: str
    expires: int = NO_EXPIRY

    def credentials(self) -> dict:
        """The item's credentials map, as stored."""
        return {"M": {self.credential_id: {"N": str(self.expires)}}}

    def enrollment(self) -> dict:
        """The item's enrollment mark, as stored."""
        return {"S": enrollment_mark(self.enrollment_id)}


def provisioned_by(item: dict | None, enrollment_id: str) -> bool:
    """Whether the enrollment ``enrollment_id`` provisioned the device of this state item."""
    return schema.StateItem.of(item).text(schema.ENROLLMENT) == enrollment_mark(enrollment_id)


def enrollment_mark(enrollment_id: str) -> str:
    """What the item keeps of the enrollment that provisioned it: enough to tell it from another
    (the enrollment's id is up to 64 characters, the mark 8)."""
    return _id(hashlib.sha256(f"device-state enrollment\n{enrollment_id}".encode()).digest())


def provisioned_credential_id(enrollment_id: str, device_id: str, created_at: str) -> str:
    """The id of the credential an enrollment provisions a device with, the device created at
    ``created_at`` (its ``createdAt``): the same every time that device is provisioned again, so
    provisioning again finds it on the item, and another for a device created again under the id,
    so no token of the one deleted names it."""
    return _id(hashlib.sha256(f"device-state provisioned\n{enrollment_id}\n{device_id}\n{created_at}".encode())
               .digest())


def earlier_provisioned_credential_id(enrollment_id: str, device_id: str) -> str:
    """The id provisioning gave a device before ids were derived from its ``createdAt``: a device
    provisioned then still holds it, and provisioning it again answers with it; no device created
    since is given it."""
    return _id(hashlib.sha256(f"device-state provisioned\n{enrollment_id}\n{device_id}".encode()).digest())
