"""What the resource routers share: ``route()``, which holds every request to its declaration
(``routes``) before the route's code runs, the library manager, time budgets, responses and
idempotency keys."""

from __future__ import annotations

import functools
import json
import time
from urllib.parse import quote, unquote

from .resolver import Response

from functions.auth.principals import Principal
from functions.device_state import (CREATED, DELETED, LONGEST_SEND_SECONDS, CredentialRevoked, DeviceNotFound,
                                    DeviceStateManager, Holder, IdempotencyKey, IdempotencyKeyReused,
                                    StorageUnavailable, dumps, dynamodb_client, fingerprint, restore)

from . import access
from . import request_parsing as parse
from .routes import BY_OPERATION, PATH_PARAMETERS, Request, Route
from .validation import from_text, validate
from functions.config import api_config
from .observability import MetricsObserver
from .problems import BadRequest, etag, refused_on_its_form

# Time kept back from the Lambda's remaining time for answering after the retry loop.
RESPONSE_MARGIN_SECONDS = 1.0
IDEMPOTENT_REPLAYED = "Idempotent-Replayed"
# Lambda's limit on a synchronous invocation's answer (6 MB, as its error names it): the whole
# response object as JSON, the body escaped inside it (the Python runtime keeps non-ASCII characters
# as they are). An answer past it fails the invocation, which the HTTP API answers 500.
LAMBDA_ANSWER_BYTES = 6_291_556
ANSWER_ENVELOPE_BYTES = 16 * 1024  # what the response object holds besides the body: status, headers

# The declarations of the routes registered, by (method, rule): each once (a test holds them to routes.ROUTES).
REGISTERED: dict[tuple[str, str], Route] = {}


def route(router, operation: str, reads_holder: bool = False):
    """Registers the function as the route ``operation`` declares (``routes.BY_OPERATION``),
    called with the ``Request`` its declaration took once the caller may: the path and query
    checked for UTF-8, the caller authenticated and authorized for the route, its path, query,
    headers and body held to their schemas, then authorized for everything its body writes
    (``access.check_writes``), all before the function runs, so no route can skip a step.

    A device that calls with a credential must still hold it (``Holder``): a route that reads or
    writes the device's state item as the device (``as_caller``, ``own_holder``) finds the
    credential there at no cost (``reads_holder``), and reads the item for it only when it refuses
    the request on its own form first; for every other route, one read of the item checks it first."""
    declaration = BY_OPERATION[operation]

    def register(function):
        for method in declaration.methods:
            if (method, declaration.rule) in REGISTERED:
                raise LookupError(f"{method} {declaration.rule} is registered twice")
            REGISTERED[(method, declaration.rule)] = declaration

        @functools.wraps(function)
        def checked(**raw_path):
            event = router.current_event
            parse.check_utf8(event)
            principal = access.authenticate(event, declaration)
            holder_checked = False
            try:
                path = {name: _path_value(name, raw) for name, raw in raw_path.items()}
                access.check_route(principal, declaration, path)
                request = Request(event, router.lambda_context, principal, path, _query(declaration, event),
                                  _headers(declaration, event), *_body(declaration, event))
                access.check_writes(principal, declaration, request)
                if not reads_holder:
                    _check_holder(principal)
                    holder_checked = True
                return function(request)
            except Exception as error:  # refused on the request alone (its form, its rights), maybe before the
                if not holder_checked and refused_on_its_form(error):  # credential was checked: a revoked one
                    _revoked_before_refused(principal)  # hears 401 all the same (one read)
                raise

        return router.route(declaration.rule, method=list(declaration.methods))(checked)

    return register


def _path_value(name: str, raw: str):
    """A path parameter, percent-decoded (``lamp%2D1`` is ``lamp-1``)."""
    parameter = PATH_PARAMETERS[name]
    return from_text(parameter.schema, unquote(raw), parameter.name)


def _query(declaration: Route, event) -> dict:
    """The query's parameters the route declares, each given once and held to its schema;
    absent ones at their default. Any other is a 400."""
    given = parse.query(event)
    declared = {parameter.name: parameter for parameter in declaration.query}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise BadRequest(f"unknown query parameters: {', '.join(unknown)}")
    values = {}
    for name, parameter in declared.items():
        if name in given:
            values[name] = from_text(parameter.schema, given[name], name)
        elif parameter.required:
            raise BadRequest(f"the query needs {name}" + (f", e.g. {name}={parameter.example}" if parameter.example
                                                          else ""))
        elif "default" in parameter.schema:
            values[name] = parameter.schema["default"]
    return values


