"""Typed errors of the library. Callers (the HTTP layer among them) map these types,
never their message text."""

from __future__ import annotations


class DeviceStateError(Exception):
    """Base of every error the library raises on purpose."""


class InvalidDeviceId(DeviceStateError, ValueError):
    pass


class InvalidValue(DeviceStateError, ValueError):
    """A state (or a value in it) that cannot be stored. ``limit`` names the rule."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


class ItemTooLarge(InvalidValue):
    def __init__(self, message: str):
        super().__init__(message, limit="item-size")


class InvalidCursor(DeviceStateError, ValueError):
    pass


class InvalidFilter(DeviceStateError, ValueError):
    """A fleet filter (RQL) that does not parse or cannot be answered; ``position`` is the
    character offset of what is wrong, where there is one."""

    def __init__(self, message: str, position: int | None = None):
        super().__init__(message if position is None else f"at position {position}: {message}")
        self.position = position


class UnindexedFilter(InvalidFilter):
    """A filter with a branch on no declared field: answering it would read the whole fleet."""

    def __init__(self, message: str, fields: list[str]):
        super().__init__(message)
        self.fields = fields


class FilterTooBroad(InvalidFilter):
    """A count that would read more than it may: ``limit`` names the bound (``count-items``,
    the devices whose items it would judge, or ``count-index-entries``), ``fields`` the paths
    judged on the items."""

    def __init__(self, message: str, limit: str, fields: list[str]):
        super().__init__(message)
        self.limit = limit
        self.fields = fields


class IndexBuilding(DeviceStateError):
    """A field the query needs is declared but not yet indexed on every device
    (``make reindex`` runs); ``progress`` says how far the backfill got."""

    def __init__(self, fields: list[str], progress: dict):
        super().__init__(f"the fleet index of {', '.join(fields)} is being built; try again when it is ready")
        self.fields = fields
        self.progress = progress


class DeviceNotFound(DeviceStateError):
    def __init__(self, device_id: str):
        super().__init__(f"device {device_id!r} does not exist")
        self.device_id = device_id


class DeviceAlreadyExists(DeviceStateError):
    def __init__(self, device_id: str, current=None):
        super().__init__(f"device {device_id!r} exists already")
        self.device_id = device_id
        self.current = current


class VersionConflict(DeviceStateError):
    """The device is not at the version the write expected. ``current`` is the device
    as DynamoDB returned it with the failed write."""

    def __init__(self, device_id: str, expected_version: int, current):
        found = current.version if current is not None else None
        super().__init__(
            f"device {device_id!r} is at version {found}, not {expected_version}"
        )
        self.device_id = device_id
        self.expected_version = expected_version
        self.current = current


class DesireMoved(DeviceStateError):
    """An acknowledgement answers a desire that is not the leaf's current one: desired has
    set the leaf again since (``current_version``), or does not hold it (None): never did, or
    no longer does."""

    def __init__(self, path: str, version: int, current_version: int | None):
        where = ("desired does not hold it" if current_version is None
                 else f"desired set it at version {current_version}")
        super().__init__(f"the ack of {path} answers version {version}, but {where}")
        self.path, self.version, self.current_version = path, version, current_version


class TooManyConnections(DeviceStateError):
    """The device has ``limit`` connections recorded; ``held``: their members as the refused
    connect found them (some may have ended without their close arriving)."""

    def __init__(self, device_id: str, limit: int, held: tuple[str, ...] = ()):
        super().__init__(f"device {device_id!r} has {limit} connections open, the most it may")
        self.device_id, self.limit, self.held = device_id, limit, held


class CredentialRevoked(DeviceStateError):
    """The credential the device's own request came with is no longer registered: revoked,
    expired, or the device was deleted (or it registered certificates and this one is not
    among them). Nothing was read or written for it."""

    def __init__(self, device_id: str):
        super().__init__(f"the credential presented for device {device_id!r} is revoked or expired")
        self.device_id = device_id


class CredentialNotFound(DeviceStateError):
    """The device has no registered credential of that id (never, or revoked already)."""

    def __init__(self, device_id: str, credential_id: str | None = None):
        super().__init__(f"device {device_id!r} has no credential {credential_id or ''}".rstrip())
        self.device_id, self.credential_id = device_id, credential_id


class CredentialExists(DeviceStateError):
    """The device holds a credential of that id already (a certificate registered twice)."""

    def __init__(self, device_id: str, credential_id: str):
        super().__init__(f"device {device_id!r} holds credential {credential_id} already")
        self.device_id, self.credential_id = device_id, credential_id


class TooManyCredentials(DeviceStateError):
    """The device holds ``limit`` credentials already: revoke one before adding another."""

    def __init__(self, device_id: str, limit: int):
        super().__init__(f"device {device_id!r} holds {limit} credentials, the most it may: revoke one first")
        self.device_id, self.limit = device_id, limit


class EnrollmentNotFound(DeviceStateError):
    def __init__(self, enrollment_id: str):
        super().__init__(f"no enrollment {enrollment_id!r}")
        self.enrollment_id = enrollment_id


class ProvisioningRefused(DeviceStateError):
    """An enrollment will not provision this device: ``reason`` is ``enrollment-ended``
    (deleted or expired), ``enrollment-full``, ``id-not-allowed`` (the id does not match its
    pattern), ``device-exists`` (a device of that id that this enrollment did not provision) or
    ``credential-revoked`` (it did, and its credential was revoked since)."""

    def __init__(self, device_id: str, reason: str, detail: str):
        super().__init__(detail)
        self.device_id, self.reason = device_id, reason


class AssertionReplayed(DeviceStateError):
    """An assertion's ``jti`` was used before: each is good once."""

    def __init__(self, device_id: str):
        super().__init__(f"this assertion for device {device_id!r} was used before: sign a new one (a new jti)")
        self.device_id = device_id


