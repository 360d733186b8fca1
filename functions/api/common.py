"""What the resource routers share: the library manager, time budgets, responses,
idempotency keys, and the table of registered routes (which methods a path allows)."""

from __future__ import annotations

import functools
from urllib.parse import quote, unquote

from .resolver import Response

from functions.device_state import (CREATED, DELETED, DeviceStateManager, Holder, IdempotencyKey, dumps,
                                    dynamodb_client, fingerprint, restore)

from functions.auth.rights import route_rights, rules_for_path

from . import access
from . import request_parsing as parse
from functions.config import api_config
from .observability import MetricsObserver
from .problems import etag

# Time kept back from the Lambda's remaining time for answering after the retry loop.
RESPONSE_MARGIN_SECONDS = 1.0
IDEMPOTENCY_KEY = parse.IDEMPOTENCY_KEY
IDEMPOTENT_REPLAYED = "Idempotent-Replayed"

# (method, rule) of every route, as registered: what a 405's Allow header lists.
ROUTES: list[tuple[str, str]] = []
# The query parameters and the service's headers each (method, rule) takes, and whether it
# takes a body; any other is a 400 before the route's code runs.
ROUTE_QUERIES: dict[tuple[str, str], frozenset[str]] = {}
ROUTE_HEADERS: dict[tuple[str, str], frozenset[str]] = {}
ROUTE_BODIES: dict[tuple[str, str], bool] = {}


def route(router, rule: str, *methods: str, query: tuple[str, ...] = (), headers: tuple[str, ...] = (),
          body: bool = False, reads_holder: bool = False):
    """``router.route(rule, methods)``, recorded in ROUTES (Powertools keeps no public list),
    with the request's path and query checked for UTF-8 (``check_utf8``), the caller
    authenticated and authorized (``access.check``) and the request's shape checked before the
    route's code runs: the query (only the names in ``query``, each once; ``include`` only
    ``metadata``), the service's headers (only those in ``headers``) and a body only where
    ``body``. A route missing from ``functions.auth.rights.ROUTE_RIGHTS`` fails here, at import.

    A device that calls with a credential must still hold it (``Holder``): a route that reads or
    writes the device's state item as the device (``as_caller``) finds the credential there at
    no cost (``reads_holder``); for every other route, one read of the item checks it first."""
    for method in methods:
        route_rights(method, rule)
    allowed, taken = frozenset(query), frozenset(headers)

    def register(function):
        ROUTES.extend((method, rule) for method in methods)
        ROUTE_QUERIES.update({(method, rule): allowed for method in methods})
        ROUTE_HEADERS.update({(method, rule): taken for method in methods})
        ROUTE_BODIES.update({(method, rule): body for method in methods})

        @functools.wraps(function)
        def checked(**parameters):
            event = router.current_event
            parse.check_utf8(event)
            access.check(event, event.http_method, rule, parameters)
            parse.query_parameters(event, allowed)
            parse.check_headers(event, taken, body)
            if not reads_holder:
                _check_holder(event)
            return function(**parameters)

        return router.route(rule, method=list(methods))(checked)

    return register


def allowed_methods(path: str) -> list[str]:
    """Powertools treats a trailing slash as absent; so does ``rules_for_path``."""
    rules = [(method, rule) for (method, rule), _ in rules_for_path(path) if (method, rule) in ROUTES]
    exact = [(method, rule) for method, rule in rules if "<" not in rule]  # /devices/count, not /devices/<id>
    return sorted({method for method, _ in exact or rules})


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


def holder(event) -> Holder | None:
    """The credential the caller's requests come with, if it is a device that names one."""
    return access.principal_of(event).holder(api_config().require_registered_credentials)


def as_caller(event, device_id: str, writer: DeviceStateManager | None = None) -> DeviceStateManager:
    """``writer`` (the manager unless given) acting as the device itself when the caller is that
    device: its writes record it as seen, and each of its reads and writes must find the
    credential it comes with on the device's item (``CredentialRevoked`` otherwise)."""
    writer = writer or manager()
    if access.principal_of(event).device_id != device_id:
        return writer
    return writer.as_device(device_id, holder(event))


