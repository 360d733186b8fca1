"""RFC 9457 problem details: the one place where errors become HTTP statuses.

Library errors map by type (never by message); the HTTP layer's own refusals are the
``HttpProblem`` subclasses below.
"""

from __future__ import annotations

import math
import time
from urllib.parse import quote

from .resolver import Response

from functions.device_state import (AnswerLost, AssertionReplayed, ConditionFailed, CredentialExists,
                                    CredentialNotFound, CredentialRevoked, EnrollmentExists, EnrollmentNotFound, InvalidEnrollment,
                                    ProvisioningRefused, TooManyCredentials, DesireMoved, DeviceAlreadyExists, DeviceLocked,
                                    DeviceNotFound, FilterTooBroad, IdempotencyKeyReused, IndexBuilding, InvalidCursor, InvalidFilter,
                                    InvalidDeviceId, InvalidIdempotencyKey, InvalidLease, InvalidPatch, InvalidSince,
                                    InvalidTransaction, InvalidValue, ItemTooLarge, InvalidJob, JobEnded, JobExists,
                                    JobNotFound, LeaseBusy, LeaseLost,
                                    LeaseNotHeld, OutcomeUnknown, PatchNotApplicable, PatchTestFailed,
                                    RetriesExhausted, StorageError, StorageUnavailable, TransactionFailed,
                                    UnindexedFilter, UnknownLease, VersionConflict, VersionNotRecorded, dumps,
                                    timestamp as iso_timestamp, transactions as tx)
from functions.auth.assertions import (AssertionAlgorithm, AssertionAudience, AssertionExpired, AssertionMalformed,
                                      AssertionSubject, CredentialExpired, CredentialUnknown,
                                      InvalidKey)
from functions.auth.credentials import MixedCredentials, Unauthenticated
from functions.auth.sealing import SealingFailed, SealingThrottled, SealingUnavailable
from functions.auth.device_tokens import RenewalRefused
from functions.auth.signers import SigningFailed, SigningThrottled, SigningUnavailable
from functions.auth.rights import Forbidden

from functions.problem_details import MEDIA_TYPE as PROBLEM_JSON
from functions.problem_details import problem
RETRY_AFTER_SECONDS = "1"


class HttpProblem(Exception):
    status = 400
    slug = "bad-request"
    title = "Bad request"

    def __init__(self, detail: str, *, headers: dict | None = None, current=None, **members):
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}
        self.current = current
        self.members = members


class BadRequest(HttpProblem):
    pass


class RouteNotFound(HttpProblem):
    status, slug, title = 404, "not-found", "No such resource"


class LeaseNotFound(HttpProblem):
    status, slug, title = 404, "lease-not-found", "No such lease"


class MethodNotAllowed(HttpProblem):
    status, slug, title = 405, "method-not-allowed", "Method not allowed"


class PreconditionFailed(HttpProblem):
    status, slug, title = 412, "precondition-failed", "Precondition failed"


class PayloadTooLarge(HttpProblem):
    status, slug, title = 413, "too-large", "Request or resulting item too large"


class UnsupportedMediaType(HttpProblem):
    status, slug, title = 415, "unsupported-media-type", "Unsupported Content-Type"


class PreconditionRequired(HttpProblem):
    status, slug, title = 428, "precondition-required", "Precondition required"


