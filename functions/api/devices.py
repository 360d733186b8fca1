"""Routes of one device and of the collection: parse, check preconditions, call the
library. The PUT decision tree lives here, beside the parsing it depends on."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from .resolver import Response
from .resolver import Router

from functions.device_state import (CREATED, DELETED, DESIRED, DEVICE_SECTIONS, MAX_LIST_LIMIT, REPLACED,
                                    REPORTED, STATE, UPDATED, DeviceAlreadyExists, DeviceNotFound,
                                    DeviceStateError, DeviceStateManager, IdempotencyKey, JsonPatch, MergePatch,
                                    validate_device_id)

from functions.auth.rights import WriteKind

from . import access
from . import request_parsing as parse
from .common import (as_caller, budget, device_response, idempotency_key, json_response, manager, replay, route,
                     wait_budget, write_response)
from functions.config import api_config
from .observability import record_patch_latency
from .problems import BadRequest, PreconditionFailed, PreconditionRequired, etag

DEFAULT_LIST_LIMIT = 50
MAX_DELTA_WAIT_SECONDS = 20
# What every write of one device takes: include=metadata, every header of the service's, a body;
# the device's own write finds its credential on the item in the write's condition.
DEVICE_WRITE = {"query": (parse.INCLUDE,), "headers": parse.SERVICE_HEADERS, "body": True, "reads_holder": True}
DESIRED_WRITE = {**DEVICE_WRITE, "query": (parse.INCLUDE, *parse.DESIRE_QUERY)}  # expiry, clear on confirm

router = Router()
logger = logging.getLogger("device_state.api")


@dataclass(frozen=True)
class _Write:
    """What every write to one device is parsed into before anything is read or written:
    its id, preconditions, idempotency key and lease token."""

    device_id: str
    preconditions: parse.Preconditions
    key: IdempotencyKey | None
    lease_token: str | None

    def writer(self) -> DeviceStateManager:
        """The manager for this write, fenced by its Lease-Token if any; the device's own
        write records it as seen, and finds the credential it comes with on the item."""
        writer = manager() if self.lease_token is None else manager().fenced({self.device_id: self.lease_token})
        return as_caller(router.current_event, self.device_id, writer)

    def replayed(self):
        """The recorded answer when this write's idempotency key was already used."""
        return replay(router.current_event, self.device_id, self.key)


def _device_write(raw_device_id: str) -> _Write:
    event = router.current_event
    return _Write(parse.device_id(raw_device_id), parse.Preconditions.of(event), idempotency_key(event),
                  parse.lease_token(parse.single_header(event, parse.LEASE_TOKEN), parse.LEASE_TOKEN))


def _is_the_device(device_id: str) -> bool:
    return access.principal_of(router.current_event).device_id == device_id


def _seen(device) -> None:
    """After a read: the device reading itself is seen (at most once a minute; never fails the read)."""
    if _is_the_device(device.device_id):
        try:
            manager().saw(device)
        except DeviceStateError as error:
            logger.warning("lastSeen not recorded", extra={"reason": str(error)})


def _require_if_match(preconditions: parse.Preconditions, method: str) -> None:
    if preconditions.if_match is None and api_config().require_if_match:
        raise PreconditionRequired(f"{method} needs If-Match with the device's ETag on this server")


def _expected_version(device_id: str, preconditions: parse.Preconditions) -> int:
    """The version a conditional write must find: a lone If-Match names it; any other
    combination is checked against the current device, which the write then pins."""
    version = preconditions.only_if_match_version()
    if version is None:
        current = as_caller(router.current_event, device_id).get(device_id)
        preconditions.check(current)
        version = current.version
    return version


def _state_body(device_id: str) -> tuple[dict, dict]:
    """The state and the sections (desired, reported) a PUT names."""
    body = parse.json_object(parse.json_body(router.current_event), "the body", ("state",),
                             ("deviceId", *DEVICE_SECTIONS))
    if "deviceId" in body and body["deviceId"] != device_id:
        raise BadRequest("deviceId in the body differs from the one in the path")
    return body["state"], _sections(body)


def _sections(body: dict) -> dict:
    return {section: parse.document(body[section], section) for section in DEVICE_SECTIONS if section in body}


def _patch_function():
    event = router.current_event
    kind = parse.media_type(event)
    document = parse.json_body(event, (parse.MERGE_PATCH, parse.JSON, parse.JSON_PATCH))
    return JsonPatch(document) if kind == parse.JSON_PATCH else MergePatch(document)


