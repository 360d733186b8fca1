"""Routes of one device and of the collection: check preconditions, call the library (each
request comes parsed and authorized by its declaration, ``routes``). The PUT decision tree
lives here."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

from .resolver import Response
from .resolver import Router

from functions.device_state import (CREATED, DELETED, DESIRED, REPLACED, REPORTED, STATE, UPDATED,
                                    DeviceAlreadyExists, DeviceNotFound, DeviceStateError, DeviceStateManager,
                                    IdempotencyKey)

from . import request_parsing as parse
from .common import (as_caller, budget, device_response, idempotency_key, include_metadata, json_response, manager,
                     replay, route, wait_budget, write_response)
from .routes import Request
from functions.config import api_config
from .observability import record_patch_latency
from .problems import BadRequest, PreconditionFailed, PreconditionRequired, etag

router = Router()
logger = logging.getLogger("device_state.api")


@dataclass(frozen=True)
class _Write:
    """What every write to one device takes from its request before anything is read or
    written: its id, preconditions, idempotency key and lease token."""

    request: Request
    device_id: str
    preconditions: parse.Preconditions
    key: IdempotencyKey | None
    lease_token: str | None

    @classmethod
    def of(cls, request: Request) -> "_Write":
        return cls(request, request.path["device_id"], parse.Preconditions.of(request), idempotency_key(request),
                   request.headers.get(parse.LEASE_TOKEN))

    def writer(self) -> DeviceStateManager:
        """The manager for this write, fenced by its Lease-Token if any; the device's own
        write records it as seen, and finds the credential it comes with on the item."""
        writer = manager() if self.lease_token is None else manager().fenced({self.device_id: self.lease_token})
        return as_caller(self.request, self.device_id, writer)

    def replayed(self):
        """The recorded answer when this write's idempotency key was already used."""
        return replay(self.request, self.device_id, self.key)

    def answered(self, act: Callable[[], Response]) -> Response:
        """The key's recorded answer when the key was used already, else ``act()``'s. A keyed
        write refused here, before the library wrote (its preconditions checked against the
        device read), looks for its record again: the same request with the same key may have
        landed after the first look and changed what the preconditions found (the library looks
        again for the refusals it makes itself)."""
        replayed = self.replayed()
        if replayed:
            return replayed
        try:
            return act()
        except (PreconditionFailed, _AbsentBeforeTheWrite):
            replayed = self.replayed() if self.key is not None else None
            if replayed is None:
                raise
            return replayed


class _AbsentBeforeTheWrite(DeviceNotFound):
    """The device a write's preconditions are checked against is not there (404, as any)."""


def _is_the_device(request: Request, device_id: str) -> bool:
    return request.principal.device_id == device_id


def _seen(request: Request, device) -> None:
    """After a read: the device reading itself is seen (at most once a minute; never fails the read)."""
    if _is_the_device(request, device.device_id):
        try:
            manager().saw(device)
        except DeviceStateError as error:
            logger.warning("lastSeen not recorded", extra={"reason": str(error)})


def _require_if_match(preconditions: parse.Preconditions, method: str) -> None:
    if preconditions.if_match is None and api_config().require_if_match:
        raise PreconditionRequired(f"{method} needs If-Match with the device's ETag on this server")


def _expected_version(request: Request, device_id: str, preconditions: parse.Preconditions) -> int:
    """The version a conditional write must find: a lone If-Match names it; any other
    combination is checked against the current device, which the write then pins."""
    version = preconditions.only_if_match_version()
    return _checked(request, device_id, preconditions).version if version is None else version


def _checked(request: Request, device_id: str, preconditions: parse.Preconditions, *, absent_ok: bool = False):
    """The device as it is now, the preconditions checked against it (412); None when it is not
    there and ``absent_ok``, else 404."""
    try:
        current = as_caller(request, device_id).get(device_id)
    except DeviceNotFound:
        if not absent_ok:
            raise _AbsentBeforeTheWrite(device_id) from None
        current = None
    preconditions.check(current)
    return current


def _sections(body: dict) -> dict:
    """The sections beside the state a create or a put names (desired, reported)."""
    return {section: body[section] for section in (DESIRED, REPORTED) if section in body}


