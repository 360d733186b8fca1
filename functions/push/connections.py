"""Posting to, looking up and closing WebSocket connections through API Gateway's @connections
API (``CONNECTIONS_ENDPOINT``: https://<api>.execute-api.<region>.amazonaws.com/<stage>, or the
dev server's stand-in). Never retried by botocore: a post that may have landed is not sent
again here (the delivery resends at most a version the client drops as seen)."""

from __future__ import annotations

import functools
import logging
import os

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from functions.device_state import dumps, new_client

from .delivery import Gone

CONNECTIONS_ENDPOINT = "CONNECTIONS_ENDPOINT"
READ_TIMEOUT_SECONDS = 5  # a post's or a close's
# A connect at its device's cap waits for its lookups: a slow answer counts the connection as open.
LOOKUP_TIMEOUT_SECONDS = 1
logger = logging.getLogger("device_state.push")


@functools.lru_cache(maxsize=4)
def _client(endpoint: str, read_timeout: float = READ_TIMEOUT_SECONDS):
    return new_client("apigatewaymanagementapi", endpoint_url=endpoint, config=Config(
        retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=min(2, read_timeout),
        read_timeout=read_timeout))


def post(connection_id: str, message: dict, endpoint: str | None = None) -> None:
    endpoint = endpoint or os.environ[CONNECTIONS_ENDPOINT]
    try:
        _client(endpoint).post_to_connection(ConnectionId=connection_id, Data=dumps(message).encode())
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "GoneException":
            raise Gone(connection_id) from None
        raise


def known_gone(connection_id: str, endpoint: str | None = None) -> bool:
    """True when API Gateway answers that the connection is gone (closed, or not established
    yet); False when it is open, or when the question gets no answer (then it still counts)."""
    endpoint = endpoint or os.environ.get(CONNECTIONS_ENDPOINT)
    if not endpoint:
        logger.warning("connection not looked up", extra={"reason": f"{CONNECTIONS_ENDPOINT} is not set"})
        return False
    try:
        _client(endpoint, LOOKUP_TIMEOUT_SECONDS).get_connection(ConnectionId=connection_id)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "GoneException":
            return True
        logger.warning("connection not looked up", extra={"reason": str(error)})
    except BotoCoreError as error:
        logger.warning("connection not looked up", extra={"reason": str(error)})
    return False


def close(connection_id: str, endpoint: str | None = None) -> None:
    """Closes the connection (API Gateway then sends its $disconnect); one already gone is closed."""
    endpoint = endpoint or os.environ[CONNECTIONS_ENDPOINT]
    try:
        _client(endpoint).delete_connection(ConnectionId=connection_id)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "GoneException":
            raise
