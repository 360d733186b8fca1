"""The one door to the service's HTTP API, shared by the device's client and the app's: one
request with its credentials, and the retry of a request the service may be asked again,
a write always under one Idempotency-Key."""

from __future__ import annotations

import http.client
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

from .backoff import Backoff
from .credentials import CredentialsError
from .errors import ApiError, OutcomeUnknown, error_for, retry_after
from .values import dumps, loads

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# Answers after which the same request, with the same Idempotency-Key, may be sent again: the
# service wrote nothing (429, 503) or may have written once (504, another 5xx), and the key makes
# a second copy replay the first answer instead of applying twice.
RETRIED_STATUSES = {429, 500, 502, 503, 504}
# Answers a gateway or the service gives before it looks at a write's Idempotency-Key (a token
# run out, throttling, a busy service): after a copy of the write went unanswered, the last of
# them says nothing of what became of that copy.
ANSWERED_BEFORE_THE_KEY = {401, 429, 503}
# Answers after which a request that is not idempotent (a lease's grant) may be sent again: nothing was written.
NOTHING_WRITTEN = {429, 503}
# The longest Retry-After waited out before sending again (the service asks 1 s to 30 s); one longer
# (a proxy's, a day) is answered to the caller as the refusal it came with.
MAX_RETRY_AFTER_SECONDS = 60
# The API refuses a larger body (413) before reading it all: sent, it would meet a closed
# connection mid-body, no answer, rather than the 413.
MAX_BODY_BYTES = 1024 * 1024


def item_path(collection: str, item_id: str) -> str:
    """The path of one item of a collection (a device of ``devices``, a job of ``jobs``);
    ``ValueError`` for an empty id, whose path would name the collection."""
    if not item_id:
        raise ValueError(f"an id in {collection} is not empty")
    return f"{collection}/{urllib.parse.quote(item_id, safe='')}"


def device_path(device_id: str) -> str:
    return item_path("devices", device_id)


