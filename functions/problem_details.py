"""The shape of every error this service answers (RFC 9457 problem details), over HTTP, from
the WebSocket connect's refusal and over WebSocket: one type namespace, one shape."""

from __future__ import annotations

TYPE_PREFIX = "urn:device-state:problem:"
MEDIA_TYPE = "application/problem+json"


def problem(status: int, slug: str, title: str, detail: str, **members) -> dict:
    body = {"type": TYPE_PREFIX + slug, "title": title, "status": status, "detail": detail}
    body.update({key: value for key, value in members.items() if value is not None})
    return body
