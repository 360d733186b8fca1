"""Token and certificate verification and the one authorize(): pure, with real signed tokens
and certificates minted here."""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import time

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from functions.auth import rights
from functions.auth.credentials import (AuthConfig, AuthConfigError, MixedCredentials, Unauthenticated,
                                        authenticate, certificate_principal, verify_token)
from functions.auth.principals import CLIENT, DEVICE, Principal
from localdev.issuer import Issuer
from tests.auth import ISSUER

CONFIG = AuthConfig.from_environment(ISSUER.environment())


def _now() -> int:
    return int(time.time())


def _unsigned(header: dict, claims: dict) -> str:
    return f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}."


def _claims(**changes) -> dict:
    now = int(time.time())
    claims = {"iss": ISSUER.issuer, "aud": ISSUER.audience, "sub": "svc", "iat": now, "exp": now + 600,
              "scope": "devices.read"}
    claims.update(changes)
    return {key: value for key, value in claims.items() if value is not None}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hs256_with_public_key() -> str:
    """The classic confusion attack: an HMAC over the token keyed with the issuer's public key."""
    signing_input = f"{_b64(json.dumps({'alg': 'HS256', 'kid': ISSUER.kid}).encode())}.{_b64(json.dumps(_claims()).encode())}"
    signature = hmac.new(_public_pem(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


def _public_pem() -> bytes:
    return ISSUER.private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                        serialization.PublicFormat.SubjectPublicKeyInfo)


BAD_TOKENS = {
    "expired": lambda: ISSUER.token(exp=_now() - 120, iat=_now() - 3600, nbf=_now() - 3600),
    "not yet valid": lambda: ISSUER.token(nbf=_now() + 600, iat=_now()),
    "issued in the future": lambda: ISSUER.token(iat=_now() + 600, nbf=None),
    "wrong issuer": lambda: ISSUER.token(iss="https://evil.example"),
    "wrong audience": lambda: ISSUER.token(aud="someone-else"),
    "no exp": lambda: ISSUER.token(exp=None),
    "alg none": lambda: _unsigned({"alg": "none", "typ": "JWT", "kid": ISSUER.kid}, _claims()),
    "HS256 signed with the public key": lambda: _hs256_with_public_key(),
    "unknown kid": lambda: ISSUER.token(headers={"kid": "not-a-key-of-the-issuer"}),
    "garbage": lambda: "not.a.token",
    "another issuer's key, same kid and claims": lambda: Issuer(Issuer.generate().private_key, ISSUER.kid).token(),
    "a bad device id": lambda: ISSUER.token(device="no spaces allowed"),
    "tampered claims": lambda: _tampered(),
}


def _tampered() -> str:
    header, _, signature = ISSUER.token(["devices.read"]).split(".")
    forged = _b64(json.dumps(_claims(scope="devices.write")).encode())
    return f"{header}.{forged}.{signature}"


@pytest.mark.parametrize("kind", sorted(BAD_TOKENS))
def test_every_bad_token_is_unauthenticated(kind):
    with pytest.raises(Unauthenticated) as refused:
        verify_token(BAD_TOKENS[kind](), CONFIG)
    assert refused.value.token_given


def test_the_hs256_forgery_would_pass_a_verifier_that_took_the_algorithm_from_the_token():
    """The control: the forged token's HMAC is valid under the public key, so a verifier
    keyed by the token's own alg header would accept it."""
    signing_input, _, signature = BAD_TOKENS["HS256 signed with the public key"]().rpartition(".")
    expected = hmac.new(_public_pem(), signing_input.encode(), hashlib.sha256).digest()
    assert hmac.compare_digest(_b64(expected), signature)


def test_tokens_within_the_leeway_are_accepted():
    now = int(time.time())
    assert verify_token(ISSUER.token(exp=now - 30), CONFIG).kind == CLIENT
    assert verify_token(ISSUER.token(nbf=now + 30, iat=now + 30), CONFIG).kind == CLIENT


def test_claims_make_the_principal():
    backend = verify_token(ISSUER.token(["devices.read", "device-state/devices.report", "admin"]), CONFIG)
    assert (backend.kind, backend.scopes) == (CLIENT, frozenset({"devices.read", "devices.report"}))
    device = verify_token(ISSUER.token(["devices.write"], device="lamp-1"), CONFIG)
    assert (device.kind, device.device_id, device.scopes) == (DEVICE, "lamp-1", frozenset())  # scope ignored


def test_a_cognito_access_token_names_its_client_instead_of_an_audience():
    token = ISSUER.token(aud=None, token_use="access", client_id=ISSUER.audience, scope="device-state/devices.read")
    assert verify_token(token, CONFIG).scopes == {"devices.read"}
    other = ISSUER.token(aud=None, token_use="access", client_id="another-client")
    with pytest.raises(Unauthenticated):
        verify_token(other, CONFIG)


def test_rsa_keys_verify_rs256_and_a_key_type_never_takes_another_algorithm():
    rsa_issuer = Issuer.generate("RSA")
    config = AuthConfig.from_environment(rsa_issuer.environment())
    assert verify_token(rsa_issuer.token(), config).kind == CLIENT
    with pytest.raises(Unauthenticated):  # an ES256 token under the RSA key's kid
        verify_token(Issuer(Issuer.generate().private_key, rsa_issuer.kid).token(), config)


def test_configuration_is_checked():
    with pytest.raises(AuthConfigError):
        AuthConfig.from_environment({})
    with pytest.raises(AuthConfigError):
        AuthConfig.from_environment({**ISSUER.environment(), "AUTH_JWKS": '{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}'})
    with pytest.raises(AuthConfigError):
        AuthConfig.from_environment({**ISSUER.environment(), "AUTH_JWKS": "/no/such/file.json"})


def _certificate(subject_cn: str | None, uri: str | list[str] | None, days: float = 1) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)] if subject_cn else [])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=2))
               .not_valid_after(now + datetime.timedelta(days=days)))
    if uri:
        uris = [uri] if isinstance(uri, str) else uri
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(each) for each in uris]), False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def test_a_certificate_names_its_device_by_san_uri_then_cn():
    assert certificate_principal(_certificate("ignored-cn", "urn:device:lamp-9")).device_id == "lamp-9"
    assert certificate_principal(_certificate("lamp-3", None)).device_id == "lamp-3"
    assert certificate_principal(_certificate("lamp-4", "https://example.com/x")).device_id == "lamp-4"
    with pytest.raises(Unauthenticated):
        certificate_principal(_certificate(None, None))
    with pytest.raises(Unauthenticated):
        certificate_principal(_certificate("has spaces", None))


