"""The WebSocket API's routes (API Gateway WebSocket events; `make serve` feeds it the same):
``$connect`` (the caller authenticated as on the HTTP routes), ``subscribe``, ``unsubscribe``,
``$default`` (anything else: an error message), ``$disconnect``. Every client message is
answered with a message (``subscribed``, ``unsubscribed`` or ``error``); the connection
stays open after an error."""

from __future__ import annotations

import json
import logging
import os
import time
import warnings

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

from functions.auth import rights
from functions.auth.authorizer import principal_of
from functions.auth.credentials import (LEEWAY_SECONDS, WEBSOCKET_SUBPROTOCOL, MixedCredentials, Unauthenticated,
                                        websocket_subprotocols)
from functions.auth.principals import DEVICE
from functions.config import push_config
from functions.device_state import (MAX_VERSION, SECTIONS, ChangesExpired, CredentialRevoked, DeviceNotFound,
                                    InvalidDeviceId, InvalidSince, OutcomeUnknown, StorageUnavailable,
                                    TooManyConnections, metrics as names, validate_device_id)

from . import connections
from .delivery import CATCH_UP_SECONDS, PAGE, CatchUpStopped, Delivery, Gone, PostFailed, error_message
from .services import devices, forget, services
from .subscriptions import Subscriptions, TooManySubscriptions, UnknownConnection

logger = logging.getLogger("device_state.push")
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or names.NAMESPACE,
                  service=names.SERVICE)
warnings.filterwarnings("ignore", message="No application metrics to publish")  # most events emit none
MAX_MESSAGE_CHARS = 4096  # a client's message (subscribe/unsubscribe) is small
# Each action's members: any other member is a bad-message, as on the HTTP routes' bodies.
MEMBERS = {"ping": {"action"}, "unsubscribe": {"action", "deviceId"},
           "subscribe": {"action", "deviceId", "since", "sections"}}
# A connect over a device's cap tries again after this: one of its connections must close first.
CONNECT_RETRY_AFTER_SECONDS = "1"


class BadMessage(Exception):
    def __init__(self, slug: str, title: str, detail: str, status: int = 400, **members):
        super().__init__(detail)
        self.message = error_message(slug, title, detail, status, **members)


@metrics.log_metrics
def lambda_handler(event, _context):
    context = event["requestContext"]
    route, connection_id = context["routeKey"], context["connectionId"]
    subscriptions, delivery = services()
    if route == "$connect":
        try:
            principal = principal_of(event)
        except (Unauthenticated, MixedCredentials):
            return {"statusCode": 401}
        ends = subscriptions.ends(_credential_ends(principal))  # once: $disconnect names the member by the item's end
        holder = principal.holder(push_config().require_registered_credentials)
        try:
            subscriptions.open(connection_id, principal.subject, ends, holder)
        except StorageUnavailable as error:
            return _unavailable(error)
        if principal.kind == DEVICE:
            # After the connection item, so that a connect refused from here on leaves only that item to
            # expire unused, never a member of the device's connectivity counting against its cap.
            forgotten: list[str] = []  # at its cap: held connections found closed, then forgotten
            try:  # the device must still hold the credential it comes with: checked in the connect's own write
                known = devices().as_device(principal.device_id, holder).connected(  # at its cap, closed ones go
                    principal.device_id, connection_id, ends,
                    closed=lambda held: _closed(subscriptions, held, forgotten))
            except CredentialRevoked:
                metrics.add_metric(name=names.REVOKED_CREDENTIAL_REQUESTS, unit=MetricUnit.Count, value=1)
                return {"statusCode": 401}
            except TooManyConnections:  # API Gateway refuses the upgrade with this status
                metrics.add_metric(name=names.CONNECTIONS_REFUSED, unit=MetricUnit.Count, value=1)
                return {"statusCode": 429, "headers": {"Retry-After": CONNECT_RETRY_AFTER_SECONDS}}
            except (StorageUnavailable, OutcomeUnknown) as error:  # neither the cap nor the credential checked
                forgotten.clear()  # their forgetting may not be written: the connect sent again counts them
                return _unavailable(error)
            finally:
                if forgotten:
                    metrics.add_metric(name=names.CONNECTIONS_FORGOTTEN, unit=MetricUnit.Count, value=len(forgotten))
            if not known:  # no such device: nothing would count this connection against its cap
                metrics.add_metric(name=names.CONNECTIONS_REFUSED, unit=MetricUnit.Count, value=1)
                return {"statusCode": 404}
        return _connected(event)
    if route == "$disconnect":
        forget(subscriptions, connection_id)
        return {"statusCode": 200}
    try:
        answer = _message(event, subscriptions, delivery, connection_id)
    except BadMessage as bad:
        answer = bad.message
    except Gone:
        forget(subscriptions, connection_id)
        return {"statusCode": 200}
    except (StorageUnavailable, OutcomeUnknown) as error:  # a 5xx error message: clients connect again
        logger.warning("message not served", extra={"reason": str(error)})
        answer = error_message("storage-unavailable", "Storage temporarily unavailable",
                               "Storage is unavailable for now: connect again, and subscribe from the last "
                               "version seen.", 503)
    if answer is not None:
        try:
            connections.post(connection_id, answer)
        except Gone:
            forget(subscriptions, connection_id)
        except Exception as error:  # noqa: BLE001 - the client's next message is answered afresh
            logger.warning("answer not posted", extra={"reason": str(error)})
    return {"statusCode": 200}


