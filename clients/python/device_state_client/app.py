"""An app's or a back-end's client of the whole HTTP API: read, list, query and count devices,
write any section (every write under an Idempotency-Key, retried safely), the change feed and
history, transactions, leases that heartbeat while held, many devices followed over one
WebSocket, and jobs (one desired change to many devices) created, read, followed and canceled. Numbers with a fraction come back as ``Decimal`` (exact, as the service keeps them)."""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from typing import Iterator

from .credentials import CredentialsError
from .errors import ApiError, LeaseGone, NotFound
from .service import JSON_PATCH, MERGE_PATCH, NOTHING_WRITTEN, RETRIED_STATUSES, Service, device_path, item_path

MAX_FOLLOWED = 100  # the WebSocket API's subscriptions per connection
SECTIONS = ("state", "desired", "reported")  # what a subscription may follow
MAX_PAGE = 100  # the largest page GET /devices, the change feed and the jobs' listings give


def _query(**parameters) -> str:
    present = {name: value for name, value in parameters.items() if value is not None}
    return f"?{urllib.parse.urlencode(present)}" if present else ""


def _job_path(job_id: str) -> str:
    return item_path("jobs", job_id)


def _first(pages: Iterator[dict], limit: int | None) -> Iterator[dict]:
    """The items of ``pages``, one at a time, at most ``limit`` (reading no page past it)."""
    if limit is not None and limit <= 0:
        return
    given = 0
    for page in pages:
        for item in page["items"]:
            yield item
            given += 1
            if limit is not None and given >= limit:
                return


def _settled(job: dict) -> bool:
    """Nothing of the job is left to happen: completed, or nothing queued or in progress with
    no more devices to find (a job that finds devices until its end only once stopped)."""
    if job.get("completedAt") is not None:
        return True
    counts, finding = job.get("counts") or {}, job.get("targeting") or (
        job.get("targets") == "continuous" and job.get("status") == "IN_PROGRESS")
    return not finding and not counts.get("QUEUED") and not counts.get("IN_PROGRESS")


def _etag(version: int | None) -> dict:
    return {} if version is None else {"If-Match": f'"{int(version)}"'}


def _patch_type(patch) -> str:
    """A JSON Patch is an array of operations, a merge patch an object: the body says which."""
    if isinstance(patch, list):
        return JSON_PATCH
    if isinstance(patch, dict):
        return MERGE_PATCH
    raise TypeError("a patch is a merge patch (a dict) or a JSON Patch (a list of operations)")


