"""The API Gateway Lambda authorizer (REQUEST type): the same verification the handler
uses, run before the function. Its policy lists every route the principal may call (a
device's only with its own id), never a wildcard over methods, because API Gateway caches
the result by token and applies it to the token's later requests on other routes; it
denies the routes an allowed ``*`` would reach beyond them. The handler's ``authorize()``
stays the authoritative check (bodies, transactions).

The dev server runs ``decide()`` before the handler as API Gateway runs this function,
and fills the same event fields (``requestContext.authorizer``)."""

from __future__ import annotations

import fnmatch
import re
import time

from functions.problem_details import MEDIA_TYPE, problem

from .credentials import LEEWAY_SECONDS, MixedCredentials, Unauthenticated, authenticate_event, is_websocket_connect
from .principals import Principal
from .rights import ROUTE_RIGHTS, PUBLIC, may_call

# What API Gateway itself answers when the authorizer refuses (its gateway responses
# UNAUTHORIZED and ACCESS_DENIED), in the handler's problem+json form. The stack installs
# these; the dev server answers the same.
GATEWAY_RESPONSES = {
    "UNAUTHORIZED": (401, "unauthorized", "Unauthorized",
                     "this route needs a valid 'Authorization: Bearer <token>' or a device certificate",
                     {"WWW-Authenticate": "Bearer"}),
    # API Gateway fills in the $context variables (the authorizer's policy, cached per token,
    # cannot name the route it is asked about; the gateway can).
    "ACCESS_DENIED": (403, "forbidden", "Forbidden", "$context.httpMethod $context.path is not allowed for this caller",
                      {}),
}
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
MIXED = "mixed"  # context principalKind of a request carrying a certificate and a token (answered 400)


class Unauthorized(Exception):
    """Raised with exactly this message, API Gateway answers 401 (its UNAUTHORIZED response)."""

    def __init__(self):
        super().__init__("Unauthorized")


def gateway_problem(response_type: str, method: str = "", path: str = "") -> tuple[int, dict, dict]:
    """(status, headers, body) of a gateway response, as the stack declares it; with a method
    and path, its $context variables filled in as API Gateway does."""
    status, slug, title, detail, headers = GATEWAY_RESPONSES[response_type]
    if method:
        detail = detail.replace("$context.httpMethod", method).replace("$context.path", path)
    return status, {"Content-Type": MEDIA_TYPE, **headers}, problem(status, slug, title, detail)


def _arn_path(rule: str, device_id: str) -> str:
    return re.sub(r"<(\w+)>", lambda name: device_id if name.group(1) == "device_id" else "*", rule)


def policy_resources(principal: Principal, method_arn: str) -> list[str]:
    """The execute-api ARNs of every route the principal may call, in this API and stage.
    On a path it may call, the methods no route has are listed too: the handler answers
    them 405 with Allow (API Gateway would answer 403)."""
    api_and_stage = "/".join(method_arn.split("/", 2)[:2])  # arn:...:apiId/stage
    device = principal.device_id or "*"
    callable_rules = {rule for (method, rule), rights in ROUTE_RIGHTS.items()
                      if rights != PUBLIC and may_call(principal, method, rule)}
    registered = set(ROUTE_RIGHTS)
    return sorted({f"{api_and_stage}/{method}{_arn_path(rule, device)}"
                   for rule in callable_rules for method in METHODS
                   if (method, rule) not in registered or may_call(principal, method, rule)})


def denied_resources(principal: Principal, method_arn: str, allowed: list[str]) -> list[str]:
    """The execute-api ARNs of the routes the principal may not call that an allowed ARN
    would still let through: API Gateway's ``*`` spans ``/``, so a writer's
    ``PATCH/devices/*`` also matches ``PATCH/devices/lamp-1/reported``, a reporter's route.
    The policy denies these, and a Deny wins over any Allow."""
    api_and_stage = "/".join(method_arn.split("/", 2)[:2])
    device = principal.device_id or "*"
    refused = {f"{api_and_stage}/{method}{_arn_path(rule, device)}" for (method, rule), rights in ROUTE_RIGHTS.items()
               if rights != PUBLIC and not may_call(principal, method, rule)}
    return sorted(arn for arn in refused if any(fnmatch.fnmatchcase(arn, resource) for resource in allowed))


def decide(event: dict) -> dict:
    """The authorizer's answer for a REQUEST authorizer event; raises Unauthorized."""
    try:
        principal = authenticate_event(event)
    except Unauthenticated:
        raise Unauthorized() from None
    except MixedCredentials:
        # Answered 400 by the handler; allowed for this one request only (caching is off
        # whenever certificates can arrive, see infra/api.py).
        return {"principalId": MIXED, "context": {"principalKind": MIXED},
                "policyDocument": _policy([event["methodArn"]])}
    if is_websocket_connect(event):  # the WebSocket API: each subscription is authorized apart
        return {"principalId": principal.subject, "context": principal.as_context(),
                "policyDocument": _policy([event["methodArn"]])}
    allowed = policy_resources(principal, event["methodArn"])
    return {"principalId": principal.subject, "context": principal.as_context(),
            "policyDocument": _policy(allowed, denied_resources(principal, event["methodArn"], allowed))}


def _policy(allowed: list[str], denied: list[str] = ()) -> dict:
    statements = [{"Action": "execute-api:Invoke", "Effect": "Allow", "Resource": allowed}]
    if denied:
        statements.append({"Action": "execute-api:Invoke", "Effect": "Deny", "Resource": list(denied)})
    return {"Version": "2012-10-17", "Statement": statements}


def allows(decision: dict, method_arn: str) -> bool:
    """Whether the decision's policy allows this call, matched as API Gateway matches ARNs
    (``*`` any run of characters, ``/`` included; a Deny wins)."""
    def matched(effect: str) -> bool:
        return any(fnmatch.fnmatchcase(method_arn, resource)
                   for statement in decision["policyDocument"]["Statement"] if statement["Effect"] == effect
                   for resource in statement["Resource"])

    return matched("Allow") and not matched("Deny")


def principal_of(event: dict) -> Principal:
    """The principal of an API Gateway event (REST or WebSocket): the one the authorizer put
    in ``requestContext.authorizer``, or, with none there (no authorizer ran: tests, ``make
    invoke``), the request's own credentials verified with the same code and recorded there.
    Unauthenticated (401) or MixedCredentials (400) otherwise."""
    context = event.setdefault("requestContext", {})
    given = context.get("authorizer") or {}
    if given.get("principalKind") == MIXED:
        raise MixedCredentials("send a client certificate or a bearer token, not both")
    principal = Principal.from_context(given)
    if principal is None:
        principal = authenticate_event(event)
        context["authorizer"] = {"principalId": principal.subject, **principal.as_context()}
    if principal.expired(time.time(), LEEWAY_SECONDS):  # a cached authorizer answer outlives its token
        raise Unauthenticated("the token has expired", token_given=True)
    return principal


def lambda_handler(event, _context):
    return decide(event)
