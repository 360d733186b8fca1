"""The custom resource that resolves the issuer's JWKS at deploy time (infra/auth.py): on
Create and Update it GETs ``<Issuer>/.well-known/jwks.json`` and returns the document,
compact, as the attribute ``Jwks``, which the stack gives both functions as AUTH_JWKS.
Nothing fetches keys at request time. Standard library only: the stack deploys this
file inline, without the functions' asset."""

import json
import time
import urllib.request

ATTEMPTS = 5  # a user pool created a moment ago may not serve its keys yet
TIMEOUT_SECONDS = 10
# Lambda holds 4 KB of a function's environment in all; a JWKS larger than this would not fit
# beside the rest of the API function's (ten fields declared, a device domain: about 2 KB;
# tests/infra/test_auth_stack.py). Three RSA-2048 keys fit (43-character key ids), or two of 4096 bits.
MAX_BYTES = 1792


def jwks_url(issuer: str) -> str:
    return issuer.rstrip("/") + "/.well-known/jwks.json"


def compact(document) -> str:
    keys = document.get("keys") if isinstance(document, dict) else None
    if not keys:
        raise ValueError("not a JWKS document (no keys)")
    text = json.dumps({"keys": keys}, separators=(",", ":"), sort_keys=True)
    if len(text) > MAX_BYTES:
        raise ValueError(f"the JWKS is {len(text)} bytes, more than the {MAX_BYTES} a Lambda environment can hold")
    return text


def fetch(url: str, opener=None, sleep=time.sleep) -> str:
    opener = opener or urllib.request.urlopen
    for attempt in range(ATTEMPTS):
        try:
            with opener(url, timeout=TIMEOUT_SECONDS) as response:
                return compact(json.load(response))
        except (OSError, ValueError) as error:  # URLError and HTTPError are OSErrors
            if attempt == ATTEMPTS - 1:
                raise RuntimeError(f"no usable JWKS at {url}: {error}") from None
            sleep(2 ** attempt)


def on_event(event, _context):
    if event["RequestType"] == "Delete":
        return {"PhysicalResourceId": event["PhysicalResourceId"]}
    url = jwks_url(event["ResourceProperties"]["Issuer"])
    return {"PhysicalResourceId": url, "Data": {"Jwks": fetch(url)}}
