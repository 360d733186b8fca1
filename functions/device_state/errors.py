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

    def __init__(self, device_id: str, key: str):
        super().__init__(f"idempotency key {key!r} was used for a different request on device {device_id!r}")
        self.device_id = device_id
        self.key = key


class StorageUnavailable(DeviceStateError):
    """DynamoDB throttled or failed even after botocore's own retries, or could not be
    reached. For a write, whether it landed is unknown unless the message says so."""


class StorageError(DeviceStateError):
    """DynamoDB refused a request for a reason that is a fault of this service."""