# Library error type -> (status, slug, title). Looked up along the exception's MRO.
_LIBRARY_ERRORS = {
    AssertionMalformed: (401, "assertion-invalid", "Invalid assertion"),
    AssertionExpired: (401, "assertion-expired", "The assertion has expired"),
    AssertionAlgorithm: (401, "assertion-algorithm", "The assertion's algorithm is not one the service verifies"),
    AssertionAudience: (401, "assertion-audience", "The assertion is for another audience"),
    AssertionSubject: (401, "assertion-subject", "The assertion names another device"),
    AssertionReplayed: (401, "assertion-replayed", "The assertion was used before"),
    CredentialUnknown: (401, "credential-unknown", "No credential verifies the assertion"),
    CredentialExpired: (401, "credential-expired", "The credential has expired"),
    CredentialRevoked: (401, "credential-revoked", "The credential is revoked or not registered"),
    Unauthenticated: (401, "unauthorized", "Unauthorized"),
    Forbidden: (403, "forbidden", "Forbidden"),
    MixedCredentials: (400, "mixed-credentials", "A certificate and a token together"),
    RenewalRefused: (403, "certificate-required", "Renewal needs the device's certificate"),
    SigningThrottled: (429, "signing-throttled", "Too many tokens are being signed at once"),
    SigningUnavailable: (503, "signing-unavailable", "Token signing temporarily unavailable"),
    SealingThrottled: (429, "sealing-throttled", "Too many secrets are being opened at once"),
    SealingUnavailable: (503, "sealing-unavailable", "The sealing key is temporarily unavailable"),
    InvalidKey: (400, "invalid-credential", "Invalid credential"),
    TooManyCredentials: (409, "too-many-credentials", "The device holds its most credentials"),
    CredentialExists: (409, "credential-exists", "The device holds this credential already"),
    CredentialNotFound: (404, "credential-not-found", "No such credential"),
    EnrollmentExists: (409, "enrollment-exists", "Enrollment exists already"),
    InvalidEnrollment: (400, "invalid-enrollment", "Invalid enrollment"),
    EnrollmentNotFound: (404, "enrollment-not-found", "No such enrollment"),
    ProvisioningRefused: (403, "provisioning-refused", "Provisioning refused"),
    InvalidDeviceId: (400, "invalid-device-id", "Invalid deviceId"),
    ItemTooLarge: (413, "too-large", "Request or resulting item too large"),
    InvalidValue: (400, "invalid-value", "Value cannot be stored"),
    InvalidCursor: (400, "invalid-cursor", "Invalid cursor"),
    UnindexedFilter: (400, "unindexed-filter", "Filter needs a declared field"),
    FilterTooBroad: (400, "filter-too-broad", "Filter too broad to count"),
    InvalidFilter: (400, "invalid-filter", "Invalid filter"),
    IndexBuilding: (503, "index-building", "Fleet index is being built"),
    InvalidSince: (400, "invalid-since", "since is past the device's current version"),
    InvalidIdempotencyKey: (400, "invalid-idempotency-key", "Invalid Idempotency-Key"),
    IdempotencyKeyReused: (422, "idempotency-key-reused", "Idempotency-Key used for a different request"),
    InvalidPatch: (400, "invalid-patch", "Invalid patch document"),
    PatchNotApplicable: (422, "patch-not-applicable", "Patch cannot be applied"),
    PatchTestFailed: (409, "patch-test-failed", "JSON Patch test failed"),
    DeviceNotFound: (404, "device-not-found", "No such device"),
    InvalidJob: (400, "invalid-job", "The job cannot be run"),
    JobNotFound: (404, "job-not-found", "No such job"),
    JobExists: (409, "job-exists", "A job of that id exists"),
    JobEnded: (409, "job-ended", "The job has ended"),
    DeviceAlreadyExists: (409, "device-exists", "Device exists already"),
    VersionConflict: (412, "version-conflict", "Device is at another version"),
    ConditionFailed: (409, "condition-failed", "Condition not met"),
    DesireMoved: (409, "desire-moved", "The acknowledged desire is not the leaf's current one; nothing was written"),
    InvalidTransaction: (400, "invalid-transaction", "Invalid transaction"),
    TransactionFailed: (409, "transaction-failed", "Transaction not applied; nothing was written"),
    InvalidLease: (400, "invalid-lease", "Invalid lease request"),
    LeaseBusy: (409, "lease-busy", "Device is leased by another holder"),
    LeaseLost: (410, "lease-gone", "Lease has expired, was released or was ended"),
    LeaseNotHeld: (409, "lease-not-held", "Lease-Token names no active lease"),
    UnknownLease: (404, "lease-not-found", "No such lease"),
    DeviceLocked: (423, "locked", "Device is leased; writes need the holder's Lease-Token"),
    RetriesExhausted: (503, "contention", "Too much contention on this device; nothing was written"),
    OutcomeUnknown: (504, "outcome-unknown", "The change may or may not have been applied"),
    AnswerLost: (504, "outcome-unknown", "The change may or may not have been applied"),
    StorageUnavailable: (503, "storage-unavailable", "Storage temporarily unavailable"),
    VersionNotRecorded: (503, "not-yet-recorded", "The version is written but not yet in the history"),
    StorageError: (500, "internal-error", "Internal error"),
}
_RETRYABLE = (RetriesExhausted, StorageUnavailable, VersionNotRecorded, IndexBuilding)
# Errors whose own message names internals (endpoint URLs, botocore's text): the client
# gets this detail instead; the message is logged with the request.
_GENERIC_DETAIL = {
    StorageUnavailable: "Storage is unavailable for now; nothing was written. Send the request again after "
                        "Retry-After.",
}


