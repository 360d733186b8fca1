"""Routes of a device's change feed and history: parse, call the library's ``ChangeLog``.

The feed trails writes by the stream's delay. A long-poll (``waitSeconds``) re-queries
with backoff until a change arrives or its wait ends, never past the Lambda's deadline.
"""

from __future__ import annotations

from urllib.parse import unquote

from .resolver import Router

from functions.device_state import (MAX_FEED_LIMIT, SECTIONS, ChangeLog, ChangesExpired, VersionNotFound,
                                    dynamodb_client)

from . import request_parsing as parse
from .common import device_response, json_response, route, wait_budget
from functions.config import api_config
from .problems import BadRequest, HttpProblem

DEFAULT_FEED_LIMIT = 100
MAX_WAIT_SECONDS = 20
MAX_VERSION = parse.MAX_VERSION

router = Router()


class ChangesGone(HttpProblem):
    status, slug, title = 410, "changes-expired", "Changes past the retention"


class VersionGone(HttpProblem):
    status, slug, title = 404, "version-not-found", "No such version"


def change_log() -> ChangeLog:
    """Made per request (cheap): the client under it is the cached one per endpoint."""
    config = api_config()
    return ChangeLog(dynamodb_client(config.dynamodb_endpoint), config.table_name,
                     retention_seconds=config.change_retention_seconds)


@route(router, "/devices/<device_id>/changes", "GET", "HEAD",
       query=("since", "limit", "waitSeconds", "sections"))
def list_changes(device_id: str):
    device_id = parse.device_id(device_id)
    query = parse.query(router.current_event)
    wanted = _sections(query.get("sections"))
    since = parse.integer(query, "since", 0, 0, MAX_VERSION)
    limit = parse.integer(query, "limit", DEFAULT_FEED_LIMIT, 1, MAX_FEED_LIMIT)
    wait = parse.integer(query, "waitSeconds", 0, 0, MAX_WAIT_SECONDS)
    try:
        changes = change_log().wait(device_id, since, limit, wait_budget(router.lambda_context, wait) if wait else 0)
    except ChangesExpired as expired:
        raise ChangesGone(str(expired), deviceId=device_id, currentVersion=expired.current_version) from None
    next_since = changes[-1].version if changes else since  # past the changes filtered out too
    shown = [change.as_dict() for change in changes if wanted.intersection(change.sections)]
    return json_response({"changes": shown, "nextSince": next_since})


def _sections(raw: str | None) -> set:
    """The sections a feed reader follows (``?sections=desired,reported``; all by default)."""
    if raw is None:
        return set(SECTIONS)
    names = raw.split(",")
    if not raw or any(name not in SECTIONS for name in names):
        raise BadRequest(f"sections must be a comma-separated list of {', '.join(SECTIONS)}")
    return set(names)


@route(router, "/devices/<device_id>/versions/<version>", "GET", "HEAD",
       query=(parse.INCLUDE,))
def get_version(device_id: str, version: str):
    device_id = parse.device_id(device_id)
    number = parse.decimal_integer(unquote(version), "version", 1, MAX_VERSION)  # decoded as device ids are
    try:
        return device_response(change_log().at_version(device_id, number),
                               metadata=parse.include_metadata(router.current_event))
    except VersionNotFound as missing:
        raise VersionGone(str(missing), deviceId=device_id) from None