def _unavailable(error: Exception) -> dict:
    """A connect storage did not take: the client connects again (after Retry-After where the
    gateway passes it on)."""
    logger.warning("connect not recorded", extra={"reason": str(error)})
    return {"statusCode": 503, "headers": {"Retry-After": CONNECT_RETRY_AFTER_SECONDS}}


def _credential_ends(principal) -> int | None:
    """When what the connection was opened with ends: its token, as the routes accept it (to its
    expiry and the leeway), but never after the device's credential itself expires."""
    ends = [moment for moment in (None if principal.expires_at is None else principal.expires_at + LEEWAY_SECONDS,
                                  principal.credential_expires_at) if moment is not None]
    return min(ends) if ends else None


def _connected(event: dict) -> dict:
    """A connect's answer: a client that offered the service's subprotocol (a browser sending its
    token as ``bearer.<token>`` beside it) gets it selected, as a browser requires of any connect
    that offered subprotocols; API Gateway passes this one header of the answer on to the client.
    The token's own entry is never echoed."""
    if WEBSOCKET_SUBPROTOCOL in websocket_subprotocols(event):
        return {"statusCode": 200, "headers": {"Sec-WebSocket-Protocol": WEBSOCKET_SUBPROTOCOL}}
    return {"statusCode": 200}


def _message(event: dict, subscriptions: Subscriptions, delivery: Delivery, connection_id: str) -> dict | None:
    try:  # first, as on the HTTP routes: every message on a connection past its token's expiry is a 401
        principal = principal_of(event)
    except (Unauthenticated, MixedCredentials) as error:  # the token the connection was opened with expired
        raise BadMessage("unauthorized", "Unauthorized", f"{error}: connect again with a fresh token, and subscribe "
                                                         "from the last version you have", 401) from None
    body = _body(event.get("body"))
    action = body.get("action")
    if not isinstance(action, str) or action not in MEMBERS:
        raise BadMessage("unknown-action", "Unknown action", 'action must be "subscribe", "unsubscribe" or "ping"')
    _only(body, MEMBERS[action])
    if action == "ping":  # keeps the connection from API Gateway's 10-minute idle timeout
        return {"type": "pong"}
    device_id = _device_id(body)
    refused = rights.first_refused(principal, rights.needed_to_follow(device_id))
    if refused is not None:
        raise BadMessage("forbidden", "Forbidden", f"this caller may not follow {device_id}", 403,
                         action=refused[0], resource=refused[1])
    if action == "unsubscribe":
        subscriptions.unsubscribe(connection_id, device_id)
        return {"type": "unsubscribed", "deviceId": device_id}
    # A device following itself must still hold its credential: the feed's read checks it on the state item.
    holder = principal.holder(push_config().require_registered_credentials)
    try:
        since, sections = _since(body), _sections(body)
    except BadMessage:  # refused on the message alone: a revoked credential hears 401 all the same (one read)
        if holder is not None:
            try:
                devices().as_device(device_id, holder).check_holder(device_id)
            except (CredentialRevoked, DeviceNotFound) as error:
                _refuse_revoked(error, device_id, holder)
        raise
    known = []  # the first page of the catch-up, read with the check (a device's own read reads its state item too)
    try:
        known = delivery.log.read(device_id, since, PAGE, holder)  # a since the feed would refuse is refused here
    except CredentialRevoked as revoked:
        _refuse_revoked(revoked, device_id, holder)
    except ChangesExpired as expired:
        raise BadMessage("changes-expired", "Changes past the retention", str(expired), 410, deviceId=device_id,
                         currentVersion=expired.current_version) from None
    except InvalidSince as invalid:
        raise BadMessage("invalid-since", "Invalid since", str(invalid)) from None
    except DeviceNotFound as missing:  # a back-end may follow a device not created yet from 0 (a device's own
        _refuse_revoked(missing, device_id, holder)  # connect waits for it): its first change comes by fan-out
        if since:
            raise BadMessage("invalid-since", "Invalid since", f"{device_id} has no version yet: subscribe from 0") \
                from None
    try:
        subscription = subscriptions.subscribe(connection_id, device_id, since, sections,
                                               own=principal.device_id == device_id)
    except TooManySubscriptions as error:
        raise BadMessage("too-many-subscriptions", "Too many subscriptions", str(error), 429) from None
    except UnknownConnection:
        raise Gone(connection_id) from None
    connections.post(connection_id, {"type": "subscribed", "deviceId": device_id, "since": since,
                                     "sections": list(sections)})
    try:  # catch-up: every change after since, then the fan-out's
        delivery.advance(subscription, known=known, until=time.monotonic() + CATCH_UP_SECONDS)
    except ChangesExpired as expired:
        subscriptions.unsubscribe(connection_id, device_id)
        raise BadMessage("changes-expired", "Changes past the retention", str(expired), 410, deviceId=device_id,
                         currentVersion=expired.current_version) from None
    except (PostFailed, CatchUpStopped) as stopped:  # the subscription stays: the fan-out goes on from there
        logger.warning("catch-up stopped", extra={"reason": str(stopped)})
        raise BadMessage("catch-up-stopped", "Catch-up stopped", f"The changes after since were not all sent "
                         f"({stopped}): subscribe again from the last version kept", 503, deviceId=device_id) from None
    return None