def test_a_certificate_names_one_device_whatever_the_case_of_its_urns_scheme():
    """From the mTLS probe: a CN fell back past `URN:DEVICE:a`, and the first of two URIs won."""
    assert certificate_principal(_certificate("lamp-b", "URN:Device:lamp-a")).device_id == "lamp-a"
    with pytest.raises(Unauthenticated, match="more than one device"):
        certificate_principal(_certificate("lamp-a", ["urn:device:lamp-b", "urn:device:lamp-a"]))


def test_a_certificate_past_its_end_opens_nothing_and_its_tokens_end_with_it():
    """TLS checks the dates at the handshake; a resumed TLS session (a ticket) brings an expired
    certificate back unchecked (the mTLS probe)."""
    with pytest.raises(Unauthenticated, match="not valid now"):
        certificate_principal(_certificate("lamp-1", None, days=-1))
    valid = certificate_principal(_certificate("lamp-1", None, days=0.5))
    assert 0 < valid.credential_expires_at - time.time() <= 12 * 3600


def test_credentials_are_one_kind_or_none():
    certificate = _certificate("lamp-1", None)
    with pytest.raises(MixedCredentials):
        authenticate(f"Bearer {ISSUER.token()}", certificate, CONFIG)
    with pytest.raises(Unauthenticated) as missing:
        authenticate(None, None, CONFIG)
    assert not missing.value.token_given
    for header in ("Basic dXNlcjpwYXNz", "Bearer", "Bearer  ", ISSUER.token()):
        with pytest.raises(Unauthenticated):
            authenticate(header, None, CONFIG)