class _Refused(urllib.request.HTTPRedirectHandler):
    """The service never redirects: a 3xx (an http:// endpoint a load balancer sends to https://,
    a wrong path) is answered as it is, never followed (urllib would send a POST on as a GET, and
    the token to wherever ``Location`` names)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class Service:
    """``base_url`` is the API's (ending in ``/prod/`` deployed); ``websocket_url`` defaults to
    its ``/ws`` (as ``make serve`` serves it; deployed, the stack output ``WebSocketUrl``).
    ``ssl_context``: TLS settings of your own for HTTPS and WSS. ``exact_numbers``: numbers
    with a fraction come back as ``Decimal``, not ``float``."""

    exact_numbers = False

    def __init__(self, base_url: str, credentials, *, websocket_url: str | None = None,
                 ssl_context: ssl.SSLContext | None = None, timeout: float = 30, write_attempts: int = 6,
                 sleep=time.sleep):
        self.base_url = base_url.rstrip("/") + "/"
        self.credentials = credentials
        scheme, rest = self.base_url.split("://", 1)
        self.websocket_url = websocket_url or f"{'wss' if scheme == 'https' else 'ws'}://{rest}ws"
        self.ssl_context = credentials.ssl_context(ssl_context)
        self._opener = urllib.request.build_opener(_Refused(), urllib.request.HTTPSHandler(context=self.ssl_context))
        self.timeout, self.write_attempts, self.sleep = timeout, write_attempts, sleep

    def write(self, method: str, path: str, body, content_type: str | None,
              idempotency_key: str | None = None, headers: dict | None = None) -> dict:
        """Sends a write until it is answered, the same request under the same key each time:
        on no answer (a reset, a timeout), 429, 5xx (504 ``outcome-unknown`` included), after
        ``Retry-After`` or a backoff, at most ``write_attempts`` times. When a copy reached the
        service unanswered and the last answer does not say what became of it (or none came),
        ``OutcomeUnknown`` (also when no token can be had for the next copy); when no copy reached
        it, the connection's ``URLError`` or the ``CredentialsError`` (nothing was written). What
        it raises carries the key (``idempotency_key``), to send the write again under."""
        key = idempotency_key or str(uuid.uuid4())
        sent = {**(headers or {}), "Idempotency-Key": key}
        if content_type is not None:
            sent["Content-Type"] = content_type
        unanswered = []  # copies whose answer did not say what became of them

        def send():
            self.credentials.rest_headers(self)  # a token to get first: its failure is no copy of this write
            try:
                return self.request(method, path, body, sent)
            except urllib.error.URLError:  # no connection, or the request not sent whole: it never reached the service
                raise
            except (OSError, http.client.HTTPException):  # sent, and no answer read
                unanswered.append(None)
                raise
            except ApiError as error:
                if error.status >= 500 and error.status != 503:
                    unanswered.append(None)
                raise
        try:
            return self.retried(send)
        except ApiError as error:
            error.idempotency_key = key
            if unanswered and not isinstance(error, OutcomeUnknown) and (
                    error.status in ANSWERED_BEFORE_THE_KEY or error.status >= 500):
                raise _outcome_unknown(key, f"the last answer ({error.status})", error.headers) from error
            raise
        except (OSError, http.client.HTTPException, CredentialsError) as error:
            if unanswered:  # the last attempt got no answer, or no token to send another copy with
                raise _outcome_unknown(key, f"the last attempt ({error})") from error
            error.idempotency_key = key  # no copy reached the service: nothing was written
            raise

    def retried(self, send, statuses=frozenset(RETRIED_STATUSES), unanswered: bool = True):
        """``send()`` until it is answered with anything but ``statuses`` (and, with ``unanswered``,
        while no answer comes), after ``Retry-After`` or a backoff, at most ``write_attempts`` times;
        a ``Retry-After`` past ``MAX_RETRY_AFTER_SECONDS`` is raised at once, not waited out."""
        backoff = Backoff()
        for attempt in range(1, self.write_attempts + 1):
            try:
                return send()
            except (OSError, http.client.HTTPException):  # no answer: a write may or may not have landed
                if not unanswered or attempt == self.write_attempts:
                    raise
                self.sleep(backoff.next_delay())
            except ApiError as error:
                if error.status not in statuses or attempt == self.write_attempts:
                    raise
                delay = retry_after(error.headers)
                if delay is not None and delay > MAX_RETRY_AFTER_SECONDS:  # the caller decides on a wait that long
                    raise
                self.sleep(backoff.next_delay() if delay is None else delay)
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, body=None, headers: dict | None = None,
                timeout: float | None = None, with_headers: bool = False):
        """Sends one request; the answer's JSON (``None`` for an empty one; with ``with_headers``,
        ``(that, the answer's headers)``), or the ``ApiError`` for its status and problem (a 304
        too). A 401 with renewable credentials is sent once more with a renewed token (a 401
        writes nothing). An ``Authorization`` of ``headers`` (a device's assertion) is sent in
        place of the credentials', as it is."""
        own = "Authorization" in (headers or {})
        for renew in (False, True):
            sent_headers = {"Accept": "application/json",
                            **({} if own else self.credentials.rest_headers(self, renew=renew)), **(headers or {})}
            data = None if body is None else dumps(body, ascii_only=True).encode()
            if data is not None and len(data) > MAX_BODY_BYTES:
                raise error_for(413, {"type": "urn:device-state:problem:too-large", "title": "Body too large",
                                      "status": 413, "detail": (
                    f"the body is {len(data)} bytes as JSON; the API takes at most {MAX_BODY_BYTES}; nothing was sent")})
            if data is not None:
                sent_headers.setdefault("Content-Type", "application/json")
            sent = urllib.request.Request(self.base_url + path, data=data, method=method, headers=sent_headers)
            try:
                with self._opener.open(sent, timeout=timeout or self.timeout) as answer:
                    text = answer.read()
                    try:
                        document = loads(text, self.exact_numbers) if text else None
                    except ValueError:  # a proxy's page, not the service's answer: as good as none
                        raise http.client.HTTPException(f"an answer that is no JSON: {text[:80]!r}") from None
                    return (document, answer.headers) if with_headers else document
            except urllib.error.HTTPError as error:
                text = error.read()
                try:
                    problem = loads(text, self.exact_numbers) if text else {}
                except ValueError:  # a proxy's or gateway's own page
                    problem = {"detail": text[:200].decode(errors="replace")}
                if error.code == 401 and not renew and not own and self.credentials.renews_refused_tokens:
                    continue
                if 300 <= error.code < 400 and error.code != 304:
                    problem = {"title": "Redirected", "status": error.code, "detail": (
                        f"{self.base_url} answered {error.code}, to {error.headers.get('Location')}: the service "
                        f"never redirects, so the endpoint is not the API's (its scheme, host or path); nothing "
                        f"was sent on")}
                raise error_for(error.code, problem if isinstance(problem, dict) else {}, error.headers) from None
        raise AssertionError("unreachable")


def _outcome_unknown(key: str, last: str, headers=None) -> OutcomeUnknown:
    """What a write comes to when a copy of it reached the service unanswered and ``last`` (its
    last answer or attempt) does not say whether it was applied."""
    unknown = OutcomeUnknown(504, {
        "type": "urn:device-state:problem:outcome-unknown", "status": 504,
        "title": "The change may or may not have been applied",
        "detail": f"a copy of this write went unanswered, and {last} does not say whether it was applied; "
                  f"send it again with Idempotency-Key {key}, or read the device"},
        headers or {})
    unknown.idempotency_key = key
    return unknown
