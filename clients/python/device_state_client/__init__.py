"""A device's client for the device-state service: ``DeviceClient`` reads the device, reports,
acknowledges desires and follows its changes over WebSocket."""

from .backoff import Backoff
from .client import ApiError, DeviceClient
from .credentials import CertificateCredentials, TokenCredentials
from .follow import Change, FollowError, Resynced

__all__ = ["ApiError", "Backoff", "CertificateCredentials", "Change", "DeviceClient", "FollowError",
           "Resynced", "TokenCredentials"]
