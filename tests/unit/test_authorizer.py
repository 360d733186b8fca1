"""The Lambda authorizer of the WebSocket API's $connect (functions.auth.authorizer.lambda_handler)
over REQUEST events as API Gateway sends them: a caller with good credentials may connect
(exactly that ARN) and its principal goes to the push function; a bad credential is
"Unauthorized" (API Gateway's 401)."""

from __future__ import annotations

import datetime

import pytest

from functions.auth import authorizer
from functions.auth.principals import READ_SCOPE, REPORT_SCOPE, SCOPES, WRITE_SCOPE, Principal
from localdev.issuer import Issuer
from tests.auth import ISSUER, bearer

API = "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/prod"
CONNECT_ARN = f"{API}/$connect"
DEVICE = "lamp-1"


def request_event(method: str, path: str, headers: dict | None = None, certificate_pem: str | None = None) -> dict:
    """A REQUEST authorizer event as API Gateway sends it (abridged to what API Gateway always
    fills in); its methodArn the WebSocket API's $connect."""
    identity = {"sourceIp": "203.0.113.7", "userAgent": "curl/8.5.0"}
    if certificate_pem:
        identity["clientCert"] = {"clientCertPem": certificate_pem, "subjectDN": f"CN={DEVICE}",
                                  "issuerDN": "CN=devices-ca", "serialNumber": "1",
                                  "validity": {"notBefore": "Jan 1 00:00:00 2026 GMT",
                                               "notAfter": "Jan 1 00:00:00 2036 GMT"}}
    headers = {"Host": "a1b2c3d4e5.execute-api.eu-west-1.amazonaws.com", "Accept": "application/json",
               **(headers or {})}
    return {
        "type": "REQUEST",
        "methodArn": CONNECT_ARN,
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {name: [value] for name, value in headers.items()},
        "queryStringParameters": None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {"accountId": "123456789012", "apiId": "a1b2c3d4e5", "stage": "prod",
                           "httpMethod": method, "path": f"/prod{path}", "requestId": "c6af9ac6-7b61",
                           "identity": identity},
    }


