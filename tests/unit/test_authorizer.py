"""The API Gateway Lambda authorizer (functions.auth.authorizer.lambda_handler) over REQUEST
events as API Gateway sends them: its policy lists exact route ARNs, a device's only with
its own id, and never lets a principal call a route ``may_call`` denies; a bad credential
is "Unauthorized" (API Gateway's 401)."""

from __future__ import annotations

import datetime
import re

import pytest

from functions.auth import authorizer
from functions.auth.principals import READ_SCOPE, REPORT_SCOPE, SCOPES, WRITE_SCOPE, Principal
from functions.auth.rights import PUBLIC, ROUTE_RIGHTS, may_call
from localdev.issuer import Issuer
from tests.auth import ISSUER, bearer

API = "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/prod"
DEVICE, OTHER_DEVICE = "lamp-1", "lamp-2"
# A value for each path parameter of ROUTE_RIGHTS' rules (other than the device's).
SAMPLE = {"lease_id": "0f6c2b1e-lease", "version": "7"}
METHOD_ARN = re.compile(re.escape(API) + r"/(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS)/\S*")


def request_event(method: str, path: str, headers: dict | None = None, certificate_pem: str | None = None) -> dict:
    """A REQUEST authorizer event as API Gateway sends it for a REST API (abridged to what
    API Gateway always fills in)."""
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
        "methodArn": f"{API}/{method}{path}",
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


def route_arn(method: str, rule: str, device_id: str) -> str:
    values = {"device_id": device_id, **SAMPLE}
    return f"{API}/{method}" + re.sub(r"<(\w+)>", lambda name: values[name.group(1)], rule)


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


def principal_of(caller: str) -> Principal:
    return Principal.device(DEVICE) if caller == "device certificate" else CALLERS[caller][0]


def resources(decision: dict, effect: str = "Allow") -> list[str]:
    statements = decision["policyDocument"]["Statement"]
    assert statements[0]["Effect"] == "Allow" and {s["Effect"] for s in statements} <= {"Allow", "Deny"}
    assert all(statement["Action"] == "execute-api:Invoke" for statement in statements)
    return [resource for statement in statements if statement["Effect"] == effect
            for resource in statement["Resource"]]


def test_a_back_end_that_may_read_gets_exact_route_arns():
    decision = decide("read")
    assert decision["principalId"] == "client:local-developer"
    assert decision["context"]["principalKind"] == "client" and decision["context"]["scopes"] == READ_SCOPE
    listed = resources(decision)
    assert listed
    for resource in listed + resources(decision, "Deny"):
        assert METHOD_ARN.fullmatch(resource), resource  # a method named, never * in its place
        assert not resource.endswith("/*/*") and f"{API}/*" not in resource, resource
    assert f"{API}/GET/devices" in listed and f"{API}/GET/devices/*/changes" in listed
    assert f"{API}/POST/devices" not in listed and f"{API}/PATCH/devices/*/desired" not in listed
    assert f"{API}/GET/openapi.json" not in listed  # public: no authorizer runs there


def test_a_route_an_allowed_wildcard_reaches_beyond_its_rights_is_denied():
    """API Gateway's ``*`` spans ``/``: a writer's ``PATCH/devices/*`` would reach a device's
    reported section, which only devices.report may write."""
    decision = decide("write")
    assert f"{API}/PATCH/devices/*" in resources(decision)
    assert {f"{API}/PATCH/devices/*/reported", f"{API}/PUT/devices/*/reported"} <= set(resources(decision, "Deny"))
    assert not authorizer.allows(decision, f"{API}/PATCH/devices/{DEVICE}/reported")
    assert authorizer.allows(decision, f"{API}/PATCH/devices/{DEVICE}/desired")


@pytest.mark.parametrize("caller", ["device token", "device certificate"])
def test_a_devices_policy_names_only_its_own_device(caller):
    decision = decide(caller)
    assert decision["principalId"] == f"device:{DEVICE}"
    assert decision["context"]["deviceId"] == DEVICE
    listed = resources(decision)
    assert any("/devices/" in resource for resource in listed)
    for resource in listed + resources(decision, "Deny"):
        assert METHOD_ARN.fullmatch(resource), resource
        if "/devices" in resource:
            assert resource.split("/")[3:5] == ["devices", DEVICE], resource  # apiId/stage/METHOD/devices/<id>


@pytest.mark.parametrize("caller", [*CALLERS, "device certificate"])
def test_the_policy_allows_exactly_the_routes_may_call_allows(caller):
    """Every route (method and rule of ROUTE_RIGHTS), on the caller's device and on another:
    the policy lets it through exactly when ``may_call`` does (a device: on its own only)."""
    principal = principal_of(caller)
    decision = decide(caller)
    for (method, rule), rights in ROUTE_RIGHTS.items():
        if rights == PUBLIC:
            continue
        for device_id in (DEVICE, OTHER_DEVICE):
            expected = may_call(principal, method, rule) and (
                principal.device_id in (None, device_id) or "<device_id>" not in rule)
            assert authorizer.allows(decision, route_arn(method, rule, device_id)) == expected, (method, rule,
                                                                                                 device_id)


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
