"""Sealing the secrets the service keeps: a device's registered secret and an enrollment's group
key are stored only sealed, and opened only to verify an assertion. A ``Sealer`` seals bytes
under an encryption context (what the bytes belong to: the same context opens them, no other),
as ``signers`` signs device tokens. Deployed, ``KmsSealer``: a symmetric KMS key
(``SEALING_KMS_KEY``; Encrypt and Decrypt, the context as KMS's encryption context, which
CloudTrail logs beside every Decrypt). Locally, ``KeyFileSealer``: AES-256-GCM under a 32-byte
key in a file (``SEALING_KEY_FILE``; ``make serve`` makes ``.serve/sealing-key``), the context as
its associated data.

Sealed bytes, an opened secret and a context's values never go into a log line or an error:
the errors say only what failed. KMS's refusals become ``SealingThrottled`` (429) and
``SealingUnavailable`` (503), answered with ``Retry-After`` as a throttled signing is."""

from __future__ import annotations

import functools
import json
import os
import secrets
from typing import Protocol

from .credentials import AuthConfigError
from .signers import KMS_THROTTLED, UNAVAILABLE_RETRY_SECONDS, throttled_retry_seconds

SEALING_KMS_KEY = "SEALING_KMS_KEY"  # the KMS key's ARN (deployed)
SEALING_KEY_FILE = "SEALING_KEY_FILE"  # a file of 32 random bytes (locally)
VARIABLES = (SEALING_KMS_KEY, SEALING_KEY_FILE)
KEY_BYTES = 32
NONCE_BYTES = 12
_FORMAT = b"\x01"  # the first byte of what KeyFileSealer seals: its format, so a later one can be told apart
SERVICE = "device-state"  # every context names the service (the key policy's condition, infra/identity.py)


class SealingFailed(Exception):
    """A secret could not be sealed or opened now; ``retry_after``: whole seconds to wait."""

    def __init__(self, detail: str, retry_after: int):
        super().__init__(detail)
        self.retry_after = retry_after


class SealingThrottled(SealingFailed):
    pass


class SealingUnavailable(SealingFailed):
    pass


class Sealer(Protocol):
    def seal(self, plaintext: bytes, context: dict[str, str]) -> bytes:
        """``plaintext`` sealed: only ``open`` with the same ``context`` gives it back."""

    def open(self, sealed: bytes, context: dict[str, str]) -> bytes:
        """What ``seal`` sealed under ``context``; ``SealingUnavailable`` for anything else."""


def secret_context(device_id: str, credential_id: str) -> dict[str, str]:
    """What a device's registered secret is sealed under."""
    return {"service": SERVICE, "purpose": "device-secret", "deviceId": device_id, "credentialId": credential_id}


def group_key_context(enrollment_id: str) -> dict[str, str]:
    """What an enrollment's group key is sealed under."""
    return {"service": SERVICE, "purpose": "enrollment-group-key", "enrollmentId": enrollment_id}


def _associated_data(context: dict[str, str]) -> bytes:
    return json.dumps(context, sort_keys=True, separators=(",", ":")).encode()


class KeyFileSealer:
    """AES-256-GCM under a key of this process's (read from a file)."""

    def __init__(self, key: bytes):
        if len(key) != KEY_BYTES:
            raise ValueError(f"a sealing key is {KEY_BYTES} bytes")
        self._key = key

    @classmethod
    def from_file(cls, path: str) -> "KeyFileSealer":
        with open(path, "rb") as file:
            key = file.read()
        if len(key) != KEY_BYTES:
            raise ValueError(f"{path} holds {len(key)} bytes, not the {KEY_BYTES} random bytes of a sealing key")
        return cls(key)

    def seal(self, plaintext: bytes, context: dict[str, str]) -> bytes:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        nonce = secrets.token_bytes(NONCE_BYTES)
        return _FORMAT + nonce + AESGCM(self._key).encrypt(nonce, plaintext, _associated_data(context))

    def open(self, sealed: bytes, context: dict[str, str]) -> bytes:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if not sealed.startswith(_FORMAT) or len(sealed) < 1 + NONCE_BYTES + 16:
            raise SealingUnavailable("a sealed secret is not in this key's format", UNAVAILABLE_RETRY_SECONDS)
        nonce, body = sealed[1:1 + NONCE_BYTES], sealed[1 + NONCE_BYTES:]
        try:
            return AESGCM(self._key).decrypt(nonce, body, _associated_data(context))
        except InvalidTag:
            raise SealingUnavailable("a sealed secret cannot be opened with this key", UNAVAILABLE_RETRY_SECONDS) \
                from None


class KmsSealer:
    """``kms:Encrypt`` and ``kms:Decrypt`` with a symmetric key; ``client``: a boto3 KMS client."""

    def __init__(self, key_id: str, client):
        self.key_id, self.client = key_id, client

    def seal(self, plaintext: bytes, context: dict[str, str]) -> bytes:
        return self._call(lambda: self.client.encrypt(KeyId=self.key_id, Plaintext=plaintext,
                                                      EncryptionContext=context))["CiphertextBlob"]

    def open(self, sealed: bytes, context: dict[str, str]) -> bytes:
        return self._call(lambda: self.client.decrypt(KeyId=self.key_id, CiphertextBlob=sealed,
                                                      EncryptionContext=context))["Plaintext"]

    @staticmethod
    def _call(request):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return request()
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in KMS_THROTTLED:
                raise SealingThrottled("too many secrets are being opened at once; retry after Retry-After",
                                       throttled_retry_seconds()) from None
            raise SealingUnavailable(f"the sealing key is unavailable ({code}); retry after Retry-After",
                                     UNAVAILABLE_RETRY_SECONDS) from None
        except BotoCoreError:  # timeouts, connection failures
            raise SealingUnavailable("the sealing service did not answer; retry after Retry-After",
                                     UNAVAILABLE_RETRY_SECONDS) from None


def sealer_from_environment(environ=os.environ, kms_client_factory=None) -> Sealer:
    """The sealer ``SEALING_KMS_KEY`` or ``SEALING_KEY_FILE`` names (exactly one of them)."""
    kms_key = environ.get(SEALING_KMS_KEY, "").strip()
    key_file = environ.get(SEALING_KEY_FILE, "").strip()
    if bool(kms_key) == bool(key_file):
        raise AuthConfigError(f"sealing secrets needs exactly one of {SEALING_KMS_KEY} and {SEALING_KEY_FILE}")
    if key_file:
        try:
            return KeyFileSealer.from_file(key_file)
        except (OSError, ValueError) as error:
            raise AuthConfigError(f"{SEALING_KEY_FILE}: {error}") from None
    from .device_tokens import kms_client

    return KmsSealer(kms_key, (kms_client_factory or kms_client)())


@functools.lru_cache(maxsize=1)
def sealer() -> Sealer:
    """The sealer from the environment, made once per container."""
    return sealer_from_environment()
