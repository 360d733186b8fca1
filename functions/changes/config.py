"""The stream processor's configuration, read from environment variables in this one place
(on the first batch, not at import); the CDK stack sets exactly these names."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from functions.device_state.changes import DEFAULT_RETENTION_SECONDS

TABLE_NAME = "TABLE_NAME"
DYNAMODB_ENDPOINT = "DYNAMODB_ENDPOINT"
CHANGE_RETENTION_SECONDS = "CHANGE_RETENTION_SECONDS"  # how long change items (feed, history) are kept
EVENT_BUS_NAME = "EVENT_BUS_NAME"  # the EventBridge bus for DeviceStateChanged events
CHANGE_EVENTS_FILE = "CHANGE_EVENTS_FILE"  # locally: append the events to this file instead
VARIABLES = (TABLE_NAME, DYNAMODB_ENDPOINT, CHANGE_RETENTION_SECONDS, EVENT_BUS_NAME, CHANGE_EVENTS_FILE)

MIN_RETENTION_SECONDS = 60
MAX_RETENTION_SECONDS = 366 * 24 * 60 * 60


class ConfigError(RuntimeError):
    pass


def retention_seconds(environ=os.environ) -> int:
    raw = environ.get(CHANGE_RETENTION_SECONDS) or ""
    if not raw:
        return DEFAULT_RETENTION_SECONDS
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{CHANGE_RETENTION_SECONDS}={raw!r} is not an integer") from None
    if not MIN_RETENTION_SECONDS <= value <= MAX_RETENTION_SECONDS:
        raise ConfigError(f"{CHANGE_RETENTION_SECONDS}={value} is outside "
                          f"{MIN_RETENTION_SECONDS}..{MAX_RETENTION_SECONDS}")
    return value


@dataclass(frozen=True)
class Config:
    table_name: str
    dynamodb_endpoint: str | None
    retention_seconds: int
    event_bus_name: str | None
    events_file: str | None

    @classmethod
    def from_environment(cls, environ=os.environ) -> "Config":
        table_name = environ.get(TABLE_NAME, "").strip()
        if not table_name:
            raise ConfigError(f"{TABLE_NAME} is not set")
        return cls(table_name, environ.get(DYNAMODB_ENDPOINT) or None, retention_seconds(environ),
                   environ.get(EVENT_BUS_NAME) or None, environ.get(CHANGE_EVENTS_FILE) or None)


@functools.lru_cache(maxsize=1)
def load_config() -> Config:
    return Config.from_environment()