class AppClient(Service):
    """``AppClient(endpoint, credentials)``: ``endpoint`` is the API's URL (``make serve``'s
    ``http://127.0.0.1:3000``; deployed, the stack output ``Url``), ``credentials`` a
    ``TokenCredentials`` (a token, ``TokenCredentials.from_environment()``) or a
    ``CommandCredentials`` (a command that prints one). Writes take ``if_match`` (a version),
    ``lease_token`` (the holder's, on a leased device) and ``idempotency_key`` (one is made
    otherwise); each is retried under its key on no answer, 429, 503 and 504, after
    ``Retry-After``, and applied once. Refusals raise the ``ApiError`` subclass of their status
    or problem type (``NotFound``, ``PreconditionFailed``, ``OutcomeUnknown``, …)."""

    exact_numbers = True

    # Reads: retried as writes are (a read changes nothing)

    def read(self, path: str, timeout: float | None = None):
        return self.retried(lambda: self.request("GET", path, timeout=timeout))

    def get(self, device_id: str, metadata: bool = False) -> dict:
        """The device with its ``delta`` (and, with ``metadata``, each leaf's metadata)."""
        return self.read(device_path(device_id) + _query(include="metadata" if metadata else None))

    def pages(self, filter: str | None = None, sort: str | None = None, page_size: int = MAX_PAGE,
              metadata: bool = False) -> Iterator[dict]:
        """``GET /devices`` page by page (``{"items", "nextCursor"}``), one request per page as
        it is iterated; with ``filter`` (RQL on declared fields) and ``sort`` (``+path`` or ``-path``)."""
        return self._pages("devices", filter=filter, sort=sort, limit=page_size,
                           include="metadata" if metadata else None)

    def list(self, filter: str | None = None, sort: str | None = None, limit: int | None = None,
             page_size: int = MAX_PAGE, metadata: bool = False) -> Iterator[dict]:
        """The devices, one at a time, read a page at a time (so a fleet of any size is listed
        in the memory of one page); at most ``limit``."""
        return _first(self.pages(filter, sort, min(page_size, limit or page_size), metadata), limit)

    def count(self, filter: str, group_by: str | None = None) -> dict:
        """``{"count"}`` of the devices ``filter`` matches, with ``groups`` per value of ``group_by``."""
        return self.read("devices/count" + _query(filter=filter, groupBy=group_by))

    def delta(self, device_id: str, since: int | None = None, wait_seconds: float | None = None) -> dict:
        """``{"deviceId", "version", "delta"}``; a long-poll with ``wait_seconds`` (0-20)."""
        return self.read(f"{device_path(device_id)}/delta" + _query(since=since, waitSeconds=wait_seconds),
                         timeout=self.timeout + (wait_seconds or 0))

    def history(self, device_id: str, version: int, metadata: bool = False) -> dict:
        """The device as it was at ``version`` (within the feed's retention)."""
        return self.read(f"{device_path(device_id)}/versions/{int(version)}"
                         + _query(include="metadata" if metadata else None))

    def changes_page(self, device_id: str, since: int, limit: int = MAX_PAGE, wait_seconds: float | None = None,
                     sections: str | None = None) -> dict:
        """One page of the change feed: ``{"changes", "nextSince"}``; a long-poll with ``wait_seconds``."""
        return self.read(f"{device_path(device_id)}/changes"
                         + _query(since=since, limit=limit, waitSeconds=wait_seconds, sections=sections),
                         timeout=self.timeout + (wait_seconds or 0))

    def changes(self, device_id: str, since: int = 0, follow: bool = False, wait_seconds: float = 20,
                sections: str | None = None) -> Iterator[dict]:
        """Every change after ``since``, oldest first, a page at a time; with ``follow``, then
        each new one as it comes (long-polls of ``wait_seconds``), without end. A feed past its
        retention raises ``ChangesExpired`` (read the device and go on from its version)."""
        while True:
            page = self.changes_page(device_id, since, wait_seconds=wait_seconds if follow else None,
                                     sections=sections)
            yield from page["changes"]
            moved, since = page["nextSince"] != since, page["nextSince"]
            if not moved and not follow:  # nothing after since is recorded yet
                return

    def lease_status(self, device_id: str) -> dict:
        """``{"holder", "queueLength", "queue"}`` of the device's lease."""
        return self.read(f"{device_path(device_id)}/leases")

    # Writes

    def _write(self, method: str, path: str, body=None, content_type: str | None = "application/json", *,
               if_match: int | None = None, lease_token: str | None = None, idempotency_key: str | None = None,
               headers: dict | None = None):
        sent = {**_etag(if_match), **({"Lease-Token": lease_token} if lease_token else {}), **(headers or {})}
        return self.write(method, path, body, content_type if body is not None else None, idempotency_key, sent)

    def create(self, device_id: str, body: dict | None = None, *, idempotency_key: str | None = None,
               metadata: bool = False) -> dict:
        """``POST /devices``: ``body`` is ``{"state", "desired", "reported"}``, each optional
        (``state`` is sent as ``{}`` when left out: the API asks for it)."""
        return self._write("POST", "devices" + _query(include="metadata" if metadata else None),
                           {"deviceId": device_id, "state": {}, **(body or {})}, idempotency_key=idempotency_key)

    def put(self, device_id: str, body: dict, *, if_match: int | None = None, create_only: bool = False,
            lease_token: str | None = None, idempotency_key: str | None = None) -> dict:
        """``PUT /devices/{id}``: creates or replaces; ``if_match`` replaces only that version,
        ``create_only`` creates only."""
        return self._write("PUT", device_path(device_id), body, if_match=if_match, lease_token=lease_token,
                           idempotency_key=idempotency_key, headers={"If-None-Match": "*"} if create_only else None)

    def patch(self, device_id: str, patch, *, section: str | None = None, if_match: int | None = None,
              lease_token: str | None = None, idempotency_key: str | None = None) -> dict:
        """Patches ``state`` (or ``section``: ``desired``, ``reported``): a dict is a merge patch,
        a list a JSON Patch (with ``increment``). Without ``if_match`` the service re-applies it
        to the newest state when another writer got there first."""
        path = device_path(device_id) + (f"/{section}" if section else "")
        return self._write("PATCH", path, patch, _patch_type(patch), if_match=if_match, lease_token=lease_token,
                           idempotency_key=idempotency_key)

    def desire(self, device_id: str, patch, *, expires_in: int | None = None, clear_on_confirm: bool = False,
               if_match: int | None = None, lease_token: str | None = None,
               idempotency_key: str | None = None) -> dict:
        """Patches ``desired``: each leaf it sets leaves the delta ``expires_in`` seconds on unless
        confirmed, and with ``clear_on_confirm`` leaves ``desired`` once reported equal."""
        query = _query(expiresIn=expires_in, clearOnConfirm="true" if clear_on_confirm else None)
        return self._write("PATCH", f"{device_path(device_id)}/desired{query}", patch, _patch_type(patch),
                           if_match=if_match, lease_token=lease_token, idempotency_key=idempotency_key)

    def report(self, device_id: str, patch, *, if_match: int | None = None, lease_token: str | None = None,
               idempotency_key: str | None = None) -> dict:
        """Patches ``reported`` (needs ``devices.report``, or the device's own token)."""
        return self.patch(device_id, patch, section="reported", if_match=if_match, lease_token=lease_token,
                          idempotency_key=idempotency_key)

    def delete(self, device_id: str, *, if_match: int | None = None, lease_token: str | None = None,
               idempotency_key: str | None = None) -> None:
        """``DELETE /devices/{id}``."""
        self._write("DELETE", device_path(device_id), if_match=if_match, lease_token=lease_token,
                    idempotency_key=idempotency_key)

    def transaction(self, operations: list, *, metadata: bool = False, idempotency_key: str | None = None) -> dict:
        """``POST /transactions``: all of ``operations`` or none (``TransactionFailed`` names
        each failing one); ``{"devices": [...]}`` in order, ``None`` for a delete."""
        return self._write("POST", "transactions" + _query(include="metadata" if metadata else None),
                           {"operations": operations}, idempotency_key=idempotency_key)

    # Jobs (docs/api/jobs.md)

    def create_job(self, desired: dict, *, filter: str | None = None, device_ids=None, job_id: str | None = None,
                   expires_in: int | None = None, clear_on_confirm: bool = False, max_per_minute: int | None = None,
                   abort: list | None = None, timeout_seconds: int | None = None, continuous: bool = False,
                   ends_at: str | None = None, idempotency_key: str | None = None) -> dict:
        """``POST /jobs``: ``desired`` (a merge patch setting values) written once to every device
        ``filter`` matches, or each of ``device_ids``. ``max_per_minute`` spreads the writes;
        ``abort``: the API's criteria (``[{"on", "thresholdPercent", "minExecuted"}]``);
        ``continuous`` also targets devices that come to match until ``ends_at`` (RFC 3339). The
        job, with its ``jobId`` (``job_id``, else one the service makes)."""
        body = {"jobId": job_id, "filter": filter,
                "deviceIds": None if device_ids is None else list(device_ids), "desired": desired,
                "expiresIn": expires_in, "clearOnConfirm": True if clear_on_confirm else None,
                "rollout": None if max_per_minute is None else {"maxPerMinute": max_per_minute},
                "abort": abort, "timeoutSeconds": timeout_seconds, "targets": "continuous" if continuous else None,
                "endsAt": ends_at}
        return self._write("POST", "jobs", {name: value for name, value in body.items() if value is not None},
                           idempotency_key=idempotency_key)

    def job(self, job_id: str) -> dict:
        """``GET /jobs/{id}``: the job, its ``status``, ``counts`` per execution state and ``total``."""
        return self.read(_job_path(job_id))

    def job_pages(self, status: str | None = None, page_size: int = MAX_PAGE) -> Iterator[dict]:
        """``GET /jobs`` page by page (``{"items", "nextCursor"}``), newest first, only ``status``'s."""
        return self._pages("jobs", status=status, limit=page_size)

    def jobs(self, status: str | None = None, limit: int | None = None, page_size: int = MAX_PAGE) -> Iterator[dict]:
        """The jobs, newest first, one at a time read a page at a time; at most ``limit``."""
        return _first(self.job_pages(status, min(page_size, limit or page_size)), limit)

    def execution_pages(self, job_id: str, state: str | None = None, page_size: int = MAX_PAGE) -> Iterator[dict]:
        """``GET /jobs/{id}/executions`` page by page, in the order the devices were targeted."""
        return self._pages(f"{_job_path(job_id)}/executions", state=state, limit=page_size)

    def executions(self, job_id: str, state: str | None = None, limit: int | None = None,
                   page_size: int = MAX_PAGE) -> Iterator[dict]:
        """The job's executions (``{"deviceId", "state", "version", "updatedAt", "code"?,
        "reason"?}``), only those in ``state``, one at a time; at most ``limit``."""
        return _first(self.execution_pages(job_id, state, min(page_size, limit or page_size)), limit)

    def cancel_job(self, job_id: str, force: bool = False, *, idempotency_key: str | None = None) -> dict:
        """``POST /jobs/{id}/cancel``: stops queuing (what is queued is ``CANCELED``); ``force``
        also takes the job's leaves back from the devices still in progress. ``JobEnded`` when
        the job had ended. Sent again under its key after a lost answer, it answers the job
        canceled by its first copy."""
        return self._write("POST", f"{_job_path(job_id)}/cancel" + _query(force="true" if force else None),
                           idempotency_key=idempotency_key)

    def follow_job(self, job_id: str, wait_seconds: int = 20) -> Iterator[dict]:
        """The job as it is now, then again each time its status, a count or its total changes
        (long-polls of ``GET /jobs/{id}?waitSeconds=`` on its ETag: nothing is read while it
        stays the same); it ends once nothing is left to happen: the job completed, or every
        execution is final and no more devices are to be found (the service marks such a job
        ``COMPLETED`` when its runner next wakes, which may be much later)."""
        path, tag = _job_path(job_id), None
        while True:
            waiting = tag is not None
            try:
                job, headers = self.retried(lambda: self.request(
                    "GET", path + _query(waitSeconds=wait_seconds if waiting else None),
                    headers={"If-None-Match": tag} if waiting else None,
                    timeout=self.timeout + (wait_seconds if waiting else 0), with_headers=True))
            except ApiError as unchanged:
                if unchanged.status != 304:
                    raise
                continue
            tag = headers.get("ETag")
            yield job
            if _settled(job):
                return

    def _pages(self, path: str, **query) -> Iterator[dict]:
        cursor = None
        while True:
            page = self.read(path + _query(**query, cursor=cursor))
            yield page
            cursor = page.get("nextCursor")
            if cursor is None:
                return

    # Leases

    def lease(self, device_id: str, ttl_seconds: float = 60, wait_seconds: float = 0, owner: str | None = None,
              heartbeat: bool = True, on_lost=None) -> Lease:
        """Takes the device's lease (queueing up to ``wait_seconds``; ``LeaseBusy`` if not
        granted by then): a ``Lease``, used as a context manager, that heartbeats every half
        ``ttl_seconds`` while held and is released at the end. Pass its ``token`` as the writes'
        ``lease_token``. ``on_lost(error)`` is called if a heartbeat finds it ended."""
        body = {name: value for name, value in (("ttlSeconds", ttl_seconds), ("waitSeconds", wait_seconds),
                                                ("owner", owner)) if value is not None}
        # A grant is not idempotent (a second request queues a second ticket), so it is sent again
        # only after answers that say nothing was written.
        grant = self.retried(lambda: self.request("POST", f"{device_path(device_id)}/leases", body,
                                                  timeout=self.timeout + wait_seconds),
                             NOTHING_WRITTEN, unanswered=False)
        return Lease(self, device_id, grant, heartbeat=heartbeat, on_lost=on_lost)

    def end_lease(self, device_id: str, fencing_token: int) -> None:
        """Ends whichever lease or waiting ticket holds ``fencing_token`` (a back-end's right)."""
        self.retried(lambda: self.request("DELETE", f"{device_path(device_id)}/leases/{int(fencing_token)}"))

    # Devices' identity (the devices.admin scope)

    def add_credential(self, device_id: str, type: str, *, public_key: str | None = None,
                       certificate: str | None = None, expires_at: str | None = None) -> dict:
        """``POST /devices/{id}/credentials``: registers a ``publicKey`` (PEM), a ``certificate``
        (PEM) or a ``secret`` the service makes (in the answer's ``secret``, shown this once):
        ``{"credentialId", "type", "thumbprint"?, "createdAt", "expiresAt"?}``. ``expires_at``:
        RFC 3339. Sent again only after 429 and 503 (a second copy would register a second)."""
        body = {name: value for name, value in (("type", type), ("publicKey", public_key),
                                                ("certificate", certificate), ("expiresAt", expires_at))
                if value is not None}
        return self.retried(lambda: self.request("POST", f"{device_path(device_id)}/credentials", body),
                            NOTHING_WRITTEN, unanswered=False)

    def list_credentials(self, device_id: str) -> list[dict]:
        """The device's registered credentials (never a secret; a revoked one is gone)."""
        return self.read(f"{device_path(device_id)}/credentials")["items"]

    def revoke_credential(self, device_id: str, credential_id: str) -> None:
        """``DELETE /devices/{id}/credentials/{credentialId}``: every token minted from it stops
        working at once. ``NotFound`` for one the device does not hold (or no longer)."""
        path = f"{device_path(device_id)}/{item_path('credentials', credential_id)}"
        self.retried(lambda: self.request("DELETE", path), NOTHING_WRITTEN, unanswered=False)

    def create_enrollment(self, id_pattern: str, max_devices: int, *, enrollment_id: str | None = None,
                          initial: dict | None = None, expires_at: str | None = None) -> dict:
        """``POST /enrollments``: a group enrollment devices whose id fully matches ``id_pattern``
        provision themselves by, at most ``max_devices``, each created with ``initial``
        (``{"state", "desired"}``). The answer's ``groupKey`` (base64) is shown this once."""
        body = {name: value for name, value in (("enrollmentId", enrollment_id), ("idPattern", id_pattern),
                                                ("maxDevices", max_devices), ("initial", initial),
                                                ("expiresAt", expires_at)) if value is not None}
        return self.retried(lambda: self.request("POST", "enrollments", body), NOTHING_WRITTEN, unanswered=False)

    def list_enrollments(self) -> list[dict]:
        """Every enrollment, by id, with its ``provisioned`` count (never a group key), read a page at a time."""
        return [enrollment for page in self._pages("enrollments") for enrollment in page["items"]]

    def get_enrollment(self, enrollment_id: str) -> dict:
        return self.read(item_path("enrollments", enrollment_id))

    def delete_enrollment(self, enrollment_id: str) -> None:
        """``DELETE /enrollments/{id}``: no device provisions itself by it any more; those it
        provisioned keep their credentials."""
        path = item_path("enrollments", enrollment_id)
        self.retried(lambda: self.request("DELETE", path), NOTHING_WRITTEN, unanswered=False)

    # Following

    def follow(self, device_ids, since: int | dict | None = None, sections=None, **options):
        """Every change of each device after ``since`` (a version for all, a dict per device, or
        ``None``: from each device's version as read now, 0 for one not created yet), exactly
        once and in version order per device, on one WebSocket, across disconnects; at most
        100 devices (the WebSocket API's subscriptions per connection). ``sections``: only
        changes of those (and deletes). Iterate it for ``Change`` and ``Resynced`` events; its
        ``positions`` say where each device is."""
        from .follow import Follower

        device_ids = list(dict.fromkeys(device_ids))
        if not device_ids or len(device_ids) > MAX_FOLLOWED:
            raise ValueError(f"follow 1 to {MAX_FOLLOWED} devices on one connection, not {len(device_ids)}")
        unknown = sorted(set(sections or ()) - set(SECTIONS))
        if unknown:  # the service would take the subscription and send nothing, forever
            raise ValueError(f"sections are {', '.join(SECTIONS)}, not {', '.join(unknown)}")
        if isinstance(since, dict):
            positions = {device_id: int(since.get(device_id, 0)) for device_id in device_ids}
        elif since is not None:
            positions = dict.fromkeys(device_ids, int(since))
        else:
            positions = {device_id: self._version_or_zero(device_id) for device_id in device_ids}
        return Follower(self, positions, None if sections is None else tuple(sections),
                        read_device=self.get, read_version=self.history,
                        read_changes=lambda device_id, after: self.changes_page(device_id, after), **options)

    def _version_or_zero(self, device_id: str) -> int:
        try:
            return self.get(device_id)["version"]
        except NotFound:
            return 0


