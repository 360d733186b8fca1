"""One DynamoDB client per container and endpoint, created on first use."""

from __future__ import annotations

import functools

# Throttling and DynamoDB 5xx are retried here, by botocore's standard mode, never by the
# optimistic-locking loop; the timeouts keep a stuck call well inside the Lambda timeout.
RETRY_MODE = "standard"
RETRY_MAX_ATTEMPTS = 3
CONNECT_TIMEOUT_SECONDS = 2
READ_TIMEOUT_SECONDS = 5
MAX_POOL_CONNECTIONS = 64


@functools.lru_cache(maxsize=None)
def dynamodb_client(endpoint_url: str | None = None, region_name: str | None = None):
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"mode": RETRY_MODE, "max_attempts": RETRY_MAX_ATTEMPTS},
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        read_timeout=READ_TIMEOUT_SECONDS,
        max_pool_connections=MAX_POOL_CONNECTIONS,
        tcp_keepalive=True,
    )
    return boto3.session.Session().client(
        "dynamodb", endpoint_url=endpoint_url, region_name=region_name, config=config
    )
