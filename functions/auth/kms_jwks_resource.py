"""The custom resource that reads the device-token key's public key at deploy time
(infra/device_tokens.py): on Create and Update it calls ``kms:GetPublicKey`` and returns the
key as a compact JWKS (the attribute ``Jwks``), which the stack gives the authorizer, the API
and the push functions as DEVICE_TOKEN_JWKS. So no function calls KMS to verify a token, and
a fleet reconnecting at once spends none of KMS's quota on verification. The stack deploys
this file inline, without the functions' asset: the standard library and the runtime's boto3."""

import base64
import json

# DER SubjectPublicKeyInfo of an EC P-256 key, up to its uncompressed point (0x04 || x || y).
P256_SPKI_PREFIX = bytes.fromhex("3059301306072a8648ce3d020106082a8648ce3d030107034200")
POINT_BYTES = 65


def _base64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwks(der: bytes, kid: str) -> str:
    """The JWKS of a P-256 public key in DER (what kms:GetPublicKey returns), compact."""
    point = der[len(P256_SPKI_PREFIX):]
    if not der.startswith(P256_SPKI_PREFIX) or len(point) != POINT_BYTES or point[0] != 4:
        raise ValueError("not an uncompressed EC P-256 public key (the key must be ECC_NIST_P256)")
    key = {"kty": "EC", "crv": "P-256", "x": _base64url(point[1:33]), "y": _base64url(point[33:]), "kid": kid,
           "use": "sig", "alg": "ES256"}
    return json.dumps({"keys": [key]}, separators=(",", ":"), sort_keys=True)


def on_event(event, _context, client=None):
    if event["RequestType"] == "Delete":
        return {"PhysicalResourceId": event["PhysicalResourceId"]}
    key_arn = event["ResourceProperties"]["KeyArn"]
    if client is None:
        import boto3

        client = boto3.client("kms")
    answer = client.get_public_key(KeyId=key_arn)
    if answer.get("KeySpec") != "ECC_NIST_P256" or "ECDSA_SHA_256" not in answer.get("SigningAlgorithms", []):
        raise ValueError(f"{key_arn} is not an ECC_NIST_P256 key that signs with ECDSA_SHA_256")
    # The kid is the key id, the ARN's last part, as functions/auth/signers.KmsSigner names it.
    return {"PhysicalResourceId": key_arn, "Data": {"Jwks": jwks(answer["PublicKey"], key_arn.rsplit("/", 1)[-1])}}