def _headers(declaration: Route, event) -> dict:
    """The service's headers the route declares, held to their schemas. One it does not declare
    is a 400, so no caller believes a precondition, key or lease token applied that did not (a
    cache's conditional headers on a read are let through); those of ``SINGLE_HEADERS`` once."""
    for name in parse.SINGLE_HEADERS:
        parse.single_header(event, name)
    sent, declared = parse.sent_headers(event), {parameter.name for parameter in declaration.headers}
    reads = event.get("httpMethod") in ("GET", "HEAD")
    for name in parse.SERVICE_HEADERS:
        if name.lower() in sent and name not in declared and not (reads and name in (parse.IF_MATCH,
                                                                                     parse.IF_NONE_MATCH)):
            raise BadRequest(f"{name} does not apply to {event.get('httpMethod')} on this resource; nothing was done")
    values = {}
    for parameter in declaration.headers:
        raw = parse.list_header(event, parameter.name)
        if raw is not None:
            values[parameter.name] = from_text(parameter.schema, raw, parameter.name)
    return values


def _body(declaration: Route, event) -> tuple:
    """(the body held to its media type's schema, the media type); (None, None) without one."""
    if declaration.body is None or (not declaration.body.required and not parse.has_body(event)):
        if parse.has_body(event):
            raise BadRequest("this request takes no body; nothing was done")
        return None, None
    content = declaration.body.content
    document = parse.json_body(event, tuple(content))
    kind = parse.media_type(event)
    return validate(content[kind], document), kind


@functools.lru_cache(maxsize=1)
def manager() -> DeviceStateManager:
    config = api_config()
    return DeviceStateManager(
        dynamodb_client(config.dynamodb_endpoint),
        config.table_name,
        observer=MetricsObserver(),
        max_attempts=config.max_attempts,
        budget_seconds=config.retry_budget_seconds,
        settle_seconds=config.settle_seconds,
        tombstone_seconds=config.tombstone_seconds,
        fleet_index=config.fleet_index,
        cursor_key=config.cursor_key,
    )


restore.on_restore(manager.cache_clear)  # its client and generator are created afresh after a restore


def holder(principal: Principal | None) -> Holder | None:
    """The credential the caller's requests come with, if it is a device that names one."""
    if principal is None or principal.credential_id is None:  # a back-end's, or a device's that names none
        return None
    return principal.holder(api_config().require_registered_credentials)


def own_holder(request: Request, device_id: str) -> Holder | None:
    """The credential the caller comes with when it is the device ``device_id`` itself: what a
    route that reads the device's state item checks on it (``Holder.check``)."""
    if request.principal is None or request.principal.device_id != device_id:
        return None
    return holder(request.principal)


def as_caller(request: Request, device_id: str, writer: DeviceStateManager | None = None) -> DeviceStateManager:
    """``writer`` (the manager unless given) acting as the device itself when the caller is that
    device: its writes record it as seen, and each of its reads and writes must find the
    credential it comes with on the device's item (``CredentialRevoked`` otherwise)."""
    writer = writer or manager()
    if request.principal is None or request.principal.device_id != device_id:
        return writer
    return writer.as_device(device_id, holder(request.principal))


def _check_holder(principal: Principal | None) -> None:
    """For a device's request on a route that reads nothing of its state item as the device:
    one read, to find the credential it comes with there."""
    held = holder(principal)
    if held is not None and principal.device_id is not None:
        manager().as_device(principal.device_id, held).check_holder(principal.device_id)


def _revoked_before_refused(principal: Principal | None) -> None:
    """Before a refusal on the request's form or rights: ``CredentialRevoked`` for a credential
    the device no longer holds, its device deleted too; where the check cannot be made (storage
    unavailable), the refusal stands, since sending the request again would not change it."""
    try:
        _check_holder(principal)
    except DeviceNotFound:
        raise CredentialRevoked(principal.device_id) from None
    except StorageUnavailable:
        pass


def answer_deadline(context) -> float | None:
    """When the request must have its answer (monotonic): the Lambda's end, less the time to send
    it; None without a Lambda context."""
    if context is None or not hasattr(context, "get_remaining_time_in_millis"):
        return None
    return time.monotonic() + context.get_remaining_time_in_millis() / 1000 - RESPONSE_MARGIN_SECONDS


def budget(context, wanted: float | None = None) -> float:
    """The retry budget (or another wait), ending with time left for the two requests that may
    follow it (a last read, a withdrawal or a settle's look) before the answer's deadline."""
    seconds = api_config().retry_budget_seconds if wanted is None else wanted
    deadline = answer_deadline(context)
    if deadline is not None:
        seconds = min(seconds, deadline - time.monotonic() - 2 * LONGEST_SEND_SECONDS)
    return max(seconds, 0.0)


