"""Cursors: where a listing's next page starts, sealed with a key only the service holds.

A cursor is ``<body>.<mac>``, both base64url without padding: the body is the position as
JSON, compressed (a scan's last key, or a fleet query's scan and per-shard positions), the mac the first
16 bytes of an HMAC-SHA256 of the body under the key, bound to the listing that issued it
(its *scope*: the plain listing, or a fleet query's filter and sort). A cursor is taken back
as it was issued, by the listing that issued it, for as long as the key stays the same; any
other string (one changed anywhere, another listing's, one issued under an earlier key, one a
reader wrote) is refused before its body is read, so a position is always one this service
reached itself. The page size is no part of a cursor: a walk may change ``limit`` between pages.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import zlib

from ..errors import InvalidCursor

MIN_KEY_BYTES = 32
MAX_BODY_CHARS = 8192  # base64url of a position; a fleet query's longest stays under it
# A position holds stored strings (a fleet query's index values), which JSON escapes up to six
# times their bytes (control characters): 16 shards of 100 control characters made a cursor of
# 15,292 characters, and the page that needed it failed. Compressed, a position takes about what
# it says, whatever its strings hold; the mark (no JSON text starts with it) tells it apart.
_COMPRESSED = b"\x00"
_MAC_BYTES = 16
_MAC_CHARS = 22  # base64url of 16 bytes, unpadded
CURSOR_PATTERN = re.compile(f"[A-Za-z0-9_-]{{1,{MAX_BODY_CHARS}}}\\.[A-Za-z0-9_-]{{{_MAC_CHARS}}}")
CURSOR_REFUSED = ("cursor is not one this listing issued: cursors belong to one filter and sort (the plain listing "
                  "has none) and to the service's current cursor key; start the listing again without a cursor")


class CursorSeal:
    """Seals and opens the cursors of one service (one key). Without a key, a random one of
    this object's own: its cursors are good only with it (a script's, a test's)."""

    def __init__(self, key: bytes | None = None):
        if key is None:
            key = secrets.token_bytes(MIN_KEY_BYTES)
        if not isinstance(key, bytes) or len(key) < MIN_KEY_BYTES:
            raise ValueError(f"a cursor key is at least {MIN_KEY_BYTES} bytes")
        self._key = key

    def seal(self, scope: list, position) -> str:
        """The cursor of ``position`` (JSON-serializable) for the listing ``scope`` names."""
        text = json.dumps(position, separators=(",", ":"), ensure_ascii=False).encode()
        body = _encode(_COMPRESSED + zlib.compress(text, 9))
        if len(body) > MAX_BODY_CHARS:
            raise ValueError(f"a cursor's position takes {len(body)} characters; at most {MAX_BODY_CHARS}")
        return f"{body}.{_encode(self._mac(scope, body))}"

    def open(self, scope: list, cursor) -> object:
        """The position of a cursor this seal issued for ``scope``; InvalidCursor for any other string."""
        if not isinstance(cursor, str) or not CURSOR_PATTERN.fullmatch(cursor):
            raise InvalidCursor(CURSOR_REFUSED)
        body, mac = cursor.split(".")
        if not hmac.compare_digest(_encode(self._mac(scope, body)), mac):
            raise InvalidCursor(CURSOR_REFUSED)
        data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        if data.startswith(_COMPRESSED):
            data = zlib.decompress(data[len(_COMPRESSED):])
        return json.loads(data)  # else a position sealed as plain JSON, as earlier releases did

    def _mac(self, scope: list, body: str) -> bytes:
        message = json.dumps(scope).encode() + b"\n" + body.encode()  # ASCII JSON: no newline inside
        return hmac.new(self._key, message, hashlib.sha256).digest()[:_MAC_BYTES]


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")
