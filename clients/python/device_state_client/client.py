"""The REST side: read the device and its delta, report, acknowledge desires, exchange a
certificate for a token; writes retried safely under an Idempotency-Key."""

from __future__ import annotations

import http.client
import json
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from email.utils import parsedate_to_datetime

from .backoff import Backoff
from .credentials import CertificateCredentials, TokenCredentials

MERGE_PATCH = "application/merge-patch+json"
# Answers after which the same request, with the same Idempotency-Key, may be sent again: the
# service wrote nothing (429, 503) or may have written once (504, another 5xx), and the key makes
# a second copy replay the first answer instead of applying twice.
RETRIED_STATUSES = {429, 500, 502, 503, 504}


class ApiError(Exception):
    """The service refused or failed a request: ``status``, the problem details, the headers."""

    def __init__(self, status: int, problem: dict, headers=None):
        self.status, self.problem, self.headers = status, problem, headers or {}
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}".strip())

    @property
    def slug(self) -> str:
        return problem_slug(self.problem)


def problem_slug(problem: dict) -> str:
    """The last segment of a problem's ``type`` (``changes-expired``, ``outcome-unknown``)."""
    return re.split(r"[/:]", str(problem.get("type", "")))[-1]


def retry_after(headers) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date), if any."""
    value = headers.get("Retry-After") if headers else None
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        try:
            return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
        except (TypeError, ValueError):
            return None


class DeviceClient:
    """One device's client. ``base_url`` is the API's (ending in ``/prod/`` deployed);
    ``websocket_url`` defaults to its ``/ws`` (as ``make serve`` serves it; deployed, the
    stack output ``WebSocketUrl``). ``ssl_context``: TLS settings of your own for HTTPS and
    WSS (a client certificate's chain is loaded into it)."""

    def __init__(self, base_url: str, device_id: str,
                 credentials: TokenCredentials | CertificateCredentials, *,
                 websocket_url: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 timeout: float = 30, write_attempts: int = 6, sleep=time.sleep):
        self.base_url = base_url.rstrip("/") + "/"
        self.device_id, self.credentials = device_id, credentials
        scheme, rest = self.base_url.split("://", 1)
        self.websocket_url = websocket_url or f"{'wss' if scheme == 'https' else 'ws'}://{rest}ws"
        self.ssl_context = credentials.ssl_context(ssl_context)
        self.timeout, self.write_attempts, self.sleep = timeout, write_attempts, sleep
        self._path = f"devices/{urllib.parse.quote(device_id, safe='')}"

    # Reads

    def get(self, metadata: bool = False) -> dict:
        """The device: ``version``, ``state``, ``desired``, ``reported``, ``delta``; with
        ``metadata`` also each leaf's ``{"version", "updatedAt"}`` (nested like its section)."""
        return self.request("GET", self._path + ("?include=metadata" if metadata else ""))

    def delta(self, since: int | None = None, wait_seconds: float | None = None) -> dict:
        """``{"deviceId", "version", "delta"}``; with ``wait_seconds`` (0-20) a long-poll that
        answers once a write after ``since`` has changed desired or reported."""
        query = {name: value for name, value in (("since", since), ("waitSeconds", wait_seconds))
                 if value is not None}
        suffix = f"?{urllib.parse.urlencode(query)}" if query else ""
        return self.request("GET", f"{self._path}/delta{suffix}", timeout=self.timeout + (wait_seconds or 0))

    def changes(self, since: int, limit: int = 100) -> dict:
        """One page of the change feed: ``{"changes": [...], "nextSince"}``."""
        return self.request("GET", f"{self._path}/changes?since={since}&limit={limit}")

    def version(self, version: int) -> dict:
        """The device as it was at ``version``."""
        return self.request("GET", f"{self._path}/versions/{version}")

    # Writes: each under an Idempotency-Key, so a retry after a lost answer applies at most once

    def report(self, patch: dict, idempotency_key: str | None = None) -> dict:
        """Merge-patches the device's ``reported``; answers the device."""
        return self.write("PATCH", f"{self._path}/reported", patch, MERGE_PATCH, idempotency_key)

    def ack(self, path: str, version: int, code: int, reason: str | None = None) -> dict:
        """Tells the service what became of the desire at ``path`` (a JSON Pointer inside
        desired) set at ``version``: ``code`` 200 applied, a 4xx refused (``reason`` says why).
        ``ApiError`` 409 when desired has moved past that version."""
        return self.ack_many([{"path": path, "version": version, "code": code, "reason": reason}])

    def ack_many(self, acks: list[dict]) -> dict:
        """Several acks in one request, each ``{"path", "version", "code"[, "reason"]}``."""
        body = {"acks": [{name: value for name, value in ack.items() if value is not None} for ack in acks]}
        return self.write("POST", f"{self._path}/desired/acks", body, "application/json")

    def write(self, method: str, path: str, body, content_type: str,
              idempotency_key: str | None = None) -> dict:
        """Sends a write until it is answered, the same request under the same key each time:
        on no answer (a reset, a timeout), 429, 5xx (504 ``outcome-unknown`` included), after
        ``Retry-After`` or a backoff, at most ``write_attempts`` times."""
        headers = {"Content-Type": content_type, "Idempotency-Key": idempotency_key or str(uuid.uuid4())}
        backoff = Backoff()
        for attempt in range(1, self.write_attempts + 1):
            try:
                return self.request(method, path, body, headers)
            except ApiError as error:
                if error.status not in RETRIED_STATUSES or attempt == self.write_attempts:
                    raise
                delay = retry_after(error.headers)
                self.sleep(backoff.next_delay() if delay is None else delay)
            except (OSError, http.client.HTTPException):  # no answer: the write may or may not have landed
                if attempt == self.write_attempts:
                    raise
                self.sleep(backoff.next_delay())
        raise AssertionError("unreachable")

    # Credentials

    def exchange_certificate(self) -> dict:
        """``POST /devices/{id}/token`` over mutual TLS: ``{"token", "tokenType", "expiresIn",
        "expiresAt"}``. 429 and 503 are waited out (``Retry-After``, else a backoff)."""
        backoff = Backoff()
        for attempt in range(1, self.write_attempts + 1):
            try:
                return self.request("POST", f"{self._path}/token")
            except ApiError as error:
                if error.status not in (429, 503) or attempt == self.write_attempts:
                    raise
                delay = retry_after(error.headers)
                self.sleep(backoff.next_delay() if delay is None else delay)
        raise AssertionError("unreachable")

    # Following

    def follow(self, since: int, sections=("desired",), **options):
        """Every change of the device after ``since`` that touches ``sections`` (and every
        delete), exactly once and in version order, across disconnects: see ``Follower``."""
        from .follow import Follower

        return Follower(self, since, tuple(sections), **options)

    # The one door to HTTP

    def request(self, method: str, path: str, body=None, headers: dict | None = None,
                timeout: float | None = None) -> dict:
        """Sends one request; the answer's JSON, or ``ApiError``. A 401 with a renewable token
        is sent once more with a fresh one (a 401 writes nothing)."""
        for renewed in (False, True):
            sent_headers = {"Accept": "application/json", **self.credentials.rest_headers(self),
                            **(headers or {})}
            data = None if body is None else json.dumps(body).encode()
            if data is not None:
                sent_headers.setdefault("Content-Type", "application/json")
            sent = urllib.request.Request(self.base_url + path, data=data, method=method,
                                          headers=sent_headers)
            try:
                with urllib.request.urlopen(sent, timeout=timeout or self.timeout,
                                            context=self.ssl_context) as answer:
                    return json.loads(answer.read() or b"null")
            except urllib.error.HTTPError as error:
                text = error.read()
                try:
                    problem = json.loads(text) if text else {}
                except ValueError:  # a proxy's or gateway's own page
                    problem = {"detail": text[:200].decode(errors="replace")}
                if error.code == 401 and not renewed and isinstance(self.credentials, TokenCredentials) \
                        and self.credentials.renewable:
                    continue
                problem = problem if isinstance(problem, dict) else {}
                raise ApiError(error.code, problem, error.headers) from None
        raise AssertionError("unreachable")