def wait_budget(context, wanted: float) -> float:
    """How long a request with ``waitSeconds`` may wait here: none in a function that serves no
    waiting route (``NEVER_WAIT``: a path spelled so that the gateway did not route it to the
    waiting function must not hold this one's executions), else ``budget``."""
    return 0.0 if api_config().never_wait else budget(context, wanted)


def fits_in_an_answer(body) -> bool:
    """Whether ``body``, as ``json_response`` sends it, fits in a Lambda's answer (LAMBDA_ANSWER_BYTES)."""
    text = dumps(body)
    if 2 * len(text.encode()) + ANSWER_ENVELOPE_BYTES <= LAMBDA_ANSWER_BYTES:  # escaped, a body at most doubles
        return True
    return len(json.dumps(text, ensure_ascii=False).encode()) + ANSWER_ENVELOPE_BYTES <= LAMBDA_ANSWER_BYTES


def json_response(body, status: int = 200, headers: dict | None = None) -> Response:
    return Response(status_code=status, content_type=parse.JSON, body=dumps(body), headers=headers)


def device_response(device, status: int = 200, headers: dict | None = None, metadata: bool = False) -> Response:
    """The device with its ETag; per-leaf metadata when ``metadata`` (``?include=metadata``)."""
    return json_response(device.as_dict(include_metadata=metadata), status,
                         {"ETag": etag(device.version), **(headers or {})})


def write_response(request: Request, device, outcome: str) -> Response:
    """The answer to a write, the same whether it was just made or replayed from its
    idempotency record (then marked ``Idempotent-Replayed: true``)."""
    headers = {IDEMPOTENT_REPLAYED: "true"} if device.replayed else {}
    if outcome == DELETED:
        return Response(status_code=204, headers=headers)
    metadata = include_metadata(request)
    if outcome == CREATED:
        return device_response(device, 201, {"Location": location(request.event, device.device_id), **headers},
                               metadata)
    return device_response(device, 200, headers, metadata)


def include_metadata(request: Request) -> bool:
    """``?include=metadata``."""
    return "include" in request.query


def idempotency_key(request: Request, scope: str | None = None, *query: str,
                    body: str | None = None) -> IdempotencyKey | None:
    """The request's Idempotency-Key, scoped to the method and the caller (the device scopes
    it too: a key one caller used never replays its answer to another) and fingerprinted by
    everything that makes two requests the same request (``query``: what of the route's query
    does, as ``name=value``; ``body``: what of the body does, where not all of it). The path is
    taken decoded: ``lamp%2D1`` and ``lamp-1`` name the same device."""
    raw = request.headers.get(parse.IDEMPOTENCY_KEY)
    if raw is None:
        return None
    event = request.event
    options = parse.desire_options(request.query)  # what a desired write's query says of its leaves
    scope = f"{scope or event.http_method}.{request.principal.digest}"
    return IdempotencyKey(raw, scope=scope, fingerprint=fingerprint(
        event.http_method, unquote(event.path), event.get("body") if body is None else body,
        str(bool(event.get("isBase64Encoded")) if body is None else "parsed"),
        parse.header(event, "Content-Type"), parse.list_header(event, parse.IF_MATCH),
        parse.list_header(event, parse.IF_NONE_MATCH),
        # none: the fingerprint it always had
        *([f"expiresIn={options.expires_in}", f"clearOnConfirm={options.clear_on_confirm}"] if options else []),
        *query,
    ))


def replay(request: Request, device_id: str, key: IdempotencyKey | None) -> Response | None:
    """A keyed write that already happened is answered from its record, whatever the
    device and the preconditions say now (but never to a device whose credential was revoked
    since: then the record is not shown, nor that the key names another request, one read)."""
    try:
        recorded = manager().recorded(device_id, key) if key else None
    except IdempotencyKeyReused:
        as_caller(request, device_id).check_holder(device_id)
        raise
    if recorded is None:
        return None
    as_caller(request, device_id).check_holder(device_id)
    return write_response(request, *recorded)


def location(event, device_id: str) -> str:
    """The device's URL path as the client sees it (with the API Gateway stage, if any)."""
    outer = (event.get("requestContext") or {}).get("path") or ""
    prefix = outer[: -len(event.path)] if event.path and outer.endswith(event.path) else ""
    return f"{prefix}/devices/{quote(device_id, safe='')}"
