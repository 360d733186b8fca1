"""The Lambda handler: API Gateway (REST proxy) routes of shared/API.md on Powertools.

Routes only parse, check preconditions and call the library; errors become problem
details in ``problems`` (one place, by type).
"""

from __future__ import annotations

import functools
import time
from decimal import Decimal
from urllib.parse import quote

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.logging import correlation_paths

from functions.device_state import (
    DeviceAlreadyExists,
    DeviceNotFound,
    InvalidDeviceId,
    InvalidLease,
    InvalidPatch,
    DeviceStateManager,
    IdempotencyKey,
    JsonPatch,
    MergePatch,
    Operation,
    dynamodb_client,
)
from functions.device_state import leases
from functions.device_state.transactions import MAX_OPERATIONS
from functions.device_state.idempotency import CREATED, DELETED, REPLACED, UPDATED, fingerprint
from functions.device_state.manager import MAX_LIST_LIMIT
from functions.device_state.values import dumps, validate_device_id

from . import request_parsing as parse
from .config import load_config
from .observability import MetricsObserver, logger, metrics, record_patch_latency, tracer
from .openapi import OPENAPI
from .problems import (
    BadRequest,
    LeaseNotFound,
    MethodNotAllowed,
    PreconditionFailed,
    PreconditionRequired,
    RouteNotFound,
    etag,
    internal_error_response,
    known_error_response,
)

# Time kept back from the Lambda's remaining time for answering after the retry loop.
RESPONSE_MARGIN_SECONDS = 1.0
DEFAULT_LIST_LIMIT = 50
IDEMPOTENCY_KEY = "Idempotency-Key"
IDEMPOTENT_REPLAYED = "Idempotent-Replayed"
LEASE_TOKEN = "Lease-Token"
MAX_LEASE_WAIT_SECONDS = 25  # inside API Gateway's 29 s integration timeout

app = APIGatewayRestResolver(serializer=dumps)


@functools.lru_cache(maxsize=1)
def _manager() -> DeviceStateManager:
    config = load_config()
    return DeviceStateManager(
        dynamodb_client(config.dynamodb_endpoint),
        config.table_name,
        observer=MetricsObserver(),
        max_attempts=config.max_attempts,
        budget_seconds=config.retry_budget_seconds,
        settle_seconds=config.settle_seconds,
        tombstone_seconds=config.tombstone_seconds,
    )


def _budget(wanted: float | None = None) -> float:
    """The retry budget (or another wait), never past the Lambda's own deadline."""
    budget = load_config().retry_budget_seconds if wanted is None else wanted
    context = app.lambda_context
    if context is not None and hasattr(context, "get_remaining_time_in_millis"):
        budget = min(budget, context.get_remaining_time_in_millis() / 1000 - RESPONSE_MARGIN_SECONDS)
    return max(budget, 0.0)


def _writer(device_id: str) -> DeviceStateManager:
    """The manager for a write to one device, fenced by the request's Lease-Token if any."""
    token = parse.lease_token(parse.header(app.current_event, LEASE_TOKEN), LEASE_TOKEN)
    return _manager() if token is None else _manager().fenced({device_id: token})


def _device_response(device, status: int = 200, headers: dict | None = None) -> Response:
    return Response(
        status_code=status,
        content_type=parse.JSON,
        body=dumps(device.as_dict()),
        headers={"ETag": etag(device.version), **(headers or {})},
    )


def _write_response(device, outcome: str) -> Response:
    """The answer to a write, the same whether it was just made or replayed from its
    idempotency record (then marked ``Idempotent-Replayed: true``)."""
    headers = {IDEMPOTENT_REPLAYED: "true"} if device.replayed else {}
    if outcome == DELETED:
        return Response(status_code=204, headers=headers)
    if outcome == CREATED:
        return _device_response(device, 201, {"Location": _location(device.device_id), **headers})
    return _device_response(device, 200, headers)


def _idempotency_key(scope: str | None = None) -> IdempotencyKey | None:
    """The request's Idempotency-Key, scoped to the method (the device scopes it too) and
    fingerprinted by everything that makes two requests the same request."""
    event = app.current_event
    raw = parse.header(event, IDEMPOTENCY_KEY)
    if raw is None:
        return None
    return IdempotencyKey(raw, scope=scope or event.http_method, fingerprint=fingerprint(
        event.http_method, event.path, event.get("body"), str(bool(event.get("isBase64Encoded"))),
        parse.header(event, "Content-Type"), parse.header(event, "If-Match"), parse.header(event, "If-None-Match"),
    ))


