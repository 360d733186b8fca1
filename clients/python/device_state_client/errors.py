"""The service's refusals as exceptions: one class per status (``NotFound``,
``PreconditionFailed``, ``OutcomeUnknown``, …) and, under them, one per problem type where a
caller acts on the type itself (``DeviceExists``, ``LeaseBusy``, ``ChangesExpired``, ``JobEnded``, …). Each
carries the RFC 9457 problem details: ``problem``, ``slug``, and its members as attributes
(``current_version``, ``device_id``, ``limit``, ``operations``, ``job_status``, …; ``None`` when absent)."""

from __future__ import annotations

import re
import time

# The members the service's problems may carry (docs/api.md, errors), as attributes in snake_case.
PROBLEM_MEMBERS = ("type", "title", "detail", "instance", "deviceId", "currentVersion", "limit", "operations",
                   "position", "fields", "progress", "holderExpiresAt", "leaseExpiresAt", "path", "ackVersion",
                   "leafVersion", "action", "resource", "index", "member", "jobId", "jobStatus")


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
        from email.utils import parsedate_to_datetime

        try:
            return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
        except (TypeError, ValueError):
            return None


class ApiError(Exception):
    """The service refused or failed a request: ``status``, the problem details, the headers;
    for a write, ``idempotency_key``: the key every copy of it was sent under."""

    idempotency_key: str | None = None

    def __init__(self, status: int, problem: dict, headers=None):
        self.status, self.problem, self.headers = status, problem, headers or {}
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}".strip())

    @property
    def slug(self) -> str:
        return problem_slug(self.problem)

    @property
    def retry_after(self) -> float | None:
        """What ``Retry-After`` asks to wait, in seconds, if it came."""
        return retry_after(self.headers)


def _member(name: str) -> property:
    return property(lambda error: error.problem.get(name), doc=f"The problem's ``{name}``, if it has one.")


for _name in PROBLEM_MEMBERS:
    setattr(ApiError, re.sub(r"([A-Z])", lambda upper: "_" + upper.group(1).lower(), _name), _member(_name))


class BadRequest(ApiError):
    """400: the request is malformed or breaks a limit; nothing was written."""


class Unauthorized(ApiError):
    """401: no credentials, or a token that is not valid."""


class Forbidden(ApiError):
    """403: the caller may not do this (``action`` on ``resource``)."""


class NotFound(ApiError):
    """404: no such device, version or lease."""


class MethodNotAllowed(ApiError):
    """405."""


class Conflict(ApiError):
    """409: the device's state refuses the request (it exists, a test failed, a lease is busy, …)."""


class Gone(ApiError):
    """410: past the feed's retention, or a lease that has ended."""


class PreconditionFailed(ApiError):
    """412: the device is not at the version ``If-Match`` named; ``current_version`` is where it is."""


class PayloadTooLarge(ApiError):
    """413: the body, or the item it would make, is too large (``limit`` says which)."""


class UnsupportedMediaType(ApiError):
    """415."""


class Unprocessable(ApiError):
    """422: a patch that cannot be applied, or an Idempotency-Key reused for another request."""


class Locked(ApiError):
    """423: the device is leased and the request lacks the holder's Lease-Token."""


class PreconditionRequired(ApiError):
    """428: the service requires If-Match on this write."""


class TooManyRequests(ApiError):
    """429: nothing was written; ask again after ``retry_after``."""


class ServerError(ApiError):
    """A 5xx that is a fault of the service (or of a gateway in front of it)."""


class Unavailable(ApiError):
    """503: nothing was written (contention, storage, an index being built); ask again after ``retry_after``."""


class OutcomeUnknown(ApiError):
    """504, or a write whose copies went unanswered and whose last answer (a 401, 429, 503 or
    5xx) does not say: the write may or may not have been applied (at most once). Send it again
    with the same Idempotency-Key (``idempotency_key``) to learn which, or read the device."""


class DeviceExists(Conflict):
    """409 ``device-exists``."""


class PatchTestFailed(Conflict):
    """409 ``patch-test-failed``: a JSON Patch ``test`` did not hold."""


class DesireMoved(Conflict):
    """409 ``desire-moved``: desired has set the acknowledged leaf again since."""


class LeaseBusy(Conflict):
    """409 ``lease-busy``: another holder has the lease (``holder_expires_at``)."""


class LeaseNotHeld(Conflict):
    """409 ``lease-not-held``: the Lease-Token names no active lease."""


class ChangesExpired(Gone):
    """410 ``changes-expired``: the changes after ``since`` are past the retention; read the device
    and go on from its version (``current_version``)."""


class LeaseGone(Gone):
    """410 ``lease-gone``: the lease expired, was released or was ended."""


class InvalidJob(BadRequest):
    """400 ``invalid-job``: the job's body cannot be run; ``member`` names what is wrong."""


class JobNotFound(NotFound):
    """404 ``job-not-found``: no job of that ``job_id``."""


class JobExists(Conflict):
    """409 ``job-exists``: a job of that ``job_id`` exists (a job id names one job for good)."""


class JobEnded(Conflict):
    """409 ``job-ended``: the job ended already (``job_status``), so it cannot be canceled."""


class TransactionFailed(ApiError):
    """A transaction applied nothing; ``operations`` names each failing one (its status is theirs
    when they agree, else 409)."""


BY_STATUS = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 405: MethodNotAllowed,
             409: Conflict, 410: Gone, 412: PreconditionFailed, 413: PayloadTooLarge, 415: UnsupportedMediaType,
             422: Unprocessable, 423: Locked, 428: PreconditionRequired, 429: TooManyRequests, 503: Unavailable,
             504: OutcomeUnknown}
BY_SLUG = {"device-exists": DeviceExists, "patch-test-failed": PatchTestFailed, "desire-moved": DesireMoved,
           "lease-busy": LeaseBusy, "lease-not-held": LeaseNotHeld, "changes-expired": ChangesExpired,
           "lease-gone": LeaseGone, "transaction-failed": TransactionFailed, "invalid-job": InvalidJob,
           "job-not-found": JobNotFound, "job-exists": JobExists, "job-ended": JobEnded}


def error_for(status: int, problem: dict, headers=None) -> ApiError:
    """The exception for an answer: by its problem type where one is named here (and, but for a
    transaction's, agrees with the status), else by its status."""
    by_slug = BY_SLUG.get(problem_slug(problem))
    if by_slug is not None and (by_slug is TransactionFailed or issubclass(by_slug, BY_STATUS.get(status, ()))):
        return by_slug(status, problem, headers)
    kind = BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return kind(status, problem, headers)