# Why an enrollment refused to provision a device -> its status, type and title.
PROVISIONING_REFUSALS = {
    "enrollment-ended": (403, "enrollment-ended", "The enrollment was deleted or has expired"),
    "enrollment-full": (403, "enrollment-full", "The enrollment has provisioned its most devices"),
    "id-not-allowed": (403, "id-not-allowed", "The device id does not match the enrollment's idPattern"),
    "credential-revoked": (403, "provisioned-credential-revoked",
                           "The credential the enrollment provisioned the device with was revoked"),
    "device-exists": (409, "device-exists", "A device of that id exists that this enrollment did not provision"),
}


# Why an operation of a transaction failed -> its status, as the single-device routes answer.
TRANSACTION_REASON_STATUS = {
    tx.NOT_FOUND: 404, tx.EXISTS: 409, tx.VERSION: 412, tx.CONDITION: 409,
    tx.TEST_FAILED: 409, tx.NOT_APPLICABLE: 422, tx.LOCKED: 423, tx.LEASE_NOT_HELD: 409,
}


def _transaction_members(error: TransactionFailed) -> tuple[int, list[dict]]:
    """The per-operation report, and the status of the whole: the operations' own when
    they agree, 409 when they differ."""
    operations = [{
        "index": failure.index,
        "deviceId": failure.device_id,
        "status": TRANSACTION_REASON_STATUS[failure.reason],
        "reason": failure.reason,
        "detail": failure.detail,
        "currentVersion": failure.current.version if failure.current is not None else None,
        **({"leaseExpiresAt": iso_timestamp(failure.lease_expires_at)} if failure.lease_expires_at else {}),
    } for failure in error.failures]
    statuses = {operation["status"] for operation in operations}
    return (statuses.pop() if len(statuses) == 1 else 409), operations


def _lease_expiry(error, headers: dict, members: dict) -> None:
    """When the lease in the way runs out: a member, and Retry-After in whole seconds."""
    expires = error.holder_expires_at if isinstance(error, LeaseBusy) else error.lease_expires_at
    if expires is None:
        headers["Retry-After"] = RETRY_AFTER_SECONDS
        return
    members["holderExpiresAt" if isinstance(error, LeaseBusy) else "leaseExpiresAt"] = iso_timestamp(expires)
    headers["Retry-After"] = str(max(1, math.ceil(expires - time.time())))


def etag(version: int) -> str:
    return f'"{version}"'


def problem_response(status: int, slug: str, title: str, detail: str, *, instance: str | None = None,
                     headers: dict | None = None, **members) -> Response:
    body = problem(status, slug, title, detail, instance=_reference(instance) if instance else None, **members)
    return Response(status_code=status, content_type=PROBLEM_JSON, body=dumps(body), headers=headers)


def _reference(path: str) -> str:
    """The request's path as a URI reference: what is not ASCII percent-encoded as UTF-8 (a lone
    surrogate, which stands for a byte that is no UTF-8, as its own three bytes), so that the
    problem is JSON any client can read."""
    return quote(path.encode("utf-8", "surrogatepass"), safe="/%!$&'()*+,;=:@")