@route(router, "listDevices")
def list_devices(request: Request):
    """The fleet in key order, or, with ``filter``, the devices it matches (fleet query)."""
    query = request.query
    limit, cursor = query["limit"], query.get("cursor")
    if "filter" in query:
        devices, next_cursor = manager().query_devices(query["filter"], limit, cursor, query.get("sort"))
    elif "sort" in query:
        raise BadRequest("sort orders the devices a filter finds: give a filter too, e.g. "
                         "filter=exists(reported/battery)&sort=-reported/battery")
    else:
        devices, next_cursor = manager().list_devices(limit=limit, cursor=cursor)
    metadata = include_metadata(request)
    return json_response({"items": [device.as_dict(metadata) for device in devices], "nextCursor": next_cursor})


@route(router, "countDevices")
def count_devices(request: Request):
    """How many devices a filter matches, grouped by a declared field's value on request."""
    return json_response(manager().count_devices(request.query["filter"], request.query.get("groupBy")))


@route(router, "createDevice")
def create_device(request: Request):
    body = request.body
    device_id = body["deviceId"]
    key = idempotency_key(request)
    replayed = replay(request, device_id, key)
    if replayed:
        return replayed
    return write_response(request, manager().create(device_id, body["state"], sections=_sections(body),
                                                    idempotency=key), CREATED)


@route(router, "getDevice", reads_holder=True)
def get_device(request: Request):
    preconditions = parse.Preconditions.of(request)
    device_id = request.path["device_id"]
    device = as_caller(request, device_id).get(device_id)
    _seen(request, device)
    return _not_modified(device, preconditions) or device_response(device, metadata=include_metadata(request))


def _not_modified(device, preconditions: parse.Preconditions) -> Response | None:
    """RFC 9110 13.2.2 for a read: If-Match (strong) first, 412 when false; then
    If-None-Match (weak), a 304 when it matches; None when the read answers in full."""
    _if_match(device, preconditions)
    return _unchanged(device, preconditions)


def _unchanged(device, preconditions: parse.Preconditions) -> Response | None:
    """If-None-Match (weak): a 304 when it matches the device read."""
    if (preconditions.if_none_match is not None and preconditions.if_none_match.matches_weak(device.version)
            and not device.changed_since_written()):  # an expired desire changed this version's delta
        return Response(status_code=304, headers={"ETag": etag(device.version)})
    return None


def _if_match(device, preconditions: parse.Preconditions) -> None:
    if preconditions.if_match is not None and not preconditions.if_match.matches_strong(device.version):
        raise PreconditionFailed("If-Match does not match the device", current=device)


@route(router, "putDevice", reads_holder=True)
def put_device(request: Request):
    write = _Write.of(request)
    body = request.body
    if "deviceId" in body and body["deviceId"] != write.device_id:
        raise BadRequest("deviceId in the body differs from the one in the path")
    return write.answered(lambda: _put(request, write, body["state"], _sections(body)))


def _put(request: Request, write: _Write, state: dict, sections: dict):
    """PUT's decision tree: create, put, or replace under the preconditions."""
    device_id, preconditions, key = write.device_id, write.preconditions, write.key
    writer = write.writer()
    if preconditions.create_only or (preconditions.none and api_config().require_if_match):
        try:
            device = writer.create(device_id, state, sections=sections, idempotency=key)
        except DeviceAlreadyExists as exists:
            if preconditions.create_only:
                raise PreconditionFailed("If-None-Match: * but the device exists", current=exists.current) from None
            raise PreconditionRequired("replacing a device needs If-Match on this server") from None
        return write_response(request, device, CREATED)
    if preconditions.none:
        device, created = writer.put(device_id, state, sections=sections, idempotency=key)
        return write_response(request, device, CREATED if created else REPLACED)
    current = _checked(request, device_id, preconditions, absent_ok=True)
    if current is None:
        try:
            return write_response(request, writer.create(device_id, state, sections=sections, idempotency=key),
                                  CREATED)
        except DeviceAlreadyExists as exists:
            raise PreconditionFailed("the device was created meanwhile", current=exists.current) from None
    _require_if_match(preconditions, "PUT")
    try:
        return write_response(request, writer.replace(device_id, state, current.version, sections=sections,
                                                      idempotency=key), REPLACED)
    except DeviceNotFound:
        raise PreconditionFailed("the device was deleted meanwhile") from None