READER, WRITER, REPORTER = (Principal.client("x", [scope]) for scope in ("devices.read", "devices.write",
                                                                         "devices.report"))
LAMP = Principal.device("lamp-1")
NOBODY = Principal.client("x", [])
WRITER_REPORTER = Principal.client("x", ["devices.write", "devices.report"])

# (principal, action, resource) -> allowed: the table of docs/api/auth.md.
RIGHTS_TABLE = [
    (READER, rights.READ, "device:lamp-2", True), (READER, rights.LIST, "devices", True),
    (READER, rights.READ, "device:lamp-2/changes", True), (READER, rights.READ, "device:lamp-2/leases", True),
    (READER, rights.WRITE, "device:lamp-2/state", False), (READER, rights.WRITE, "device:lamp-2/leases", False),
    (WRITER, rights.CREATE, "devices", True), (WRITER, rights.REPLACE, "device:lamp-2", True),
    (WRITER, rights.DELETE, "device:lamp-2", True), (WRITER, rights.WRITE, "device:lamp-2/state", True),
    (WRITER, rights.WRITE, "device:lamp-2/desired", True), (WRITER, rights.WRITE, "device:lamp-2/leases", True),
    (WRITER, rights.WRITE, "device:lamp-2/reported", False), (WRITER, rights.READ, "device:lamp-2", False),
    (REPORTER, rights.WRITE, "device:lamp-2/reported", True), (REPORTER, rights.WRITE, "device:lamp-2/desired", False),
    (REPORTER, rights.READ, "device:lamp-2", False),
    (LAMP, rights.READ, "device:lamp-1", True), (LAMP, rights.READ, "device:lamp-1/changes", True),
    (LAMP, rights.READ, "device:lamp-1/leases", True), (LAMP, rights.WRITE, "device:lamp-1/leases", True),
    (LAMP, rights.WRITE, "device:lamp-1/reported", True), (LAMP, rights.WRITE, "device:lamp-1/desired", False),
    (LAMP, rights.WRITE, "device:lamp-1/state", False), (LAMP, rights.DELETE, "device:lamp-1", False),
    (LAMP, rights.REPLACE, "device:lamp-1", False), (LAMP, rights.LIST, "devices", False),
    (LAMP, rights.CREATE, "devices", False), (LAMP, rights.READ, "device:lamp-10", False),
    (LAMP, rights.READ, "device:lamp-2", False), (LAMP, rights.WRITE, "device:lamp-2/reported", False),
    (NOBODY, rights.READ, "device:lamp-1", False), (NOBODY, rights.LIST, "devices", False),
    # A device token: the device's own, which no scope grants.
    (LAMP, rights.ISSUE, "device:lamp-1/token", True), (LAMP, rights.ISSUE, "device:lamp-2/token", False),
    (READER, rights.ISSUE, "device:lamp-1/token", False), (WRITER, rights.ISSUE, "device:lamp-1/token", False),
    (REPORTER, rights.ISSUE, "device:lamp-1/token", False), (WRITER_REPORTER, rights.ISSUE, "device:lamp-1/token", False),
]


@pytest.mark.parametrize("principal, action, resource, expected", RIGHTS_TABLE)
def test_authorize_follows_the_table(principal, action, resource, expected):
    assert rights.allowed(principal, action, resource) is expected
    if expected:
        rights.authorize(principal, action, resource)
    else:
        with pytest.raises(rights.Forbidden, match=resource):
            rights.authorize(principal, action, resource)


def test_unknown_resources_are_errors_not_grants():
    for resource in ("device:", "device:lamp-1/secrets", "fleet", ""):
        with pytest.raises(ValueError):
            rights.allowed(WRITER, rights.WRITE, resource)


def test_the_principal_survives_the_authorizer_context():
    for principal in (READER, LAMP, Principal.client("svc", ["devices.write", "devices.read"], expires_at=_now()),
                      Principal.device("lamp-1", expires_at=_now(), auth_time=_now() - 60)):
        assert Principal.from_context(principal.as_context()) == principal
    assert Principal.from_context({}) is None
    assert Principal.from_context({"principalKind": "device", "deviceId": ""}) is None


