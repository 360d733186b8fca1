"""Posting to (and closing) WebSocket connections through API Gateway's @connections API
(``CONNECTIONS_ENDPOINT``: https://<api>.execute-api.<region>.amazonaws.com/<stage>, or the
dev server's stand-in). Never retried by botocore: a post that may have landed is not sent
again here (the delivery resends at most a version the client drops as seen)."""

from __future__ import annotations

import functools
import os

from botocore.config import Config
from botocore.exceptions import ClientError

from functions.device_state import dumps, new_client

from .delivery import Gone

CONNECTIONS_ENDPOINT = "CONNECTIONS_ENDPOINT"


@functools.lru_cache(maxsize=4)
def _client(endpoint: str):
    return new_client("apigatewaymanagementapi", endpoint_url=endpoint, config=Config(
        retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2, read_timeout=5))


def post(connection_id: str, message: dict, endpoint: str | None = None) -> None:
    endpoint = endpoint or os.environ[CONNECTIONS_ENDPOINT]
    try:
        _client(endpoint).post_to_connection(ConnectionId=connection_id, Data=dumps(message).encode())
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") == "GoneException":
            raise Gone(connection_id) from None
        raise



def close(connection_id: str, endpoint: str | None = None) -> None:
    """Closes the connection (API Gateway then sends its $disconnect); one already gone is closed."""
    endpoint = endpoint or os.environ[CONNECTIONS_ENDPOINT]
    try:
        _client(endpoint).delete_connection(ConnectionId=connection_id)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "GoneException":
            raise
