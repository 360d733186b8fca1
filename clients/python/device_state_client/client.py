"""The device's side of the HTTP API: read the device and its delta, report, acknowledge desires,
exchange a certificate for a token; writes retried safely under an Idempotency-Key."""

from __future__ import annotations

import ssl
import time
import urllib.parse

from .credentials import (CertificateCredentials, EnrollmentCredentials, KeyCredentials, SecretCredentials,
                          TokenCredentials)
from .errors import ApiError, problem_slug, retry_after
from .service import MERGE_PATCH, NOTHING_WRITTEN, RETRIED_STATUSES, Service, device_path

__all__ = ["ApiError", "DeviceClient", "MERGE_PATCH", "RETRIED_STATUSES", "problem_slug", "retry_after"]


class DeviceClient(Service):
    """One device's client. ``base_url`` is the API's (ending in ``/prod/`` deployed);
    ``websocket_url`` defaults to its ``/ws`` (as ``make serve`` serves it; deployed, the
    stack output ``WebSocketUrl``). ``ssl_context``: TLS settings of your own for HTTPS and
    WSS (a client certificate's chain is loaded into it)."""

    def __init__(self, base_url: str, device_id: str,
                 credentials: (TokenCredentials | CertificateCredentials | KeyCredentials | SecretCredentials
                               | EnrollmentCredentials), *,
                 websocket_url: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 timeout: float = 30, write_attempts: int = 6, sleep=time.sleep):
        super().__init__(base_url, credentials, websocket_url=websocket_url, ssl_context=ssl_context,
                         timeout=timeout, write_attempts=write_attempts, sleep=sleep)
        self.device_id = device_id
        self._path = device_path(device_id)

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

    def ack(self, path: str, version: int, code: int, reason: str | None = None,
            idempotency_key: str | None = None) -> dict:
        """Tells the service what became of the desire at ``path`` (a JSON Pointer inside
        desired) set at ``version``: ``code`` 200 applied, a 4xx refused (``reason`` says why).
        ``ApiError`` 409 when desired has moved past that version."""
        return self.ack_many([{"path": path, "version": version, "code": code, "reason": reason}], idempotency_key)

    def ack_many(self, acks: list[dict], idempotency_key: str | None = None) -> dict:
        """Several acks in one request, each ``{"path", "version", "code"[, "reason"]}``."""
        body = {"acks": [{name: value for name, value in ack.items() if value is not None} for ack in acks]}
        return self.write("POST", f"{self._path}/desired/acks", body, "application/json", idempotency_key)

    # Credentials

    def exchange_certificate(self) -> dict:
        """``POST /devices/{id}/token`` over mutual TLS: ``{"token", "tokenType", "expiresIn",
        "expiresAt"}``. 429 and 503 are waited out (``Retry-After``, else a backoff)."""
        return self.retried(lambda: self.request("POST", f"{self._path}/token"), NOTHING_WRITTEN, unanswered=False)

    def exchange_assertion(self, assertion) -> dict:
        """``POST /devices/{id}/token`` with an assertion the device signed (``KeyCredentials``,
        ``SecretCredentials``): the same answer as ``exchange_certificate``. An assertion is good
        once: ``assertion`` given as a callable that signs a new one is sent again (newly signed)
        when no answer comes, 429 or 503; a string only after 429 and 503."""
        return self._with_assertion("token", assertion, None)

    def provision_with(self, assertion, public_key: str | None = None) -> dict:
        """``POST /devices/{id}/provision`` with an enrollment's assertion (a string, or a callable
        that signs a new one for each attempt, as ``exchange_assertion``) and the device's public
        key, to register it: ``{"deviceId", "credentialId", "token", "expiresIn", "expiresAt"}``.
        Provisioning again by the same enrollment answers the same device and credential, so a
        lost answer is safely asked again."""
        return self._with_assertion("provision", assertion, {} if public_key is None else {"publicKey": public_key})

    def _with_assertion(self, route: str, assertion, body) -> dict:
        sign = assertion if callable(assertion) else (lambda: assertion)
        return self.retried(lambda: self.request("POST", f"{self._path}/{route}", body,
                                                 headers={"Authorization": f"Bearer {sign()}"}),
                            NOTHING_WRITTEN, unanswered=callable(assertion))

    def provision(self) -> dict:
        """Provisions this device by the enrollment of its ``EnrollmentCredentials`` (see there):
        ``{"deviceId", "credentialId", "token", "expiresIn", "expiresAt"}``. Not needed before
        other calls: the first one provisions the device if it has not been."""
        if not isinstance(self.credentials, EnrollmentCredentials):
            raise TypeError("provision() needs EnrollmentCredentials")
        return self.credentials.provision(self)

    # Following

    def follow(self, since: int, sections=("desired",), **options):
        """Every change of the device after ``since`` that touches ``sections`` (and every
        delete), exactly once and in version order, across disconnects: see ``Follower``."""
        from .follow import Follower

        return Follower(self, {self.device_id: since}, tuple(sections),
                        read_device=lambda device_id: self.get(),
                        read_version=lambda device_id, version: self.version(version),
                        read_changes=lambda device_id, since: self.changes(since), **options)
