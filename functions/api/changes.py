"""Routes of a device's change feed and history: parse, call the library's ``ChangeLog``.

The feed trails writes by the stream's delay. A long-poll (``waitSeconds``) re-queries
with backoff until a change arrives or its wait ends, never past the Lambda's deadline.
"""

from __future__ import annotations

from .resolver import Router

from functions.device_state import SECTIONS, ChangeLog, ChangesExpired, VersionNotFound, dynamodb_client

from .common import device_response, include_metadata, json_response, own_holder, route, wait_budget
from functions.config import api_config
from .problems import HttpProblem
from .routes import Request

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


@route(router, "listChanges", reads_holder=True)
def list_changes(request: Request):
    """The changes after ``since``, those to the ``sections`` asked for (all by default) shown."""
    device_id, query = request.path["device_id"], request.query
    since, limit, wait = query["since"], query["limit"], query["waitSeconds"]
    wanted = query.get("sections", set(SECTIONS))
    try:
        changes = change_log().wait(device_id, since, limit, wait_budget(request.context, wait) if wait else 0,
                                    holder=own_holder(request, device_id))
    except ChangesExpired as expired:
        raise ChangesGone(str(expired), deviceId=device_id, currentVersion=expired.current_version) from None
    next_since = changes[-1].version if changes else since  # past the changes filtered out too
    shown = [change.as_dict() for change in changes if wanted.intersection(change.sections)]
    return json_response({"changes": shown, "nextSince": next_since})


@route(router, "getDeviceVersion", reads_holder=True)
def get_version(request: Request):
    device_id = request.path["device_id"]
    try:
        return device_response(change_log().at_version(device_id, request.path["version"],
                                                       holder=own_holder(request, device_id)),
                               metadata=include_metadata(request))
    except VersionNotFound as missing:
        raise VersionGone(str(missing), deviceId=device_id) from None
