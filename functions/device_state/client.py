"""One DynamoDB client per container and endpoint, created on first use."""

from __future__ import annotations

import functools
import os
import threading

from .restore import on_restore

# botocore sends each request once: a resend of a conditional write whose first copy
# landed is a second, different write, so the library's store decides what is sent again
# (see write/store.py). Short timeouts keep a lost answer's window to seconds.
RETRY_MODE = "standard"
TOTAL_ATTEMPTS = 1
CONNECT_TIMEOUT_SECONDS = 1
READ_TIMEOUT_SECONDS = 3
LONGEST_SEND_SECONDS = CONNECT_TIMEOUT_SECONDS + READ_TIMEOUT_SECONDS  # one send, answered or not
MAX_POOL_CONNECTIONS = 64


@functools.lru_cache(maxsize=1)
def _service_models():
    from botocore.loaders import create_loader

    return create_loader()


MAX_SESSIONS = 8  # a process sees few environments; a bound all the same, since each keeps ~130 handlers
_sessions: dict[tuple, object] = {}
_sessions_lock = threading.Lock()


def new_client(service_name: str, **options):
    """A new boto3 client whose credentials and region come from the environment as it is now.
    Clients made while the ``AWS_*`` variables stay the same share one session: a client then
    costs about 9 ms, not the 40 ms of a new session registering its ~130 handlers (every
    session shares the service models, read once). A shared session resolves credentials from
    a profile file or a provider once, as any long-lived client does. A session is not safe to
    use from two threads at once, so clients are made one at a time."""
    import boto3.session
    import botocore.session

    environment = tuple(sorted((name, value) for name, value in os.environ.items() if name.startswith("AWS_")))
    with _sessions_lock:
        session = _sessions.get(environment)
        if session is None:
            if len(_sessions) >= MAX_SESSIONS:
                del _sessions[next(iter(_sessions))]  # the oldest
            core = botocore.session.get_session()
            core.register_component("data_loader", _service_models())
            session = _sessions[environment] = boto3.session.Session(botocore_session=core)
        return session.client(service_name, **options)


def dynamodb_client(endpoint_url: str | None = None, region_name: str | None = None):
    """The client for ``endpoint_url`` (else ``DYNAMODB_ENDPOINT``, else AWS) in ``region_name``
    (else ``AWS_REGION``, which Lambda sets, else ``AWS_DEFAULT_REGION``), read at each call so a
    script can point the library anywhere; one client per endpoint and region."""
    endpoint_url = endpoint_url or os.environ.get("DYNAMODB_ENDPOINT") or None
    region_name = region_name or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
    return _client(endpoint_url, region_name)


@functools.lru_cache(maxsize=None)
def _client(endpoint_url: str | None, region_name: str | None):
    from botocore.config import Config

    config = Config(
        retries={"mode": RETRY_MODE, "total_max_attempts": TOTAL_ATTEMPTS},
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS,
        max_pool_connections=MAX_POOL_CONNECTIONS,
        tcp_keepalive=True,
    )
    return new_client("dynamodb", endpoint_url=endpoint_url, region_name=region_name, config=config)


dynamodb_client.cache_clear = _client.cache_clear  # a test that swaps engines starts from fresh clients


def start_function(function_name: str, payload: dict, attempts: int = 1) -> None:
    """Starts a Lambda function without waiting for its run (an Event invoke), each attempt held
    to a DynamoDB send's timeouts (``LONGEST_SEND_SECONDS``): boto3's defaults (60 s to read)
    would hold a request whose caller must be answered in time, which makes one attempt; a caller
    with time to spare (the job runner) tries again after a throttle or a lost connection.
    Raises what boto3 raises."""
    import json

    from botocore.config import Config

    config = Config(retries={"total_max_attempts": attempts, "mode": "standard"},
                    connect_timeout=CONNECT_TIMEOUT_SECONDS, read_timeout=READ_TIMEOUT_SECONDS)
    new_client("lambda", config=config).invoke(FunctionName=function_name, InvocationType="Event",
                                               Payload=json.dumps(payload).encode())


# A restored copy must not reuse the snapshotted process's connections, nor the credentials
# its sessions resolved before the snapshot: sessions and clients are created afresh on first use.
def _forget_sessions() -> None:
    with _sessions_lock:
        _sessions.clear()


on_restore(dynamodb_client.cache_clear)
on_restore(_forget_sessions)
