"""Signing device tokens (ES256): a ``Signer`` signs the JWS signing input and returns the
JOSE signature (r || s, 64 bytes). Deployed, ``KmsSigner``: an asymmetric KMS key
(ECC_NIST_P256, ECDSA_SHA_256) whose private key never leaves KMS. Locally, ``KeyFileSigner``:
an EC P-256 key in a PEM file (``make serve``'s issuer key under ``.serve/issuer/``).

KMS's refusals become two typed errors the API answers with ``Retry-After``:
``SigningThrottled`` (429: KMS's request quota, e.g. a whole fleet reconnecting at once) and
``SigningUnavailable`` (503: KMS failing, slow or unreachable, or the key unusable)."""

from __future__ import annotations

import random
from typing import Protocol

ALGORITHM = "ES256"
COORDINATE_BYTES = 32  # P-256
KMS_SIGNING_ALGORITHM = "ECDSA_SHA_256"
# KMS error codes that say "try again later" rather than "this key or call is wrong".
KMS_THROTTLED = {"ThrottlingException", "LimitExceededException"}
THROTTLED_RETRY_SECONDS = (1, 10)  # spread retries of a fleet over this many seconds
UNAVAILABLE_RETRY_SECONDS = 2
# The operating system's entropy: SnapStart copies of one snapshot would draw the same numbers
# from a seeded generator, and send a whole fleet back at the same second.
_JITTER = random.SystemRandom()


def throttled_retry_seconds() -> int:
    """How long a caller throttled by KMS waits: spread over ``THROTTLED_RETRY_SECONDS``."""
    return _JITTER.randint(*THROTTLED_RETRY_SECONDS)


class SigningFailed(Exception):
    """The token could not be signed now; ``retry_after``: whole seconds to wait."""

    def __init__(self, detail: str, retry_after: int):
        super().__init__(detail)
        self.retry_after = retry_after


class SigningThrottled(SigningFailed):
    pass


class SigningUnavailable(SigningFailed):
    pass


class Signer(Protocol):
    kid: str

    def sign(self, message: bytes) -> bytes:
        """The JOSE ES256 signature of ``message`` (r || s)."""


def der_to_jose(der: bytes) -> bytes:
    """An ECDSA signature in DER (what KMS returns) as JOSE wants it: r and s, 32 bytes each."""
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    r, s = decode_dss_signature(der)
    return r.to_bytes(COORDINATE_BYTES, "big") + s.to_bytes(COORDINATE_BYTES, "big")


class KeyFileSigner:
    """An EC P-256 private key in a PEM file; ``kid`` names its public key in the JWKS."""

    def __init__(self, private_key, kid: str):
        self.private_key, self.kid = private_key, kid

    @classmethod
    def from_file(cls, path: str, kid: str) -> "KeyFileSigner":
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        with open(path, "rb") as file:
            key = serialization.load_pem_private_key(file.read(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
            raise ValueError(f"{path} holds no EC P-256 private key")
        return cls(key, kid)

    def sign(self, message: bytes) -> bytes:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return der_to_jose(self.private_key.sign(message, ec.ECDSA(hashes.SHA256())))


class KmsSigner:
    """``kms:Sign`` with an asymmetric key; ``client``: a boto3 KMS client (made lazily by the caller)."""

    def __init__(self, key_id: str, client, kid: str | None = None):
        self.key_id, self.client = key_id, client
        self.kid = kid or key_id.rsplit("/", 1)[-1]  # a key ARN's last part is the key id

    def sign(self, message: bytes) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer = self.client.sign(KeyId=self.key_id, Message=message, MessageType="RAW",
                                      SigningAlgorithm=KMS_SIGNING_ALGORITHM)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in KMS_THROTTLED:
                raise SigningThrottled("too many tokens are being signed at once; retry after Retry-After",
                                       throttled_retry_seconds()) from error
            raise SigningUnavailable(f"the signing key is unavailable ({code}); retry after Retry-After",
                                     UNAVAILABLE_RETRY_SECONDS) from error
        except BotoCoreError as error:  # timeouts, connection failures
            raise SigningUnavailable("the signing service did not answer; retry after Retry-After",
                                     UNAVAILABLE_RETRY_SECONDS) from error
        return der_to_jose(answer["Signature"])
