"""Every function's configuration, read from environment variables in this one place, checked
on the first request (not at import). Each Lambda reads its own subset (``api_config``,
``processor_config``, ``push_config``); the CDK stack sets each function exactly the names of
its subset (``API_VARIABLES``, ``PROCESSOR_VARIABLES``, ``PUSH_VARIABLES``), plus Powertools'
own ``POWERTOOLS_*`` and, where callers are authenticated, ``functions.auth.credentials``'
``AUTH_*``."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from functions.device_state import DEFAULT_RETENTION_SECONDS
from functions.device_state import DEFAULT_BUDGET_SECONDS, DEFAULT_MAX_ATTEMPTS
from functions.device_state import DEFAULT_SETTLE_SECONDS
from functions.device_state import DEFAULT_TOMBSTONE_SECONDS
from functions.device_state import FleetIndex, FleetIndexError
from functions.device_state import MIN_CURSOR_KEY_BYTES

TABLE_NAME = "TABLE_NAME"
DYNAMODB_ENDPOINT = "DYNAMODB_ENDPOINT"
CHANGE_RETENTION_SECONDS = "CHANGE_RETENTION_SECONDS"  # how long the change feed and history are kept
MAX_ATTEMPTS = "MAX_ATTEMPTS"
RETRY_BUDGET_SECONDS = "RETRY_BUDGET_SECONDS"
REQUIRE_IF_MATCH = "REQUIRE_IF_MATCH"
SETTLE_SECONDS = "SETTLE_SECONDS"  # how long a write whose answer was lost is settled before a 504
TOMBSTONE_SECONDS = "TOMBSTONE_SECONDS"  # how long a deleted device's version is kept
EVENT_BUS_NAME = "EVENT_BUS_NAME"  # the EventBridge bus for DeviceStateChanged events
CHANGE_EVENTS_FILE = "CHANGE_EVENTS_FILE"  # locally: append the events to this file instead
FLEET_INDEX = "FLEET_INDEX"  # the queryable fields, path:type,… (functions.device_state.fleet.index)
# The key that seals listings' cursors (functions.device_state.fleet.cursors): at least 32 characters,
# the same for every function instance; deployed, a generated secret; locally, .serve/cursor-key
CURSOR_KEY = "CURSOR_KEY"
JOB_RUNNER_FUNCTION = "JOB_RUNNER_FUNCTION"  # the API's: the job runner it starts a created job's run on
# true: every device must register its certificates (a certificate of the trusted CA that its
# device never registered opens nothing); see functions/device_state/item/credentials.py
REQUIRE_REGISTERED_CREDENTIALS = "REQUIRE_REGISTERED_CREDENTIALS"
# true on the API function, whose routes are not the waiting ones (a function of their own
# serves those): a request that reaches it with waitSeconds anyway is answered at once
NEVER_WAIT = "NEVER_WAIT"

STORAGE_VARIABLES = (TABLE_NAME, DYNAMODB_ENDPOINT, CHANGE_RETENTION_SECONDS)
API_VARIABLES = STORAGE_VARIABLES + (MAX_ATTEMPTS, RETRY_BUDGET_SECONDS, REQUIRE_IF_MATCH, SETTLE_SECONDS,
                                     TOMBSTONE_SECONDS, FLEET_INDEX, NEVER_WAIT, CURSOR_KEY,
                                     REQUIRE_REGISTERED_CREDENTIALS, JOB_RUNNER_FUNCTION)
JOBS_VARIABLES = STORAGE_VARIABLES + (FLEET_INDEX, CURSOR_KEY)
REINDEX_VARIABLES = STORAGE_VARIABLES + (FLEET_INDEX,)
PROCESSOR_VARIABLES = STORAGE_VARIABLES + (EVENT_BUS_NAME, CHANGE_EVENTS_FILE)
# a device's connects set connectivity/connected, and find the credential it comes with
PUSH_VARIABLES = STORAGE_VARIABLES + (FLEET_INDEX, REQUIRE_REGISTERED_CREDENTIALS)

MAX_BUDGET_SECONDS = 20.0  # must stay under API Gateway's 29 s integration timeout
MAX_SETTLE_SECONDS = 15.0
# Past a WebSocket connection's 2 hours: the fan-out leaves a follower of some sections where it last
# heard until one of them changes, and its catch-up then reads the feed from there (a minute's
# retention threw caught-up followers out with changes-expired).
MIN_RETENTION_SECONDS = 3 * 60 * 60
MAX_RETENTION_SECONDS = MAX_TOMBSTONE_SECONDS = 366 * 24 * 60 * 60


class ConfigError(RuntimeError):
    pass


@dataclass(frozen=True)
class StorageConfig:
    """The table every function works on, and how long its changes are kept."""

    table_name: str
    dynamodb_endpoint: str | None = None
    change_retention_seconds: int = DEFAULT_RETENTION_SECONDS

    @classmethod
    def from_environment(cls, environ=os.environ) -> "StorageConfig":
        return cls(**_storage(environ))


@dataclass(frozen=True)
class ApiConfig(StorageConfig):
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_budget_seconds: float = DEFAULT_BUDGET_SECONDS
    require_if_match: bool = False
    settle_seconds: float = DEFAULT_SETTLE_SECONDS
    tombstone_seconds: int = DEFAULT_TOMBSTONE_SECONDS
    fleet_index: FleetIndex = FleetIndex()
    never_wait: bool = False
    cursor_key: bytes = field(default=b"", repr=False)
    job_runner_function: str | None = None  # where one is deployed: a created job's run starts at once
    require_registered_credentials: bool = False

    @classmethod
    def from_environment(cls, environ=os.environ) -> "ApiConfig":
        storage = _storage(environ)
        return cls(
            **storage,
            max_attempts=_integer(environ, MAX_ATTEMPTS, DEFAULT_MAX_ATTEMPTS, 1, 100),
            retry_budget_seconds=_number(environ, RETRY_BUDGET_SECONDS, DEFAULT_BUDGET_SECONDS, 0.0,
                                         MAX_BUDGET_SECONDS),
            require_if_match=_boolean(environ, REQUIRE_IF_MATCH),
            settle_seconds=_number(environ, SETTLE_SECONDS, DEFAULT_SETTLE_SECONDS, 0.0, MAX_SETTLE_SECONDS),
            tombstone_seconds=tombstone_seconds(environ.get(TOMBSTONE_SECONDS), storage["change_retention_seconds"]),
            fleet_index=fleet_index(environ),
            never_wait=_boolean(environ, NEVER_WAIT),
            cursor_key=_cursor_key(environ),
            job_runner_function=environ.get(JOB_RUNNER_FUNCTION) or None,
            require_registered_credentials=_boolean(environ, REQUIRE_REGISTERED_CREDENTIALS),
        )


@dataclass(frozen=True)
class JobsConfig(StorageConfig):
    """The job runner's: the fleet index its filters query, and the key its query cursors are
    sealed with (the API's: a job's cursor is the fleet query's)."""

    fleet_index: FleetIndex = FleetIndex()
    cursor_key: bytes = field(default=b"", repr=False)

    @classmethod
    def from_environment(cls, environ=os.environ) -> "JobsConfig":
        return cls(**_storage(environ), fleet_index=fleet_index(environ), cursor_key=_cursor_key(environ))


@dataclass(frozen=True)
class ProcessorConfig(StorageConfig):
    event_bus_name: str | None = None
    events_file: str | None = None

    @classmethod
    def from_environment(cls, environ=os.environ) -> "ProcessorConfig":
        return cls(**_storage(environ), event_bus_name=environ.get(EVENT_BUS_NAME) or None,
                   events_file=environ.get(CHANGE_EVENTS_FILE) or None)


@dataclass(frozen=True)
class PushConfig(StorageConfig):
    require_registered_credentials: bool = False

    @classmethod
    def from_environment(cls, environ=os.environ) -> "PushConfig":
        return cls(**_storage(environ),
                   require_registered_credentials=_boolean(environ, REQUIRE_REGISTERED_CREDENTIALS))


def _storage(environ) -> dict:
    table_name = environ.get(TABLE_NAME, "").strip()
    if not table_name:
        raise ConfigError(f"{TABLE_NAME} is not set")
    return {"table_name": table_name, "dynamodb_endpoint": environ.get(DYNAMODB_ENDPOINT) or None,
            "change_retention_seconds": _integer(environ, CHANGE_RETENTION_SECONDS, DEFAULT_RETENTION_SECONDS,
                                                 MIN_RETENTION_SECONDS, MAX_RETENTION_SECONDS)}


def tombstone_seconds(raw, change_retention_seconds: int, name: str = TOMBSTONE_SECONDS) -> int:
    """How long a deleted device keeps its version: ``raw`` (unset: the larger of 30 days and the
    change retention), never less than the retention. A device created again once its tombstone is
    gone starts over at version 1, so its former changes must have expired by then (a shorter
    tombstone left them in its feed and history, and its own changes unrecorded). ``name``: what
    set ``raw``, for the error."""
    if raw in (None, ""):
        return max(DEFAULT_TOMBSTONE_SECONDS, change_retention_seconds)
    value = int(raw) if str(raw).isdecimal() else -1
    if not change_retention_seconds <= value <= MAX_TOMBSTONE_SECONDS:
        raise ConfigError(f"{name}: {raw!r} is not {change_retention_seconds} (the change retention) to "
                          f"{MAX_TOMBSTONE_SECONDS} seconds; a device created again after its tombstone expired "
                          "would find its former changes in its feed")
    return value


def _cursor_key(environ) -> bytes:
    """Required: a key of each process's own would refuse the cursors another one issued."""
    key = environ.get(CURSOR_KEY, "").encode()
    if len(key) < MIN_CURSOR_KEY_BYTES:
        raise ConfigError(f"{CURSOR_KEY} must be set to at least {MIN_CURSOR_KEY_BYTES} characters (the key that "
                          "seals listings' cursors, the same for every instance)")
    return key


def fleet_index(environ=os.environ) -> FleetIndex:
    try:
        return FleetIndex.parse(environ.get(FLEET_INDEX))
    except FleetIndexError as error:
        raise ConfigError(f"{FLEET_INDEX}: {error}") from None


def _integer(environ, name, default, low, high) -> int:
    raw = environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if not low <= value <= high:
        raise ConfigError(f"{name}={value} is outside {low}..{high}")
    return value


def _number(environ, name, default, low, high) -> float:
    raw = environ.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not low < value <= high:
        raise ConfigError(f"{name}={value} is outside ({low}, {high}]")
    return value


def _boolean(environ, name) -> bool:
    raw = environ.get(name, "false").strip().lower()
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no", ""):
        return False
    raise ConfigError(f"{name}={raw!r} is not true or false")


@functools.lru_cache(maxsize=1)
def api_config() -> ApiConfig:
    return ApiConfig.from_environment()


@functools.lru_cache(maxsize=1)
def processor_config() -> ProcessorConfig:
    return ProcessorConfig.from_environment()


@functools.lru_cache(maxsize=1)
def push_config() -> PushConfig:
    return PushConfig.from_environment()