@route(router, "/devices", "GET", "HEAD", query=("limit", "cursor", parse.INCLUDE, "filter", "sort"))
def list_devices():
    """The fleet in key order, or, with ``filter``, the devices it matches (fleet query)."""
    query = parse.query(router.current_event)
    raw_limit = query.get("limit", str(DEFAULT_LIST_LIMIT))
    if not raw_limit.isascii() or not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT:
        raise BadRequest(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}")
    cursor = parse.cursor(query.get("cursor"))
    if "filter" in query:
        devices, next_cursor = manager().query_devices(query["filter"], int(raw_limit), cursor, query.get("sort"))
    elif "sort" in query:
        raise BadRequest("sort orders the devices a filter finds: give a filter too, e.g. "
                         "filter=exists(reported/battery)&sort=-reported/battery")
    else:
        devices, next_cursor = manager().list_devices(limit=int(raw_limit), cursor=cursor)
    metadata = parse.include_metadata(router.current_event)
    return json_response({"items": [device.as_dict(metadata) for device in devices], "nextCursor": next_cursor})


@route(router, "/devices/count", "GET", "HEAD", query=("filter", "groupBy"))
def count_devices():
    """How many devices a filter matches, grouped by a declared field's value on request."""
    query = parse.query(router.current_event)
    if "filter" not in query:
        raise BadRequest("count needs a filter, e.g. /devices/count?filter=eq(reported/online,true)")
    return json_response(manager().count_devices(query["filter"], query.get("groupBy")))


@route(router, "/devices", "POST", query=(parse.INCLUDE,), headers=(parse.IDEMPOTENCY_KEY,),
       body=True)
def create_device():
    event = router.current_event
    body = parse.json_object(parse.json_body(event), "the body", ("deviceId", "state"), DEVICE_SECTIONS)
    device_id = parse.not_reserved(validate_device_id(body["deviceId"]))
    sections = _sections(body)
    access.check_write(event, WriteKind.CREATE, device_id, sections)
    key = idempotency_key(event)
    replayed = replay(event, device_id, key)
    if replayed:
        return replayed
    return write_response(event, manager().create(device_id, body["state"], sections=sections, idempotency=key),
                          CREATED)


@route(router, "/devices/<device_id>", "GET", "HEAD", query=(parse.INCLUDE,),
       headers=(parse.IF_MATCH, parse.IF_NONE_MATCH), reads_holder=True)
def get_device(device_id: str):
    device_id = parse.device_id(device_id)
    preconditions = parse.Preconditions.of(router.current_event)
    device = as_caller(router.current_event, device_id).get(device_id)
    _seen(device)
    return _not_modified(device, preconditions) or device_response(
        device, metadata=parse.include_metadata(router.current_event))


def _not_modified(device, preconditions: parse.Preconditions) -> Response | None:
    """RFC 9110 13.2.2 for a read: If-Match (strong) first, 412 when false; then
    If-None-Match (weak), a 304 when it matches; None when the read answers in full."""
    _if_match(device, preconditions)
    if (preconditions.if_none_match is not None and preconditions.if_none_match.matches_weak(device.version)
            and not device.changed_since_written()):  # an expired desire changed this version's delta
        return Response(status_code=304, headers={"ETag": etag(device.version)})
    return None


def _if_match(device, preconditions: parse.Preconditions) -> None:
    if preconditions.if_match is not None and not preconditions.if_match.matches_strong(device.version):
        raise PreconditionFailed("If-Match does not match the device", current=device)


@route(router, "/devices/<device_id>", "PUT", **DEVICE_WRITE)
def put_device(device_id: str):
    event = router.current_event
    write = _device_write(device_id)
    device_id, preconditions, key = write.device_id, write.preconditions, write.key
    state, sections = _state_body(device_id)
    access.check_write(event, WriteKind.PUT, device_id, sections)
    replayed = write.replayed()
    if replayed:
        return replayed
    writer = write.writer()
    if preconditions.create_only or (preconditions.none and api_config().require_if_match):
        try:
            device = writer.create(device_id, state, sections=sections, idempotency=key)
        except DeviceAlreadyExists as exists:
            if preconditions.create_only:
                raise PreconditionFailed("If-None-Match: * but the device exists", current=exists.current) from None
            raise PreconditionRequired("replacing a device needs If-Match on this server") from None
        return write_response(event, device, CREATED)
    if preconditions.none:
        device, created = writer.put(device_id, state, sections=sections, idempotency=key)
        return write_response(event, device, CREATED if created else REPLACED)
    try:
        current = writer.get(device_id)
    except DeviceNotFound:
        current = None
    preconditions.check(current)
    if current is None:
        try:
            return write_response(event, writer.create(device_id, state, sections=sections, idempotency=key),
                                  CREATED)
        except DeviceAlreadyExists as exists:
            raise PreconditionFailed("the device was created meanwhile", current=exists.current) from None
    _require_if_match(preconditions, "PUT")
    try:
        return write_response(event, writer.replace(device_id, state, current.version, sections=sections,
                                                    idempotency=key), REPLACED)
    except DeviceNotFound:
        raise PreconditionFailed("the device was deleted meanwhile") from None


@route(router, "/devices/<device_id>", "PATCH", **DEVICE_WRITE)
def patch_device(device_id: str):
    return _patch_section(device_id, STATE)