def _device_write(raw_device_id: str):
    """What every write to one device starts from: its id, preconditions, idempotency key,
    and the recorded answer when that key was already used."""
    device_id = parse.device_id(raw_device_id)
    preconditions = parse.Preconditions.of(app.current_event)
    key = _idempotency_key()
    return device_id, preconditions, key, _replay(device_id, key)


def _replay(device_id: str, key: IdempotencyKey | None) -> Response | None:
    """A keyed write that already happened is answered from its record, whatever the
    device and the preconditions say now."""
    recorded = _manager().recorded(device_id, key) if key else None
    return _write_response(*recorded) if recorded else None


def _location(device_id: str) -> str:
    """The device's URL path as the client sees it (with the API Gateway stage, if any)."""
    event = app.current_event
    outer = (event.get("requestContext") or {}).get("path") or ""
    prefix = outer[: -len(event.path)] if event.path and outer.endswith(event.path) else ""
    return f"{prefix}/devices/{quote(device_id, safe='')}"


def _require_if_match(preconditions: parse.Preconditions, method: str) -> None:
    if preconditions.if_match is None and load_config().require_if_match:
        raise PreconditionRequired(f"{method} needs If-Match with the device's ETag on this server")


def _expected_version(device_id: str, preconditions: parse.Preconditions) -> int:
    """The version a conditional write must find: a lone If-Match names it; any other
    combination is checked against the current device, which the write then pins."""
    version = preconditions.only_if_match_version()
    if version is None:
        current = _manager().get(device_id)
        preconditions.check(current)
        version = current.version
    return version


def _state_body(device_id: str) -> dict:
    body = parse.json_object(parse.json_body(app.current_event), "the body", ("state",), ("deviceId",))
    if "deviceId" in body and body["deviceId"] != device_id:
        raise BadRequest("deviceId in the body differs from the one in the path")
    return body["state"]


def _patch_function():
    event = app.current_event
    kind = parse.media_type(event)
    accepted = (parse.MERGE_PATCH, parse.JSON, parse.JSON_PATCH)
    document = parse.json_body(event, accepted)
    if kind == parse.JSON_PATCH:
        return JsonPatch(document)
    return MergePatch(document)


# ---------------------------------------------------------------- routes


@app.get("/devices")
def list_devices():
    query = parse.query_parameters(app.current_event, {"limit", "cursor"})
    raw_limit = query.get("limit", str(DEFAULT_LIST_LIMIT))
    if not raw_limit.isascii() or not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT:
        raise BadRequest(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}")
    devices, cursor = _manager().list_devices(limit=int(raw_limit), cursor=query.get("cursor"))
    body = {"items": [device.as_dict() for device in devices], "nextCursor": cursor}
    return Response(status_code=200, content_type=parse.JSON, body=dumps(body))


@app.post("/devices")
def create_device():
    body = parse.json_object(parse.json_body(app.current_event), "the body", ("deviceId", "state"))
    device_id = validate_device_id(body["deviceId"])
    key = _idempotency_key()
    replay = _replay(device_id, key)
    if replay:
        return replay
    return _write_response(_manager().create(device_id, body["state"], idempotency=key), CREATED)


@app.get("/devices/<device_id>")
def get_device(device_id: str):
    device_id = parse.device_id(device_id)
    if_none_match = parse.entity_tags(app.current_event, "If-None-Match")
    device = _manager().get(device_id)
    if if_none_match is not None and if_none_match.matches_weak(device.version):
        return Response(status_code=304, headers={"ETag": etag(device.version)})
    return _device_response(device)


@app.put("/devices/<device_id>")
def put_device(device_id: str):
    device_id, preconditions, key, replay = _device_write(device_id)
    state = _state_body(device_id)
    if replay:
        return replay
    manager = _writer(device_id)
    if preconditions.create_only or (preconditions.none and load_config().require_if_match):
        try:
            device = manager.create(device_id, state, idempotency=key)
        except DeviceAlreadyExists as exists:
            if preconditions.create_only:
                raise PreconditionFailed("If-None-Match: * but the device exists", current=exists.current) from None
            raise PreconditionRequired("replacing a device needs If-Match on this server") from None
        return _write_response(device, CREATED)
    if preconditions.none:
        device, created = manager.put(device_id, state, idempotency=key)
        return _write_response(device, CREATED if created else REPLACED)
    try:
        current = manager.get(device_id)
    except DeviceNotFound:
        current = None
    preconditions.check(current)
    if current is None:
        try:
            return _write_response(manager.create(device_id, state, idempotency=key), CREATED)
        except DeviceAlreadyExists as exists:
            raise PreconditionFailed("the device was created meanwhile", current=exists.current) from None
    _require_if_match(preconditions, "PUT")
    try:
        return _write_response(manager.replace(device_id, state, current.version, idempotency=key), REPLACED)
    except DeviceNotFound:
        raise PreconditionFailed("the device was deleted meanwhile") from None


