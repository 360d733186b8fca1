"""The credentials registered for a device: one item each in the device's partition
(``sk = "credential#<id>"``) holding what verifies it (a public key, a certificate's key and
thumbprint, or a secret sealed by the caller), and the device's state item's ``credentials``
map, which every request of the device's own must find its credential in
(``item.credentials``). Adding and revoking change both in one transaction; the state item's
part carries a journal entry, so a lost answer settles (applied once, or never)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from ..errors import CredentialExists, CredentialNotFound, DeviceNotFound
from ..item import schema
from ..item.credentials import NO_EXPIRY, expired, registered
from ..model.times import timestamp
from ..runtime import Runtime
from ..write.outcomes import Moved, Refusals
from ..write.pipeline import WritePipeline
from ..write.retry import RetryLoop
from ..write.store import Store

CREDENTIAL_SK_PREFIX = "credential#"
PUBLIC_KEY, CERTIFICATE, SECRET = "publicKey", "certificate", "secret"
KINDS = (PUBLIC_KEY, CERTIFICATE, SECRET)
CREDENTIAL = "credential"  # a credential change's part beside the state item's (``send_together``)
ATTEMPTS, BUDGET_SECONDS = 8, 5.0  # while other changes of the device's credentials land meanwhile
# The credential item's attributes.
_KIND, _PUBLIC_KEY, _THUMBPRINT, _SECRET, _CREATED_AT, _ENROLLMENT = (
    "kind", "publicKey", "thumbprint", "secret", "createdAt", "provisionedBy")


@dataclass(frozen=True)
class CredentialRecord:
    """A registered credential: ``public_key`` (PEM) for a public key or certificate,
    ``thumbprint`` (SHA-256, hex) for a certificate, ``secret`` (sealed bytes) for a secret;
    ``expires_at`` epoch seconds or None; ``enrollment``: the enrollment that provisioned it."""

    credential_id: str
    kind: str
    created_at: str = ""
    public_key: str | None = None
    thumbprint: str | None = None
    secret: bytes | None = None
    expires_at: int | None = None
    enrollment: str | None = None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def item(self, device_id: str) -> dict:
        stored = {**credential_key(device_id, self.credential_id), _KIND: {"S": self.kind},
                  _CREATED_AT: {"S": self.created_at}}
        if self.public_key is not None:
            stored[_PUBLIC_KEY] = {"S": self.public_key}
        if self.thumbprint is not None:
            stored[_THUMBPRINT] = {"S": self.thumbprint}
        if self.secret is not None:
            stored[_SECRET] = {"B": self.secret}
        if self.expires_at is not None:
            stored[schema.TTL_ATTRIBUTE] = {"N": str(self.expires_at)}
        if self.enrollment is not None:
            stored[_ENROLLMENT] = {"S": self.enrollment}
        return stored

    @classmethod
    def from_item(cls, item: dict) -> "CredentialRecord":
        text = lambda name: item[name]["S"] if name in item else None  # noqa: E731
        return cls(item[schema.SORT_KEY]["S"][len(CREDENTIAL_SK_PREFIX):], item[_KIND]["S"], text(_CREATED_AT) or "",
                   text(_PUBLIC_KEY), text(_THUMBPRINT), bytes(item[_SECRET]["B"]) if _SECRET in item else None,
                   int(item[schema.TTL_ATTRIBUTE]["N"]) if schema.TTL_ATTRIBUTE in item else None, text(_ENROLLMENT))


def credential_key(device_id: str, credential_id: str) -> dict:
    return {schema.PARTITION_KEY: {"S": device_id}, schema.SORT_KEY: {"S": CREDENTIAL_SK_PREFIX + credential_id}}


class Credentials:
    def __init__(self, pipeline: WritePipeline, runtime: Runtime):
        self._pipeline = pipeline
        self._store: Store = pipeline.store
        self._runtime = runtime

    def add(self, device_id: str, record: CredentialRecord) -> CredentialRecord:
        """Registers ``record`` for the live device (``created_at`` set now): its item, and its id
        in the state item's map (a certificate also makes registration required for the device
        from now on). ``TooManyCredentials`` past ``MAX_CREDENTIALS``; ``CredentialExists`` when
        the device holds one of that id (a certificate's is its thumbprint's); ``DeviceNotFound``."""
        record = replace(record, created_at=timestamp(self._runtime.clock()))

        def plan(planner, item):
            if not schema.is_live_state(item, planner.now):
                raise DeviceNotFound(device_id)
            if record.credential_id in registered(item) and record.credential_id not in expired(item, planner.now):
                raise CredentialExists(device_id, record.credential_id)  # an expired one is replaced
            expires = record.expires_at if record.expires_at is not None else NO_EXPIRY
            return planner.register_credential(item, record.credential_id, expires, record.kind == CERTIFICATE), \
                {CREDENTIAL: [{"Put": {"TableName": self._store.table_name, "Item": record.item(device_id)}}]}

        self._transact(device_id, plan)
        return record

    def revoke(self, device_id: str, credential_id: str) -> None:
        """Revokes a credential: its id leaves the state item's map (every token of it opens
        nothing from the next request on) and its item goes. ``CredentialNotFound`` when the
        device holds no such credential; ``DeviceNotFound``."""
        def plan(planner, item):
            if not schema.is_live_state(item, planner.now):
                raise DeviceNotFound(device_id)
            if credential_id not in registered(item):
                raise CredentialNotFound(device_id, credential_id)
            return planner.revoke_credential(item, credential_id), {CREDENTIAL: [{"Delete": {
                "TableName": self._store.table_name, "Key": credential_key(device_id, credential_id)}}]}

        self._transact(device_id, plan)

    def listed(self, device_id: str) -> list[CredentialRecord]:
        """The device's registered credentials that have not expired (``DeviceNotFound``): the
        items its state item's map names (items a deleted device left are not its own)."""
        now = self._runtime.clock()
        item = self._store.get_live_state(device_id, now)
        if item is None:
            raise DeviceNotFound(device_id)
        held = registered(item)
        found = self._store.query_all({
            "KeyConditionExpression": "#p = :p AND begins_with(#s, :s)", "ConsistentRead": True,
            "ExpressionAttributeNames": {"#p": schema.PARTITION_KEY, "#s": schema.SORT_KEY},
            "ExpressionAttributeValues": {":p": {"S": device_id}, ":s": {"S": CREDENTIAL_SK_PREFIX}}})
        records = [CredentialRecord.from_item(entry) for entry in found]
        return [record for record in records if record.credential_id in held and not record.expired(now)]

    def of(self, device_id: str, credential_id: str) -> tuple[CredentialRecord | None, dict | None]:
        """The credential's record and the device's state item, in one read of both (either
        None when absent): what an assertion is verified with."""
        state, credential = self._store.get_state_with(device_id, credential_key(device_id, credential_id))
        return (CredentialRecord.from_item(credential) if credential else None), state

    def _transact(self, device_id: str, plan) -> None:
        """``plan(planner, item)`` -> (the state item's change, the other parts), sent in one
        transaction from a fresh read, again while the device's credentials moved meanwhile."""
        def attempt(item, _number):
            planner = self._pipeline.planner()
            planned, others = plan(planner, item)
            try:
                self._pipeline.send_together(planner, [planned], others, uuid.uuid4().hex)
            except Refusals as refused:
                if refused.refusal is not None:
                    raise refused.refusal from None
                raise Moved(None, "conflict") from None

        RetryLoop(ATTEMPTS, BUDGET_SECONDS, self._runtime).run(
            device_id, attempt, lambda: self._store.get_state(device_id), count_success=False)