class Lease:
    """A held lease: ``token`` (the ``Lease-Token`` writes need), ``fencing_token``,
    ``expires_at``, ``held_until`` (when it runs out unless extended, by ``time.monotonic``, from
    the request the service last answered). While held it heartbeats every half ``ttl_seconds`` in a thread; ``lost``
    is set (and ``on_lost`` called) if the service says it ended, or once its ttl has passed
    since the last heartbeat that was answered (none since could be sent or read: the lease may
    be another's by then). ``release()``, or the end of a ``with`` block, gives it up."""

    def __init__(self, client: AppClient, device_id: str, grant: dict, heartbeat: bool = True, on_lost=None):
        self.client, self.device_id, self.grant = client, device_id, grant
        self.token, self.fencing_token = grant["leaseToken"], grant["fencingToken"]
        self.lease_id, self.expires_at = grant["leaseId"], grant["expiresAt"]
        self.ttl_seconds = float(grant["ttlSeconds"])
        self.on_lost, self.lost = on_lost, None
        self.held_until = time.monotonic() + self.ttl_seconds  # by this client's clock, as last extended
        self._stop = threading.Event()
        self._path = f"{device_path(device_id)}/{item_path('leases', self.lease_id)}"
        self._heartbeats = threading.Thread(target=self._beat, daemon=True) if heartbeat else None
        if self._heartbeats is not None:
            self._heartbeats.start()

    def heartbeat(self) -> dict:
        """Extends the lease by its ttl from now; ``LeaseGone`` once it has ended."""
        sent = []

        def attempt():
            sent.append(time.monotonic())  # the lease runs from the copy that was answered
            return self.client.request("PUT", self._path)

        answer = self.client.retried(attempt)
        self.expires_at, self.held_until = answer["expiresAt"], sent[-1] + self.ttl_seconds
        return answer

    def _beat(self) -> None:
        wait = self.ttl_seconds / 2
        while not self._stop.wait(wait):
            began = time.monotonic()  # the next beat goes half a ttl after this one was sent
            try:
                self.heartbeat()
            except LeaseGone as gone:
                self._end(gone)
                return
            except (ApiError, OSError, http.client.HTTPException, CredentialsError, ValueError) as error:
                # (an answer cut off or not JSON, a token that could not be renewed): the next beat
                # tries again while the lease may still be held
                if time.monotonic() >= self.held_until:
                    self._end(LeaseGone(410, {"type": "urn:device-state:problem:lease-gone", "title": "Lease gone",
                                              "detail": f"no heartbeat answered within the lease's "
                                                        f"{self.ttl_seconds:g} s ({error or type(error).__name__}): "
                                                        "it has ended, or may be another's"}))
                    return
            wait = max(0.0, self.ttl_seconds / 2 - (time.monotonic() - began))

    def _end(self, gone: LeaseGone) -> None:
        self.lost = gone
        if self.on_lost is not None:
            self.on_lost(gone)

    def release(self) -> None:
        """Gives the lease up (the next waiter proceeds); also when it has already ended."""
        self._stop.set()
        if self._heartbeats is not None and self._heartbeats is not threading.current_thread():
            self._heartbeats.join()
        self.client.retried(lambda: self.client.request("DELETE", self._path))

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


__all__ = ["AppClient", "Lease", "MAX_FOLLOWED", "RETRIED_STATUSES"]