class JobAlreadyWritten(DeviceStateError):
    """The device holds the job's mark: the job's desired write reached it before (at
    ``version``). Nothing was written now."""

    def __init__(self, device_id: str, job_id: str, version: int):
        super().__init__(f"job {job_id!r} wrote device {device_id!r} already, at version {version}")
        self.device_id, self.job_id, self.version = device_id, job_id, version


class TooManyJobs(DeviceStateError):
    """The device holds the marks of ``limit`` jobs whose executions are still tracked: a job's
    write to it is refused (its execution fails with reason ``too-many-jobs``)."""

    def __init__(self, device_id: str, limit: int):
        super().__init__(f"device {device_id!r} is in {limit} jobs still tracked, the most it may be")
        self.device_id, self.limit = device_id, limit


class JobNotFound(DeviceStateError):
    def __init__(self, job_id: str):
        super().__init__(f"job {job_id!r} does not exist")
        self.job_id = job_id


class JobExists(DeviceStateError):
    """A job of that id exists already (a job id names one job for good)."""

    def __init__(self, job_id: str):
        super().__init__(f"a job {job_id!r} exists already")
        self.job_id = job_id


class InvalidJob(DeviceStateError, ValueError):
    """A job's body cannot be run: ``member`` names what is wrong, where one member is."""

    def __init__(self, message: str, member: str | None = None):
        super().__init__(message)
        self.member = member


class JobEnded(DeviceStateError):
    """The job ended already (``status``): it cannot be canceled."""

    def __init__(self, job_id: str, status: str):
        super().__init__(f"job {job_id!r} is {status}: it cannot be canceled")
        self.job_id, self.status = job_id, status


class ConditionFailed(DeviceStateError):
    """The caller's extra condition was false on the current device (no retry)."""

    def __init__(self, device_id: str, current):
        super().__init__(f"the condition on device {device_id!r} is not met")
        self.device_id = device_id
        self.current = current


class RetriesExhausted(DeviceStateError):
    """Every attempt met a newer version; nothing was written by this call."""

    def __init__(self, device_id: str, attempts: int, elapsed: float, reason: str):
        super().__init__(
            f"device {device_id!r}: gave up after {attempts} attempts in "
            f"{elapsed:.3f} s ({reason}); nothing was written"
        )
        self.device_id = device_id
        self.attempts = attempts
        self.elapsed = elapsed
        self.reason = reason


class PatchError(DeviceStateError):
    """Base of the errors patches raise while they are built or applied."""


class InvalidPatch(PatchError, ValueError):
    """The patch document itself is malformed."""


class PatchNotApplicable(PatchError):
    """A well-formed patch that cannot be applied to this state."""


class PatchTestFailed(PatchError):
    """A JSON Patch ``test`` operation did not hold."""