def _check_holder(event) -> None:
    """For a device's request on a route that reads nothing of its state item as the device:
    one read, to find the credential it comes with there."""
    if access.authenticated(event):
        principal = access.principal_of(event)
        if principal.device_id is not None and holder(event) is not None:
            manager().as_device(principal.device_id, holder(event)).check_holder(principal.device_id)


def budget(context, wanted: float | None = None) -> float:
    """The retry budget (or another wait), never past the Lambda's own deadline."""
    seconds = api_config().retry_budget_seconds if wanted is None else wanted
    if context is not None and hasattr(context, "get_remaining_time_in_millis"):
        seconds = min(seconds, context.get_remaining_time_in_millis() / 1000 - RESPONSE_MARGIN_SECONDS)
    return max(seconds, 0.0)


def wait_budget(context, wanted: float) -> float:
    """How long a request with ``waitSeconds`` may wait here: none in a function that serves no
    waiting route (``NEVER_WAIT``: a path spelled so that the gateway did not route it to the
    waiting function must not hold this one's executions), else ``budget``."""
    return 0.0 if api_config().never_wait else budget(context, wanted)


def json_response(body, status: int = 200, headers: dict | None = None) -> Response:
    return Response(status_code=status, content_type=parse.JSON, body=dumps(body), headers=headers)


def device_response(device, status: int = 200, headers: dict | None = None, metadata: bool = False) -> Response:
    """The device with its ETag; per-leaf metadata when ``metadata`` (``?include=metadata``)."""
    return json_response(device.as_dict(include_metadata=metadata), status,
                         {"ETag": etag(device.version), **(headers or {})})


def write_response(event, device, outcome: str) -> Response:
    """The answer to a write, the same whether it was just made or replayed from its
    idempotency record (then marked ``Idempotent-Replayed: true``)."""
    headers = {IDEMPOTENT_REPLAYED: "true"} if device.replayed else {}
    if outcome == DELETED:
        return Response(status_code=204, headers=headers)
    metadata = parse.include_metadata(event)
    if outcome == CREATED:
        return device_response(device, 201, {"Location": location(event, device.device_id), **headers}, metadata)
    return device_response(device, 200, headers, metadata)


def idempotency_key(event, scope: str | None = None) -> IdempotencyKey | None:
    """The request's Idempotency-Key, scoped to the method and the caller (the device scopes
    it too: a key one caller used never replays its answer to another) and fingerprinted by
    everything that makes two requests the same request. The path is taken decoded:
    ``lamp%2D1`` and ``lamp-1`` name the same device."""
    raw = parse.single_header(event, IDEMPOTENCY_KEY)
    if raw is None:
        return None
    scope = f"{scope or event.http_method}.{access.principal_of(event).digest}"
    return IdempotencyKey(raw, scope=scope, fingerprint=fingerprint(
        event.http_method, unquote(event.path), event.get("body"), str(bool(event.get("isBase64Encoded"))),
        parse.header(event, "Content-Type"), parse.list_header(event, parse.IF_MATCH),
        parse.list_header(event, parse.IF_NONE_MATCH),
        # what a desired write's query says of its leaves (none: the fingerprint it always had)
        *parse.desire_fingerprint(event),
    ))


def replay(event, device_id: str, key: IdempotencyKey | None) -> Response | None:
    """A keyed write that already happened is answered from its record, whatever the
    device and the preconditions say now (but never to a device whose credential was revoked
    since: then the record is not shown, one read)."""
    recorded = manager().recorded(device_id, key) if key else None
    if recorded is None:
        return None
    as_caller(event, device_id).check_holder(device_id)
    return write_response(event, *recorded)


def location(event, device_id: str) -> str:
    """The device's URL path as the client sees it (with the API Gateway stage, if any)."""
    outer = (event.get("requestContext") or {}).get("path") or ""
    prefix = outer[: -len(event.path)] if event.path and outer.endswith(event.path) else ""
    return f"{prefix}/devices/{quote(device_id, safe='')}"
