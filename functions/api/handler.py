"""The Lambda handler: API Gateway (HTTP API, payload format 1.0) routes of docs/api.md on Powertools.

The routes are declared in ``routes`` (what each takes, who may call it) and live in one
``Router`` per resource (``devices``, ``transactions``, ``leases``, ``changes``, ``tokens``, ``jobs``);
``common.route`` holds each request to its declaration, and the route only checks
preconditions and calls the library. Errors become problem details in ``problems`` (one place, by type).
"""

from __future__ import annotations

from functions import cold_start  # first: no garbage collection while the modules below import

from .resolver import APIGatewayRestResolver
from aws_lambda_powertools.logging import correlation_paths

from functions.device_state import answer_by, dumps, restore

from . import changes, devices, identity, jobs, leases, request_parsing, tokens, transactions
from .common import RESPONSE_MARGIN_SECONDS, answer_deadline, json_response, route  # noqa: F401
from .common import manager as _manager  # noqa: F401  (tests reset its cache)
from .routes import MAX_LEASE_WAIT_SECONDS  # noqa: F401  (the stack's timeout: the wait's)
from .routes import Request, allowed_methods, unroutable
from .observability import logger, metrics, record_refusal, tracer
from .problems import BadRequest, MethodNotAllowed, RouteNotFound, internal_error_response, known_error_response

restore.register_with_lambda()  # SnapStart: reseed generators, recreate clients after each restore
app = APIGatewayRestResolver(serializer=dumps)
for _router in (devices.router, transactions.router, leases.router, changes.router, tokens.router, identity.router,
                jobs.router):
    app.include_router(_router)


@route(app, "getOpenApi")
def openapi_document(request: Request):
    from .openapi import OPENAPI  # built by the one route that serves it, not at every cold start

    # The server is where this document was fetched from: behind API Gateway the request
    # context's path starts with the stage (/prod/openapi.json), under make serve it does not.
    base = request.event.request_context.path.removesuffix("/openapi.json") or "/"
    return json_response({**OPENAPI, "servers": [{**OPENAPI["servers"][0], "url": base}]})


@app.not_found
def not_found(_error):
    path = app.current_event.path
    try:
        request_parsing.check_utf8(app.current_event)
    except BadRequest as problem:
        return known_error_response(problem, instance=path)
    allowed = allowed_methods(path)
    if app.current_event.http_method in allowed:  # its route's but for a parameter Powertools routes with none
        return known_error_response(unroutable(path), instance=path)
    if allowed:
        problem = MethodNotAllowed(
            f"{app.current_event.http_method} is not allowed here", headers={"Allow": ", ".join(allowed)}
        )
    else:
        problem = RouteNotFound(f"no resource at {path}")
    return known_error_response(problem, instance=path)


def device_of(path: str | None) -> str | None:
    """The device a path under /devices/ names, for a log line."""
    parts = (path or "").split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "devices" else None


@app.exception_handler(Exception)
def handle_error(error: Exception):
    path = app.current_event.path if app.current_event else None
    response = known_error_response(error, instance=path)
    record_refusal(error, response, device_of(path))
    if response is None:
        logger.exception("request failed", extra={"path": path})
        return internal_error_response(instance=path)
    if response.status_code >= 500:
        logger.warning("request refused for now", extra={"status": response.status_code, "reason": str(error)})
    return response


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event, context):
    with answer_by(answer_deadline(context)):  # no request to DynamoDB may outlast the function
        return app.resolve(event, context)


cold_start.done()
