"""API Gateway REST proxy events and a Lambda context, as Lambda would hand them to
the handler: shared by the dev server, `make invoke` and the tests."""

from __future__ import annotations

import base64
import time
import uuid
from urllib.parse import parse_qs, urlsplit

STAGE = "local"
METHOD_ARN_PREFIX = f"arn:aws:execute-api:us-east-1:000000000000:local/{STAGE}"


def make_event(method: str, target: str, headers: dict | None = None, body: str | bytes | None = None,
               source_ip: str = "127.0.0.1", client_cert: dict | None = None) -> dict:
    """A REST API (v1) proxy event for ``method target`` (target = path?query); ``client_cert``:
    the certificate mutual TLS verified (``localdev.tls.client_cert``), if the client sent one."""
    url = urlsplit(target)
    path = url.path or "/"  # REST APIs pass the path still percent-encoded
    multi_query = parse_qs(url.query, keep_blank_values=True) or None
    header_lists: dict[str, list[str]] = {}
    for name, value in (headers or {}).items():
        values = value if isinstance(value, list) else [value]
        header_lists.setdefault(name, []).extend(values)
    is_base64 = isinstance(body, bytes)
    if is_base64:
        body = base64.b64encode(body).decode()
    request_id = str(uuid.uuid4())
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method.upper(),
        "headers": {name: values[-1] for name, values in header_lists.items()} or None,
        "multiValueHeaders": header_lists or None,
        "queryStringParameters": {k: v[-1] for k, v in multi_query.items()} if multi_query else None,
        "multiValueQueryStringParameters": multi_query,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "resourcePath": "/{proxy+}",
            "httpMethod": method.upper(),
            "path": path,  # behind API Gateway this starts with the stage; locally there is none
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


def authorizer_step(event: dict) -> tuple[int, dict, dict] | None:
    """What API Gateway does before the handler on every route but the public ones: run the
    Lambda authorizer (``functions.auth.authorizer``) on the request and either refuse it
    (its UNAUTHORIZED or ACCESS_DENIED response, returned as (status, headers, body)) or
    pass its principal to the handler in ``requestContext.authorizer``. A path that is no
    route goes to the handler unchecked (it answers 404)."""
    from urllib.parse import unquote

    from functions.auth import authorizer
    from functions.auth.credentials import Unauthenticated, authenticate_event
    from functions.auth.rights import PUBLIC, rules_for_path

    rules = rules_for_path(event["path"])
    if not rules or any(rights == PUBLIC for _, rights in rules):
        return None
    # The resource path as routing sees it: a trailing slash is absent (as in common.allowed_methods).
    method_arn = f"{METHOD_ARN_PREFIX}/{event['httpMethod']}{unquote(event['path']).rstrip('/') or '/'}"
    try:
        decision = authorizer.decide({**event, "type": "REQUEST", "methodArn": method_arn})
    except authorizer.Unauthorized:
        status, headers, body = authorizer.gateway_problem("UNAUTHORIZED")
        try:  # the same answer, with the handler's detail (API Gateway's own is a fixed text)
            authenticate_event(event)
        except Unauthenticated as error:
            body["detail"] = str(error)
            headers["WWW-Authenticate"] = 'Bearer error="invalid_token"' if error.token_given else "Bearer"
        return status, headers, body
    registered = any(method == event["httpMethod"] for (method, _), _ in rules)
    if registered and not authorizer.allows(decision, method_arn):  # (others: the handler answers 405)
        return authorizer.gateway_problem("ACCESS_DENIED", event["httpMethod"], event["requestContext"]["path"])
    event["requestContext"]["authorizer"] = {"principalId": decision["principalId"], **decision["context"]}
    return None