def _closed(subscriptions: Subscriptions, held: list[str], found: list[str]) -> set[str]:
    """Of a device's ``held`` connections, those closed although the device still counts them
    (their item gone, or API Gateway answering them gone), also added to ``found``."""
    gone = subscriptions.closed(held, connections.known_gone)
    found.extend(sorted(gone))
    return gone


def _refuse_revoked(error: Exception, device_id: str, holder) -> None:
    """401 for a device's own subscription whose credential the item no longer holds: revoked, or
    gone with its deleted device (a certificate of the trusted CA that registered none still opens
    a device not created yet)."""
    if isinstance(error, CredentialRevoked):
        raise BadMessage("credential-revoked", "The credential is revoked or not registered", str(error), 401) \
            from None
    if holder is not None and not holder.admits(None, time.time()):
        raise BadMessage("credential-revoked", "The credential is revoked or not registered",
                         f"{device_id} holds no credential: it was deleted", 401) from None


def _body(raw) -> dict:
    if not isinstance(raw, str) or len(raw) > MAX_MESSAGE_CHARS:
        raise BadMessage("bad-message", "Bad message", f"a message is a JSON object of at most {MAX_MESSAGE_CHARS} "
                                                       "characters")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise BadMessage("bad-message", "Bad message", "the message is not JSON, or is nested too deep") from None
    if not isinstance(body, dict):
        raise BadMessage("bad-message", "Bad message", "the message must be a JSON object")
    return body


def _only(body: dict, allowed: set) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        # as JSON escapes it: a name may hold a lone surrogate (\\ud800 in the message), which no answer can carry
        raise BadMessage("bad-message", "Bad message", f"unknown member {json.dumps(unknown[0])}")


def _device_id(body: dict) -> str:
    try:
        return validate_device_id(body.get("deviceId"))
    except InvalidDeviceId as error:
        raise BadMessage("invalid-device-id", "Invalid deviceId", str(error)) from None


def _since(body: dict) -> int:
    since = body.get("since")
    if isinstance(since, bool) or not isinstance(since, int) or not 0 <= since <= MAX_VERSION:
        raise BadMessage("bad-message", "Bad message", "since must be an integer version, 0 or more: the last "
                                                       "version the client has (0 for everything)")
    return since


def _sections(body: dict) -> tuple:
    sections = body.get("sections", list(SECTIONS))
    if (not isinstance(sections, list) or not sections or not all(isinstance(name, str) for name in sections)
            or len(set(sections)) != len(sections) or any(name not in SECTIONS for name in sections)):
        raise BadMessage("bad-message", "Bad message", f"sections must be a list of {', '.join(SECTIONS)}")
    return tuple(sections)
