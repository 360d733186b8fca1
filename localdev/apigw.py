"""API Gateway HTTP API proxy events (payload format 1.0) and a Lambda context, as Lambda
would hand them to the handler: shared by the dev server, `make invoke` and the tests. The
HTTP API has no authorizer: the handler verifies each request's credentials itself."""

from __future__ import annotations

import base64
import time
import uuid
from urllib.parse import parse_qs, urlsplit

STAGE = "$default"  # the HTTP API's one stage: its paths carry no stage name


def make_event(method: str, target: str, headers: dict | None = None, body: str | bytes | None = None,
               source_ip: str = "127.0.0.1", client_cert: dict | None = None) -> dict:
    """An HTTP API proxy event (payload format 1.0) for ``method target`` (target = path?query);
    ``client_cert``: the certificate mutual TLS verified (``localdev.tls.client_cert``), if the
    client sent one."""
    url = urlsplit(target)
    path = url.path or "/"  # passed still percent-encoded
    # Decoded as API Gateway decodes query values, except that a byte that is no UTF-8 becomes a
    # lone surrogate (surrogateescape) rather than U+FFFD, for the handler to refuse it.
    multi_query = parse_qs(url.query, keep_blank_values=True, errors="surrogateescape") or None
    header_lists: dict[str, list[str]] = {}
    for name, value in (headers or {}).items():
        values = value if isinstance(value, list) else [value]
        header_lists.setdefault(name, []).extend(values)
    is_base64 = isinstance(body, bytes)
    if is_base64:
        body = base64.b64encode(body).decode()
    request_id = str(uuid.uuid4())
    return {
        "version": "1.0",
        "resource": path,
        "path": path,
        "httpMethod": method.upper(),
        "headers": {name: values[-1] for name, values in header_lists.items()} or None,
        "multiValueHeaders": header_lists or None,
        "queryStringParameters": {k: v[-1] for k, v in multi_query.items()} if multi_query else None,
        "multiValueQueryStringParameters": multi_query,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": path,
            "httpMethod": method.upper(),
            "path": path,
            "stage": STAGE,
            "requestId": request_id,
            "requestTimeEpoch": int(time.time() * 1000),
            "identity": {"sourceIp": source_ip, **({"clientCert": client_cert} if client_cert else {})},
            "accountId": "000000000000",
            "apiId": "local",
        },
        "body": body,
        "isBase64Encoded": is_base64,
    }


class LambdaContext:
    """The attributes Powertools reads from a real Lambda context."""

    function_name = "device-state-api"
    function_version = "$LATEST"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:000000000000:function:device-state-api"
    log_group_name = "/aws/lambda/device-state-api"
    log_stream_name = "local"

    def __init__(self, timeout_seconds: float = 15.0):
        self.aws_request_id = str(uuid.uuid4())
        self._deadline = time.monotonic() + timeout_seconds

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))