@pytest.mark.parametrize("claims", [
    {"aud": [["device-state"]]}, {"aud": {"x": 1}}, {"aud": None, "token_use": "access", "client_id": ["device-state"]},
    {"exp": "9999999999"}, {"nbf": "0"}, {"iat": True},
])
def test_odd_claim_types_are_unauthenticated_not_faults(claims):
    with pytest.raises(Unauthenticated):
        verify_token(ISSUER.token(**claims), CONFIG)


def test_two_authorization_headers_are_refused_whatever_their_order_or_case():
    from functions.auth.credentials import authenticate_event

    good, other = f"Bearer {ISSUER.token()}", f"Bearer {ISSUER.token(device='lamp-2')}"
    for headers in ({"Authorization": [good, other]}, {"Authorization": [good], "authorization": [other]}):
        with pytest.raises(Unauthenticated, match="one Authorization"):
            authenticate_event({"multiValueHeaders": headers, "headers": {k: v[-1] for k, v in headers.items()}},
                               CONFIG)
    assert authenticate_event({"multiValueHeaders": {"Authorization": [good]}}, CONFIG).kind == CLIENT


def test_a_query_token_counts_only_on_a_websocket_connect():
    from functions.auth.credentials import authenticate_event

    query = {"queryStringParameters": {"token": ISSUER.token()}}
    with pytest.raises(Unauthenticated):  # a REST request, even one whose path ends in /$connect
        authenticate_event({**query, "methodArn": "arn:aws:execute-api:r:1:api/prod/GET/devices/x/versions/$connect",
                            "requestContext": {"path": "/devices/x/versions/$connect"}}, CONFIG)
    connect = {**query, "requestContext": {"routeKey": "$connect", "eventType": "CONNECT"}}
    assert authenticate_event(connect, CONFIG).kind == CLIENT


CALLERS = {"read": READER, "write": WRITER, "report": REPORTER, "write+report": WRITER_REPORTER,
           "self": LAMP, "nobody": NOBODY}
K = rights.WriteKind
# (kind, the sections the write names, the callers that may make it on lamp-1): every kind of write
# with every body shape, the table of docs/api/auth.md.
WRITE_SHAPES = [
    (K.CREATE, set(), {"write", "write+report"}),
    (K.CREATE, {"desired"}, {"write", "write+report"}),
    (K.CREATE, {"reported"}, {"write+report"}),
    (K.CREATE, {"desired", "reported"}, {"write+report"}),
    (K.PUT, set(), {"write", "write+report"}),
    (K.PUT, {"state"}, {"write", "write+report"}),
    (K.PUT, {"desired"}, {"write", "write+report"}),
    (K.PUT, {"reported"}, {"write+report"}),
    (K.PUT, {"desired", "reported"}, {"write+report"}),
    (K.REPLACE, set(), {"write", "write+report"}),
    (K.REPLACE, {"desired"}, {"write", "write+report"}),
    (K.REPLACE, {"reported"}, {"write+report"}),
    (K.REPLACE, {"desired", "reported"}, {"write+report"}),
    (K.UPDATE, {"state"}, {"write", "write+report"}),
    (K.UPDATE, {"desired"}, {"write", "write+report"}),
    (K.UPDATE, {"reported"}, {"report", "write+report", "self"}),
    (K.DELETE, set(), {"write", "write+report"}),
    (K.CHECK, set(), {"read", "self"}),
]


@pytest.mark.parametrize("caller", sorted(CALLERS))
@pytest.mark.parametrize("kind, sections, allowed", WRITE_SHAPES,
                         ids=lambda value: "+".join(sorted(value)) if isinstance(value, set) else str(value))
def test_a_write_needs_a_right_for_every_section_it_sets(kind, sections, allowed, caller):
    """Every scope (and a device on itself) against every kind of write and body shape. The
    row a device on another device would take is refused whatever it is (the RIGHTS_TABLE)."""
    needed = rights.needed_for_write(kind, "lamp-1", sections)
    assert (rights.first_refused(CALLERS[caller], needed) is None) is (caller in allowed)
    if caller not in allowed:
        with pytest.raises(rights.Forbidden) as refused:
            rights.authorize_all(CALLERS[caller], needed, index=2)
        assert (refused.value.action, refused.value.resource) == rights.first_refused(CALLERS[caller], needed)
        assert refused.value.index == 2
    assert rights.first_refused(Principal.device("lamp-2"), needed) is not None