def known_error_response(error: Exception, instance: str | None = None) -> Response | None:
    """The response for an error this service raises on purpose, or None for a fault."""
    if isinstance(error, HttpProblem):
        status, slug, title = error.status, error.slug, error.title
        headers, members, current = dict(error.headers), dict(error.members), error.current
    else:
        mapped = next((_LIBRARY_ERRORS[cls] for cls in type(error).__mro__ if cls in _LIBRARY_ERRORS), None)
        if mapped is None or status_is_fault(mapped[0]):
            return None
        status, slug, title = mapped
        if isinstance(error, ProvisioningRefused):
            status, slug, title = PROVISIONING_REFUSALS[error.reason]
        headers, members, current = {}, {}, getattr(error, "current", None)
        members["deviceId"] = getattr(error, "device_id", None)
        members["limit"] = getattr(error, "limit", None)
        if isinstance(error, (InvalidFilter, IndexBuilding)):  # where the filter is wrong, what it needs
            members.update(position=getattr(error, "position", None), fields=getattr(error, "fields", None),
                           progress=getattr(error, "progress", None))
        if isinstance(error, _RETRYABLE):
            headers["Retry-After"] = RETRY_AFTER_SECONDS
        if isinstance(error, (SigningFailed, SealingFailed)):
            headers["Retry-After"] = str(error.retry_after)
        if isinstance(error, TransactionFailed):
            status, members["operations"] = _transaction_members(error)
            leases_in_the_way = [failure.lease_expires_at for failure in error.failures if failure.lease_expires_at]
            if leases_in_the_way:  # all or nothing: worth sending again once the last of them runs out
                headers["Retry-After"] = str(max(1, math.ceil(max(leases_in_the_way) - time.time())))
        if isinstance(error, (LeaseBusy, DeviceLocked)):
            _lease_expiry(error, headers, members)
        if isinstance(error, Unauthenticated):  # RFC 6750 3.1
            headers["WWW-Authenticate"] = 'Bearer error="invalid_token"' if error.token_given else "Bearer"
        if isinstance(error, (CredentialRevoked, AssertionReplayed)):  # what came is no longer good
            headers["WWW-Authenticate"] = 'Bearer error="invalid_token"'
        if isinstance(error, DesireMoved):
            members.update(path=error.path, ackVersion=error.version, leafVersion=error.current_version)
        if isinstance(error, (InvalidJob, JobNotFound, JobExists, JobEnded)):
            members.update(member=getattr(error, "member", None), jobId=getattr(error, "job_id", None),
                           jobStatus=getattr(error, "status", None))
        if isinstance(error, Forbidden):
            members.update(action=error.action, resource=error.resource, index=error.index)
    if current is not None:
        members["deviceId"] = current.device_id
        members["currentVersion"] = current.version
        headers["ETag"] = etag(current.version)
    detail = next((text for kind, text in _GENERIC_DETAIL.items() if isinstance(error, kind)), str(error))
    return problem_response(status, slug, title, detail, instance=instance, headers=headers, **members)


def refused_on_its_form(error: Exception) -> bool:
    """Whether ``error`` refuses a request on its form or its rights (the API's own refusals, and
    the library's 400, 403 and 413), which may come before anything of the caller's device is read."""
    if isinstance(error, HttpProblem):
        return True
    mapped = next((_LIBRARY_ERRORS[cls] for cls in type(error).__mro__ if cls in _LIBRARY_ERRORS), None)
    return mapped is not None and mapped[0] in (400, 403, 413)


def status_is_fault(status: int) -> bool:
    """5xx answers that are faults of the service; 503 (nothing was written) and 504 (the
    outcome is unknown) are answers about DynamoDB that the client must act on."""
    return status >= 500 and status not in (503, 504)


def internal_error_response(instance: str | None = None) -> Response:
    return problem_response(500, "internal-error", "Internal error",
                            "The service failed; the cause is logged.",
                            instance=instance)