@app.patch("/devices/<device_id>")
def patch_device(device_id: str):
    device_id, preconditions, key, replay = _device_write(device_id)
    update_fn = _patch_function()
    if replay:
        return replay
    _require_if_match(preconditions, "PATCH")
    manager = _writer(device_id)
    started = time.perf_counter()
    try:
        if preconditions.none:
            device = manager.update_with_retry(device_id, update_fn, budget_seconds=_budget(), idempotency=key)
        else:
            device = manager.update(device_id, update_fn, _expected_version(device_id, preconditions),
                                    idempotency=key)
    finally:
        record_patch_latency((time.perf_counter() - started) * 1000)
    return _write_response(device, UPDATED)


@app.delete("/devices/<device_id>")
def delete_device(device_id: str):
    device_id, preconditions, key, replay = _device_write(device_id)
    if replay:
        return replay
    _require_if_match(preconditions, "DELETE")
    expected = None if preconditions.none else _expected_version(device_id, preconditions)
    return _write_response(_writer(device_id).delete(device_id, expected, idempotency=key), DELETED)


_TRANSACTION_ACTIONS = ("mergePatch", "jsonPatch", "put", "delete", "check")


def _transaction_operation(index: int, entry) -> Operation:
    """One entry of POST /transactions' ``operations`` as a library Operation."""
    where = f"operations[{index}]"
    if not isinstance(entry, dict):
        raise BadRequest(f"{where} must be an object")
    actions = [action for action in _TRANSACTION_ACTIONS if action in entry]
    if len(actions) != 1:
        raise BadRequest(f"{where} needs exactly one of {', '.join(_TRANSACTION_ACTIONS)}")
    action = actions[0]
    optional = ("ifMatch", "ifNoneMatch", "leaseToken") if action == "put" else ("ifMatch", "leaseToken")
    parse.json_object(entry, where, ("deviceId", action), optional)
    try:
        device_id = validate_device_id(entry["deviceId"])
    except InvalidDeviceId as error:
        raise BadRequest(f"{where}: {error}") from None
    expected, must_exist = None, False
    if "ifMatch" in entry:
        tags = parse.parse_entity_tags(entry["ifMatch"], f"{where}.ifMatch")
        if tags.any:
            must_exist = True
        elif len(tags.strong) == 1 and not tags.weak:
            expected = next(iter(tags.strong))
        else:
            raise BadRequest(f'{where}.ifMatch takes one strong entity tag such as "\\"3\\"", or *')
    value = entry[action]
    try:
        if action == "mergePatch":
            return Operation.update(device_id, MergePatch(value), expected)
        if action == "jsonPatch":
            return Operation.update(device_id, JsonPatch(value), expected)
    except InvalidPatch as error:
        raise BadRequest(f"{where}: {error}") from None
    if action == "put":
        state = parse.json_object(value, f"{where}.put", ("state",))["state"]
        if "ifNoneMatch" in entry:
            if entry["ifNoneMatch"] != "*" or "ifMatch" in entry:
                raise BadRequest(f'{where}.ifNoneMatch takes only "*" (create only), without ifMatch')
            return Operation.create(device_id, state)
        if expected is not None or must_exist:
            return Operation.replace(device_id, state, expected)
        return Operation.put(device_id, state)
    if value is not True:
        raise BadRequest(f"{where}.{action} must be true")
    if action == "delete":
        return Operation.delete(device_id, expected)
    return Operation.check(device_id, expected)