def test_what_a_write_needs_is_its_kinds_right_then_one_per_section():
    assert rights.needed_for_write("put", "lamp-1", {"reported", "desired"}) == [
        ("replace", "device:lamp-1"), ("write", "device:lamp-1/state"), ("write", "device:lamp-1/desired"),
        ("write", "device:lamp-1/reported")]
    assert rights.needed_for_write("create", "lamp-1", {"reported"}) == [
        ("create", "devices"), ("write", "device:lamp-1/state"), ("write", "device:lamp-1/reported")]
    assert rights.needed_for_write("update", "lamp-1", {"reported"}) == [("write", "device:lamp-1/reported")]
    assert rights.needed_for_write("delete", "lamp-1") == [("delete", "device:lamp-1")]
    assert rights.needed_for_write("check", "lamp-1") == [("read", "device:lamp-1")]
    # a writer alone is refused on reported, not on what comes before it
    with pytest.raises(rights.Forbidden, match="write on device:lamp-1/reported"):
        rights.authorize_all(WRITER, rights.needed_for_write("put", "lamp-1", {"reported"}))


@pytest.mark.parametrize("kind, sections", [("update", set()), ("update", {"state", "desired"}),
                                            ("delete", {"state"}), ("check", {"reported"}), ("put", {"secrets"}),
                                            ("merge", {"state"})])
def test_a_write_that_cannot_be_is_an_error_not_a_grant(kind, sections):
    with pytest.raises(ValueError):
        rights.needed_for_write(kind, "lamp-1", sections)


def test_the_write_kinds_are_the_library_operations():
    from functions.device_state import transactions as tx

    assert set(rights.WriteKind) == {tx.CREATE, tx.PUT, tx.REPLACE, tx.UPDATE, tx.DELETE, tx.CHECK}


def test_each_write_routes_gate_is_the_first_right_its_write_needs():
    """A write route's own right (what is checked before the body is read) never grants more than
    the write needs, and the check of the body adds to it, never replaces it."""
    from functions.api.routes import ROUTES, Writes

    writes = [declaration for declaration in ROUTES if isinstance(declaration.writes, Writes)]
    assert len(writes) == 8
    for declaration in writes:
        kind, section = declaration.writes.kind, declaration.writes.section
        needed = rights.needed_for_write(kind, "{device_id}", {section} if section else ())
        assert declaration.right == needed[0], declaration.rule


def test_following_a_device_needs_what_reading_its_feed_needs():
    assert rights.needed_to_follow("lamp-1") == [("read", "device:lamp-1/changes")]
    from functions.api.routes import BY_OPERATION

    assert BY_OPERATION["listChanges"].right == rights.needed_to_follow("{device_id}")[0]
    assert rights.first_refused(LAMP, rights.needed_to_follow("lamp-1")) is None
    assert rights.first_refused(WRITER, rights.needed_to_follow("lamp-1")) == ("read", "device:lamp-1/changes")


def test_make_token_gives_the_admin_scope_only_when_named(tmp_path, capsys):
    """`make -s token` (localdev.issuer): read, write and report by default; devices.admin, which
    registers and revokes credentials, only as `SCOPES=devices.admin` asks for it."""
    from localdev import issuer

    def scopes_of(*arguments) -> set[str]:
        issuer.main(["token", "--directory", str(tmp_path), *arguments])
        return set(jwt.decode(capsys.readouterr().out.strip(), options={"verify_signature": False})["scope"].split())

    assert scopes_of() == {"devices.read", "devices.write", "devices.report"}
    assert scopes_of("--scopes", "devices.admin") == {"devices.admin"}
    admin = Principal.client("admin", {"devices.admin"})
    assert rights.allowed(admin, rights.MANAGE, rights.ENROLLMENTS)
    assert not rights.allowed(Principal.client("app", scopes_of()), rights.MANAGE, rights.ENROLLMENTS)