@route(router, "/devices/<device_id>/desired", "PATCH", **DESIRED_WRITE)
def patch_desired(device_id: str):
    return _patch_section(device_id, DESIRED)


@route(router, "/devices/<device_id>/reported", "PATCH", **DEVICE_WRITE)
def patch_reported(device_id: str):
    return _patch_section(device_id, REPORTED)


@route(router, "/devices/<device_id>/desired", "PUT", **DESIRED_WRITE)
def put_desired(device_id: str):
    return _put_section(device_id, DESIRED)


@route(router, "/devices/<device_id>/reported", "PUT", **DEVICE_WRITE)
def put_reported(device_id: str):
    return _put_section(device_id, REPORTED)


@route(router, "/devices/<device_id>/desired/acks", "POST", query=(parse.INCLUDE,),
       headers=(parse.IDEMPOTENCY_KEY, parse.LEASE_TOKEN), body=True, reads_holder=True)
def acknowledge_desired(device_id: str):
    """The device's answers to desires: applied, in progress, refused or failed, per leaf."""
    write = _device_write(device_id)
    acks = parse.acks(parse.json_body(router.current_event))
    replayed = write.replayed()
    if replayed:
        return replayed
    device = write.writer().acknowledge(write.device_id, acks, idempotency=write.key)
    return write_response(router.current_event, device, UPDATED)


@route(router, "/devices/<device_id>/delta", "GET", "HEAD", query=("since", "waitSeconds"),
       headers=(parse.IF_MATCH, parse.IF_NONE_MATCH), reads_holder=True)
def get_delta(device_id: str):
    """The lean document a device acts on. Waits up to ``waitSeconds`` for a write after
    version ``since`` (without it: the version found first) to change desired or reported."""
    event = router.current_event
    device_id = parse.device_id(device_id)
    query = parse.query(event)
    since = parse.integer(query, "since", None, 0, parse.MAX_VERSION)
    wait = parse.integer(query, "waitSeconds", 0, 0, MAX_DELTA_WAIT_SECONDS)
    preconditions = parse.Preconditions.of(event)
    reader = as_caller(event, device_id)
    device = reader.get(device_id) if since is None or preconditions.if_match is not None else None
    if device is not None:
        _if_match(device, preconditions)  # a false If-Match is answered at once, not after the wait
    if wait and since is None:
        since = device.version  # waits for the next change from the version it found
    if since is not None:
        device = reader.wait_for_sections(device_id, since, wait_budget(router.lambda_context, wait))
    _seen(device)
    shown = device.as_dict()
    return _not_modified(device, preconditions) or json_response(
        {key: shown[key] for key in ("deviceId", "version", "delta")}, headers={"ETag": etag(device.version)})


def _put_section(device_id: str, section: str):
    """Replace one section whole: body ``{"<section>": {...}}``."""
    write = _device_write(device_id)
    device_id, preconditions = write.device_id, write.preconditions
    body = parse.json_object(parse.json_body(router.current_event), "the body", (section,))
    document = parse.document(body[section], section)
    desire = parse.desire_options(router.current_event) if section == DESIRED else None
    replayed = write.replayed()
    if replayed:
        return replayed
    _require_if_match(preconditions, "PUT")
    expected = None if preconditions.none else _expected_version(device_id, preconditions)
    device = write.writer().replace_section(device_id, section, document, expected, idempotency=write.key,
                                            desire=desire)
    return write_response(router.current_event, device, REPLACED)


def _patch_section(device_id: str, section: str):
    write = _device_write(device_id)
    device_id, preconditions, key = write.device_id, write.preconditions, write.key
    update_fn = _patch_function()
    desire = parse.desire_options(router.current_event) if section == DESIRED else None
    replayed = write.replayed()
    if replayed:
        return replayed
    _require_if_match(preconditions, "PATCH")
    writer = write.writer()
    started = time.perf_counter()
    try:
        if preconditions.none:
            device = writer.update_with_retry(device_id, update_fn, budget_seconds=budget(router.lambda_context),
                                              idempotency=key, section=section, desire=desire)
        else:
            device = writer.update(device_id, update_fn, _expected_version(device_id, preconditions),
                                   idempotency=key, section=section, desire=desire)
    finally:
        record_patch_latency((time.perf_counter() - started) * 1000)
    return write_response(router.current_event, device, UPDATED)


@route(router, "/devices/<device_id>", "DELETE", headers=parse.SERVICE_HEADERS, reads_holder=True)
def delete_device(device_id: str):
    write = _device_write(device_id)
    replayed = write.replayed()
    if replayed:
        return replayed
    _require_if_match(write.preconditions, "DELETE")
    expected = None if write.preconditions.none else _expected_version(write.device_id, write.preconditions)
    device = write.writer().delete(write.device_id, expected, idempotency=write.key)
    return write_response(router.current_event, device, DELETED)
