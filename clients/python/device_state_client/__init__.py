"""Clients of the device-state service. ``DeviceClient``: a device reads itself, reports,
acknowledges desires and follows its changes over WebSocket. ``AppClient``: an app or a
back-end reads, queries and writes devices, and follows many of them on one WebSocket. The
``device-state`` command (the ``cli`` extra) is built on ``AppClient``.

Names are imported when first used, so that importing the package (the command's start-up
above all) loads no HTTP or WebSocket library it does not use."""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "AppClient": "app", "Lease": "app",
    "Backoff": "backoff",
    "DeviceClient": "client",
    "CertificateCredentials": "credentials", "CommandCredentials": "credentials",
    "CredentialsError": "credentials", "TokenCredentials": "credentials", "KeyCredentials": "credentials",
    "SecretCredentials": "credentials", "EnrollmentCredentials": "credentials", "derive_device_key": "credentials",
    "sign_assertion": "credentials",
    "Change": "follow", "FollowError": "follow", "Follower": "follow", "Resynced": "follow",
    "ApiError": "errors", "BadRequest": "errors", "ChangesExpired": "errors", "Conflict": "errors",
    "DesireMoved": "errors", "DeviceExists": "errors", "Forbidden": "errors", "Gone": "errors",
    "LeaseBusy": "errors", "LeaseGone": "errors", "LeaseNotHeld": "errors", "Locked": "errors",
    "NotFound": "errors", "OutcomeUnknown": "errors", "PatchTestFailed": "errors", "PayloadTooLarge": "errors",
    "PreconditionFailed": "errors", "PreconditionRequired": "errors", "ServerError": "errors",
    "TooManyRequests": "errors", "TransactionFailed": "errors", "Unauthorized": "errors",
    "Unavailable": "errors", "Unprocessable": "errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