@route(router, "patchDevice", reads_holder=True)
def patch_device(request: Request):
    return _patch_section(request, STATE)


@route(router, "patchDesired", reads_holder=True)
def patch_desired(request: Request):
    return _patch_section(request, DESIRED)


@route(router, "patchReported", reads_holder=True)
def patch_reported(request: Request):
    return _patch_section(request, REPORTED)


@route(router, "putDesired", reads_holder=True)
def put_desired(request: Request):
    return _put_section(request, DESIRED)


@route(router, "putReported", reads_holder=True)
def put_reported(request: Request):
    return _put_section(request, REPORTED)


@route(router, "acknowledgeDesired", reads_holder=True)
def acknowledge_desired(request: Request):
    """The device's answers to desires: applied, in progress, refused or failed, per leaf."""
    write = _Write.of(request)
    return write.answered(lambda: write_response(
        request, write.writer().acknowledge(write.device_id, request.body["acks"], idempotency=write.key), UPDATED))


@route(router, "getDelta", reads_holder=True)
def get_delta(request: Request):
    """The lean document a device acts on. Waits up to ``waitSeconds`` for a write after
    version ``since`` (without it: the version found first) to change desired or reported."""
    device_id = request.path["device_id"]
    since, wait = request.query.get("since"), request.query["waitSeconds"]
    preconditions = parse.Preconditions.of(request)
    reader = as_caller(request, device_id)
    device = reader.get(device_id) if since is None or preconditions.if_match is not None else None
    if device is not None:  # If-Match is judged on the device as the request found it, not after the wait
        _if_match(device, preconditions)
    if wait and since is None:
        since = device.version  # waits for the next change from the version it found
    if since is not None:
        device = reader.wait_for_sections(device_id, since, wait_budget(request.context, wait))
    _seen(request, device)
    shown = device.as_dict()
    return _unchanged(device, preconditions) or json_response(
        {key: shown[key] for key in ("deviceId", "version", "delta")}, headers={"ETag": etag(device.version)})


def _put_section(request: Request, section: str):
    """Replace one section whole: body ``{"<section>": {...}}``."""
    write = _Write.of(request)
    device_id, preconditions = write.device_id, write.preconditions

    def put():
        _require_if_match(preconditions, "PUT")
        expected = None if preconditions.none else _expected_version(request, device_id, preconditions)
        device = write.writer().replace_section(device_id, section, request.body[section], expected,
                                                idempotency=write.key, desire=parse.desire_options(request.query))
        return write_response(request, device, REPLACED)
    return write.answered(put)


def _patch_section(request: Request, section: str):
    write = _Write.of(request)
    device_id, preconditions, key = write.device_id, write.preconditions, write.key
    update_fn, desire = request.body, parse.desire_options(request.query)

    def patch():
        _require_if_match(preconditions, "PATCH")
        writer = write.writer()
        started = time.perf_counter()
        try:
            if preconditions.none:
                device = writer.update_with_retry(device_id, update_fn, budget_seconds=budget(request.context),
                                                  idempotency=key, section=section, desire=desire)
            else:
                device = writer.update(device_id, update_fn, _expected_version(request, device_id, preconditions),
                                       idempotency=key, section=section, desire=desire)
        finally:
            record_patch_latency((time.perf_counter() - started) * 1000)
        return write_response(request, device, UPDATED)
    return write.answered(patch)


@route(router, "deleteDevice", reads_holder=True)
def delete_device(request: Request):
    write = _Write.of(request)

    def delete():
        _require_if_match(write.preconditions, "DELETE")
        expected = None if write.preconditions.none else _expected_version(request, write.device_id,
                                                                            write.preconditions)
        return write_response(request, write.writer().delete(write.device_id, expected, idempotency=write.key),
                              DELETED)
    return write.answered(delete)