def device_certificate(device_id: str) -> str:
    """A device certificate naming ``urn:device:<id>`` (mutual TLS verified it upstream)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device_id)])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now)
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName(
                       [x509.UniformResourceIdentifier(f"urn:device:{device_id}")]), critical=False)
                   .sign(key, hashes.SHA256()))
    return certificate.public_bytes(serialization.Encoding.PEM).decode()


# (principal, the REQUEST event that authenticates as it)
CALLERS = {
    "read": (Principal.client("local-developer", {READ_SCOPE}), bearer([READ_SCOPE])),
    "write": (Principal.client("local-developer", {WRITE_SCOPE}), bearer([WRITE_SCOPE])),
    "report": (Principal.client("local-developer", {REPORT_SCOPE}), bearer([REPORT_SCOPE])),
    "all scopes": (Principal.client("local-developer", SCOPES), bearer(SCOPES)),
    "no scope": (Principal.client("local-developer", ()), bearer([])),
    "device token": (Principal.device(DEVICE), bearer(device=DEVICE)),
}


def decide(caller: str) -> dict:
    if caller == "device certificate":
        event = request_event("GET", f"/devices/{DEVICE}", certificate_pem=device_certificate(DEVICE))
    else:
        event = request_event("GET", f"/devices/{DEVICE}", CALLERS[caller][1])
    return authorizer.lambda_handler(event, None)


def resources(decision: dict) -> list[str]:
    [statement] = decision["policyDocument"]["Statement"]
    assert statement["Effect"] == "Allow" and statement["Action"] == "execute-api:Invoke"
    return statement["Resource"]


@pytest.mark.parametrize("caller", [*CALLERS, "device certificate"])
def test_a_caller_with_good_credentials_may_connect_and_its_principal_goes_along(caller):
    decision = decide(caller)
    principal = Principal.device(DEVICE) if caller == "device certificate" else CALLERS[caller][0]
    assert resources(decision) == [CONNECT_ARN]  # exactly the connect, nothing wider
    assert decision["principalId"] == principal.subject
    given = Principal.from_context(decision["context"])
    assert (given.kind, given.subject, given.scopes, given.device_id) == (
        principal.kind, principal.subject, principal.scopes, principal.device_id)


@pytest.mark.parametrize("headers", [
    {},
    {"Authorization": "Bearer not-a-jwt"},
    {"Authorization": "Basic dXNlcjpwYXNz"},
    {"Authorization": "Bearer"},
    bearer(lifetime=-3600),
    {"Authorization": "Bearer " + Issuer.generate().token()},  # signed by a key the API does not trust
    {"Authorization": "Bearer " + ISSUER.token(iss="https://issuer.example")},
    {"Authorization": "Bearer " + ISSUER.token(aud="another-api")},
], ids=["none", "garbage", "basic", "empty", "expired", "unknown key", "other issuer", "other audience"])
def test_a_bad_or_missing_credential_is_unauthorized(headers):
    with pytest.raises(authorizer.Unauthorized) as raised:
        authorizer.lambda_handler(request_event("GET", f"/devices/{DEVICE}", headers), None)
    assert str(raised.value) == "Unauthorized"  # exactly: API Gateway answers 401 for this message


def test_a_certificate_and_a_token_together_are_let_through_once_for_the_handlers_400():
    event = request_event("GET", f"/devices/{DEVICE}", bearer(), certificate_pem=device_certificate(DEVICE))
    decision = authorizer.lambda_handler(event, None)
    assert decision["context"]["principalKind"] == authorizer.MIXED
    assert resources(decision) == [event["methodArn"]]


def with_subprotocols(event: dict, *offered: str) -> dict:
    """The event of a connect that offered ``offered`` (as one header, the way browsers send it)."""
    event = {**event, "requestContext": {**event["requestContext"], "routeKey": "$connect", "eventType": "CONNECT"}}
    header = ", ".join(offered)
    event["headers"] = {**event["headers"], "Sec-WebSocket-Protocol": header}
    event["multiValueHeaders"] = {**event["multiValueHeaders"], "Sec-WebSocket-Protocol": [header]}
    return event


def test_a_browser_token_offered_as_a_subprotocol_connects_as_its_caller():
    event = with_subprotocols(request_event("GET", "/"), "device-state", "bearer." + ISSUER.token(device=DEVICE))
    decision = authorizer.lambda_handler(event, None)
    assert decision["principalId"] == Principal.device(DEVICE).subject and resources(decision) == [CONNECT_ARN]


@pytest.mark.parametrize("offered", [
    ("device-state",),
    ("device-state", "bearer."),
    ("device-state", "bearer.not-a-jwt"),
    ("device-state", "bearer." + Issuer.generate().token()),
    ("device-state", "bearer." + ISSUER.token(), "bearer." + ISSUER.token(device=DEVICE)),
    ("device-state", "Bearer." + ISSUER.token()),  # the prefix is exact, as the service writes it
], ids=["none", "empty", "garbage", "unknown key", "two tokens", "other case"])
def test_a_bad_missing_or_second_subprotocol_token_is_unauthorized(offered):
    with pytest.raises(authorizer.Unauthorized):
        authorizer.lambda_handler(with_subprotocols(request_event("GET", "/"), *offered), None)


def test_a_subprotocol_token_beside_a_query_token_is_two_tokens_and_unauthorized():
    event = with_subprotocols(request_event("GET", "/"), "device-state", "bearer." + ISSUER.token())
    event["queryStringParameters"] = {"token": ISSUER.token()}
    event["multiValueQueryStringParameters"] = {"token": [event["queryStringParameters"]["token"]]}
    with pytest.raises(authorizer.Unauthorized):
        authorizer.lambda_handler(event, None)
    del event["headers"]["Sec-WebSocket-Protocol"], event["multiValueHeaders"]["Sec-WebSocket-Protocol"]
    assert authorizer.lambda_handler(event, None)["principalId"] == Principal.client("local-developer", ()).subject  # the control: one token


def test_a_subprotocol_token_counts_only_on_a_websocket_connect():
    event = with_subprotocols(request_event("GET", "/"), "device-state", "bearer." + ISSUER.token())
    event["requestContext"] = {key: value for key, value in event["requestContext"].items()
                               if key not in ("routeKey", "eventType")}
    with pytest.raises(authorizer.Unauthorized):  # an HTTP request's Sec-WebSocket-Protocol is no credential
        authorizer.lambda_handler(event, None)