class IdempotencyKeyReused(DeviceStateError):
    """The idempotency key was used before for a different request."""

    def __init__(self, device_id: str | None, key: str):
        where = f"on device {device_id!r}" if device_id is not None else "on jobs"
        super().__init__(f"idempotency key {key!r} was used for a different request {where}")
        self.device_id = device_id
        self.key = key


class StorageUnavailable(DeviceStateError):
    """DynamoDB throttled or failed even after botocore's own retries, or could not be
    reached. For a write, whether it landed is unknown unless the message says so."""


class StorageError(DeviceStateError):
    """DynamoDB refused a request for a reason that is a fault of this service."""


class InvalidLease(DeviceStateError, ValueError):
    """A lease request or lease id that is malformed (a ttl or wait out of range)."""


class LeaseBusy(DeviceStateError):
    """The lease was not acquired within the wait; the ticket was withdrawn.
    ``holder_expires_at`` (epoch seconds) is when the current holder's lease runs out."""

    def __init__(self, device_id: str, holder_expires_at: float | None, waiting: int = 0):
        super().__init__(f"device {device_id!r} is leased by another holder; not acquired within the wait")
        self.device_id = device_id
        self.holder_expires_at = holder_expires_at
        self.waiting = waiting


class LeaseLost(DeviceStateError):
    """The lease (or waiting ticket) expired, was released, or was ended by someone allowed
    to end it: it can no longer be heartbeated or written under."""

    def __init__(self, device_id: str, lease_id: str):
        super().__init__(f"lease {lease_id!r} on device {device_id!r} has expired, was released or was ended")
        self.device_id = device_id
        self.lease_id = lease_id


class DeviceLocked(DeviceStateError):
    """Another holder's lease is active on the device and the write did not present its
    fencing token. ``lease_expires_at`` (epoch seconds) is when that lease runs out."""

    def __init__(self, device_id: str, lease_expires_at: float):
        super().__init__(f"device {device_id!r} is leased; writes need the holder's lease token")
        self.device_id = device_id
        self.lease_expires_at = lease_expires_at


class LeaseOvertaken(DeviceStateError):
    """A waiter's take refused because a later ticket was granted first (its row was queued
    after that ticket looked at the queue): granting it now would hand out a fencing token lower
    than one already granted. The lease queue answers it by queueing the waiter again under a
    new ticket; it never reaches a caller."""

    def __init__(self, device_id: str):
        super().__init__(f"a later ticket took the lease on device {device_id!r} first")
        self.device_id = device_id


class LeaseNotHeld(DeviceStateError):
    """A write presented a lease token, but no lease with that token is active on the device."""

    def __init__(self, device_id: str):
        super().__init__(f"the lease token presented holds no active lease on device {device_id!r}")
        self.device_id = device_id


class UnknownLease(DeviceStateError):
    """No lease with this id was ever issued for the device."""

    def __init__(self, device_id: str, lease_id: str):
        super().__init__(f"no lease {lease_id!r} was issued for device {device_id!r}")
        self.device_id = device_id
        self.lease_id = lease_id


class OutcomeUnknown(DeviceStateError):
    """A write's answer was lost and its outcome could not be settled: the change may or
    may not have been applied (once at most). Read the device to see, or retry with an
    idempotency key, which makes retries safe."""

    def __init__(self, device_id: str, reason: str):
        super().__init__(f"the write to device {device_id!r} may or may not have been applied ({reason}): "
                         "GET the device to see, or retry with an Idempotency-Key, which makes retries safe")
        self.device_id = device_id
        self.reason = reason


# What the store (write/store.py, the one door to DynamoDB) says of a request, beside the
# errors above: the write path reads them, and so may any other part that sends through it.

class ConditionNotMet(DeviceStateError):
    """DynamoDB refused a conditional request: nothing was written. ``item`` is the item as it
    was (ALL_OLD), when DynamoDB returned it."""

    def __init__(self, item: dict | None):
        super().__init__("conditional check failed")
        self.item = item


class AnswerLost(StorageUnavailable):
    """A write's answer was lost: it may or may not have applied. The write path settles a
    state write's outcome through the journal; for any other write it is unknown."""


class RequestRefused(StorageError):
    """DynamoDB's ValidationException: a fault of this service, or the expected refusal of a
    compiled patch (read-modify-write then decides)."""