@app.post("/transactions")
def run_transaction():
    body = parse.json_object(parse.json_body(app.current_event), "the body", ("operations",))
    entries = body["operations"]
    if not isinstance(entries, list) or not 1 <= len(entries) <= MAX_OPERATIONS:
        raise BadRequest(f"operations must be an array of 1 to {MAX_OPERATIONS} operations")
    operations = [_transaction_operation(index, entry) for index, entry in enumerate(entries)]
    tokens = {operation.device_id: parse.lease_token(entry["leaseToken"], f"operations[{index}].leaseToken")
              for index, (operation, entry) in enumerate(zip(operations, entries)) if "leaseToken" in entry}
    key = _idempotency_key(scope="transaction")
    devices = _manager().fenced(tokens).transact(operations, idempotency=key, budget_seconds=_budget())
    result = {"devices": [None if operation.action == "delete" else device.as_dict()
                          for operation, device in zip(operations, devices)]}
    headers = {IDEMPOTENT_REPLAYED: "true"} if devices and devices[0].replayed else None
    return Response(status_code=200, content_type=parse.JSON, body=dumps(result), headers=headers)


def _lease_id(raw: str) -> str:
    try:
        leases.parse_lease_id(raw)
    except InvalidLease:
        raise LeaseNotFound("no lease has this id") from None
    return raw


def _lease_body(allowed: tuple[str, ...]) -> dict:
    """The optional JSON body of a lease request, its numbers checked."""
    event = app.current_event
    if event.get("body") in (None, "") and parse.header(event, "Content-Type") is None:
        return {}
    body = parse.json_object(parse.json_body(event), "the body", (), allowed)
    limits = {"ttlSeconds": (1, leases.MAX_TTL_SECONDS), "waitSeconds": (0, MAX_LEASE_WAIT_SECONDS)}
    for name, (low, high) in limits.items():
        value = body.get(name)
        if name in body and (isinstance(value, bool) or not isinstance(value, (int, Decimal))
                             or not low <= value <= high):
            raise BadRequest(f"{name} must be a number from {low} to {high}")
    owner = body.get("owner")
    if owner is not None and (not isinstance(owner, str) or not 1 <= len(owner) <= 128):
        raise BadRequest("owner must be a string of 1 to 128 characters")
    return body


def _lease_response(grant, status: int = 200, headers: dict | None = None) -> Response:
    return Response(status_code=status, content_type=parse.JSON, body=dumps(grant.as_dict()), headers=headers)


@app.post("/devices/<device_id>/leases")
def acquire_lease(device_id: str):
    device_id = parse.device_id(device_id)
    body = _lease_body(("ttlSeconds", "waitSeconds", "owner"))
    wait = _budget(float(body.get("waitSeconds", 0)))
    grant = _manager().lease_queue().acquire(device_id, float(body.get("ttlSeconds", leases.DEFAULT_TTL_SECONDS)),
                                             wait, body.get("owner"))
    location = f"{_location(device_id)}/leases/{grant.lease_id}"
    return _lease_response(grant, 201, {"Location": location})


@app.get("/devices/<device_id>/leases")
def lease_status(device_id: str):
    device_id = parse.device_id(device_id)
    status = _manager().lease_queue().status(device_id)
    return Response(status_code=200, content_type=parse.JSON, body=dumps(status.as_dict(device_id)))


@app.put("/devices/<device_id>/leases/<lease_id>")
def heartbeat_lease(device_id: str, lease_id: str):
    device_id, lease_id = parse.device_id(device_id), _lease_id(lease_id)
    ttl = _lease_body(("ttlSeconds",)).get("ttlSeconds")
    return _lease_response(_manager().lease_queue().heartbeat(device_id, lease_id, None if ttl is None else float(ttl)))


@app.delete("/devices/<device_id>/leases/<lease_id>")
def release_lease(device_id: str, lease_id: str):
    device_id, lease_id = parse.device_id(device_id), _lease_id(lease_id)
    _manager().lease_queue().release(device_id, lease_id)
    return Response(status_code=204)


@app.get("/openapi.json")
def openapi_document():
    return Response(status_code=200, content_type=parse.JSON, body=dumps(OPENAPI))


# ------------------------------------------------------- errors, not found


def _allowed_methods(path: str) -> list[str]:
    routes = app._static_routes + app._dynamic_routes  # Powertools keeps no public list
    return sorted({route.method for route in routes if route.rule.match(path)})


@app.not_found
def not_found(_error):
    path = app.current_event.path
    allowed = _allowed_methods(path)
    if allowed:
        problem = MethodNotAllowed(
            f"{app.current_event.http_method} is not allowed here", headers={"Allow": ", ".join(allowed)}
        )
    else:
        problem = RouteNotFound(f"no resource at {path}")
    return known_error_response(problem, instance=path)


@app.exception_handler(Exception)
def handle_error(error: Exception):
    path = app.current_event.path if app.current_event else None
    response = known_error_response(error, instance=path)
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
    return app.resolve(event, context)
