"""One DynamoDB client per container and endpoint, created on first use."""

from __future__ import annotations

import functools
import threading

# botocore sends each request once: a resend of a conditional write whose first copy
# landed is a second, different write, so the library's store decides what is sent again
# (see store.py). Short timeouts keep a lost answer's window to seconds.
RETRY_MODE = "standard"
TOTAL_ATTEMPTS = 1
CONNECT_TIMEOUT_SECONDS = 1
READ_TIMEOUT_SECONDS = 3
MAX_POOL_CONNECTIONS = 64


_creating = threading.Lock()  # a boto3 session is not safe for creating clients from many threads


@functools.lru_cache(maxsize=1)
def _session():
    """One boto3 session per process: it loads the service models once, so a second client
    (another endpoint, or one made again after a cache reset) costs milliseconds, not 0.3 s."""
    import boto3

    return boto3.session.Session()


@functools.lru_cache(maxsize=None)
def dynamodb_client(endpoint_url: str | None = None, region_name: str | None = None):
    from botocore.config import Config

    config = Config(
        retries={"mode": RETRY_MODE, "total_max_attempts": TOTAL_ATTEMPTS},
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS,
        max_pool_connections=MAX_POOL_CONNECTIONS,
        tcp_keepalive=True,
    )
    with _creating:
        return _session().client("dynamodb", endpoint_url=endpoint_url, region_name=region_name, config=config)
