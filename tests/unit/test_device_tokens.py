"""Device tokens without a server: KMS's DER signature becomes a JOSE signature that
`cryptography` and the service's own verification accept; KMS's throttling answers 429 and its
failures 503, each with Retry-After (botocore's Stubber on a real KMS client); the settings are
checked whole; renewal is bounded by the certificate's auth_time."""

from __future__ import annotations

import json
import time

import boto3
import jwt
import pytest
from botocore.exceptions import ReadTimeoutError
from botocore.stub import Stubber
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from functions.api import tokens as token_routes
from functions.api import handler as handler_module
from functions.api.handler import lambda_handler
from functions.auth import device_tokens
from functions.auth.credentials import (AUTH_AUDIENCE, AUTH_ISSUER, AUTH_JWKS, DEVICE_TOKEN_AUDIENCE,
                                        DEVICE_TOKEN_ISSUER, DEVICE_TOKEN_JWKS, LEEWAY_SECONDS, AuthConfig,
                                        AuthConfigError, verify_token)
from functions.auth.device_tokens import RenewalRefused, TokenSettings, issue
from functions.auth.principals import Principal
from functions.config import api_config
from functions.device_state import DeviceStateManager
from functions.device_state.client import dynamodb_client
from functions.auth.signers import (KeyFileSigner, KmsSigner, SigningThrottled, SigningUnavailable, der_to_jose)
from localdev.apigw import LambdaContext, make_event
from localdev.issuer import Issuer
from localdev.tls import client_cert
from tests.auth import DEVICE_TOKEN_ENVIRONMENT, ISSUER, bearer

KEY_ARN = "arn:aws:kms:us-east-1:000000000000:key/0d6f2a9e-1111-2222-3333-444455556666"
KEY_ID = KEY_ARN.rsplit("/", 1)[-1]
SETTINGS = TokenSettings("urn:device-state:device-tokens", "device-state", kms_key=KEY_ARN)


class FakeKms:
    """KMS's Sign as KMS answers it (a DER ECDSA signature over SHA-256 of the message),
    with a real P-256 key."""

    def __init__(self):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.calls = []

    def sign(self, **request):
        self.calls.append(request)
        return {"KeyId": KEY_ARN, "SigningAlgorithm": "ECDSA_SHA_256",
                "Signature": self.key.sign(request["Message"], ec.ECDSA(hashes.SHA256()))}

    def jwks(self) -> dict:
        return {"keys": [{**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key())), "kid": KEY_ID,
                          "use": "sig", "alg": "ES256"}]}


def test_kms_der_signatures_become_jose_signatures_that_cryptography_verifies():
    key = ec.generate_private_key(ec.SECP256R1())
    for message in (b"a", b"header.payload" * 50):
        der = key.sign(message, ec.ECDSA(hashes.SHA256()))
        jose = der_to_jose(der)
        assert len(jose) == 64 and len(der) != 64  # DER is 70-72 bytes; JOSE fixed r || s
        r, s = int.from_bytes(jose[:32], "big"), int.from_bytes(jose[32:], "big")
        key.public_key().verify(encode_dss_signature(r, s), message, ec.ECDSA(hashes.SHA256()))
        with pytest.raises(InvalidSignature):  # the control: another message does not verify
            key.public_key().verify(encode_dss_signature(r, s), message + b"!", ec.ECDSA(hashes.SHA256()))


def test_a_token_signed_through_kms_is_a_device_principal_to_the_services_verification():
    kms = FakeKms()
    answer = issue(Principal.device("lamp-1", auth_time=int(time.time())), KmsSigner(KEY_ARN, kms), SETTINGS)
    assert kms.calls[0]["KeyId"] == KEY_ARN and kms.calls[0]["MessageType"] == "RAW"
    assert kms.calls[0]["SigningAlgorithm"] == "ECDSA_SHA_256"
    assert jwt.get_unverified_header(answer["token"]) == {"alg": "ES256", "typ": "JWT", "kid": KEY_ID}
    config = AuthConfig.from_environment({
        **ISSUER.environment(), DEVICE_TOKEN_ISSUER: SETTINGS.issuer, DEVICE_TOKEN_AUDIENCE: SETTINGS.audience,
        DEVICE_TOKEN_JWKS: json.dumps(kms.jwks())})
    principal = verify_token(answer["token"], config)
    assert principal.kind == "device" and principal.device_id == "lamp-1" and not principal.scopes
    forged = answer["token"][:-4] + ("AAAA" if not answer["token"].endswith("AAAA") else "BBBB")
    with pytest.raises(Exception, match="signature"):
        verify_token(forged, config)


def test_the_local_key_file_signer_signs_what_its_jwks_verifies(tmp_path):
    issuer = Issuer.generate()
    signer = KeyFileSigner.from_file(str(issuer.save_key(tmp_path / "key.pem")), issuer.kid)
    answer = issue(Principal.device("lamp-1", auth_time=int(time.time())), signer, SETTINGS)
    key = jwt.PyJWK.from_dict(issuer.jwks()["keys"][0]).key
    assert jwt.decode(answer["token"], key, algorithms=["ES256"], audience="device-state")["device_id"] == "lamp-1"
    rsa = Issuer.generate("RSA")
    with pytest.raises(ValueError, match="P-256"):
        KeyFileSigner.from_file(str(rsa.save_key(tmp_path / "rsa.pem")), rsa.kid)


def stubbed_kms(*errors) -> tuple:
    client = boto3.client("kms", region_name="us-east-1")
    stubber = Stubber(client)
    for code in errors:
        stubber.add_client_error("sign", service_error_code=code, http_status_code=400 if "Throttl" in code else 500)
    stubber.activate()
    return client, stubber


@pytest.fixture
def call_token_route(moto_table, monkeypatch):
    """``call(signer)``: lamp-1's own POST /devices/lamp-1/token through the handler, signed by
    ``signer``, on an in-process table where lamp-1 exists (a token is issued only then)."""
    client, name = moto_table
    monkeypatch.setenv("TABLE_NAME", name)
    monkeypatch.delenv("DYNAMODB_ENDPOINT", raising=False)
    caches = (handler_module._manager, api_config, dynamodb_client)
    for cache in caches:
        cache.cache_clear()
    DeviceStateManager(client, name).create("lamp-1", {})

    def call(signer) -> dict:
        monkeypatch.setattr(token_routes, "device_token_issuer", lambda: (SETTINGS, signer))
        event = make_event("POST", "/devices/lamp-1/token", bearer(device="lamp-1"))
        return lambda_handler(event, LambdaContext())

    yield call
    for cache in caches:
        cache.cache_clear()


def test_kms_throttling_is_a_429_with_retry_after(call_token_route):
    client, stubber = stubbed_kms("ThrottlingException")
    response = call_token_route(KmsSigner(KEY_ARN, client))
    stubber.assert_no_pending_responses()
    problem = json.loads(response["body"])
    assert response["statusCode"] == 429 and problem["type"].endswith("signing-throttled"), response
    retry_after = int(response["multiValueHeaders"]["Retry-After"][0]
                      if "multiValueHeaders" in response and "Retry-After" in response["multiValueHeaders"]
                      else response["headers"]["Retry-After"])
    assert 1 <= retry_after <= 10


@pytest.mark.parametrize("code", ["KMSInternalException", "DependencyTimeoutException", "KMSInvalidStateException",
                                  "DisabledException", "AccessDeniedException"])
def test_kms_failing_or_the_key_unusable_is_a_503_with_retry_after_never_a_500(call_token_route, code):
    client, _ = stubbed_kms(code)
    response = call_token_route(KmsSigner(KEY_ARN, client))
    headers = {**(response.get("headers") or {}),
               **{name: values[0] for name, values in (response.get("multiValueHeaders") or {}).items()}}
    assert response["statusCode"] == 503 and headers["Retry-After"].isdigit(), response
    assert json.loads(response["body"])["type"].endswith("signing-unavailable")


def test_a_kms_timeout_is_a_503(call_token_route):
    class Slow:
        def sign(self, **_):
            raise ReadTimeoutError(endpoint_url="https://kms.us-east-1.amazonaws.com")

    with pytest.raises(SigningUnavailable) as raised:
        KmsSigner(KEY_ARN, Slow()).sign(b"x")
    assert raised.value.retry_after >= 1
    assert call_token_route(KmsSigner(KEY_ARN, Slow()))["statusCode"] == 503


def test_a_signer_that_works_answers_200_and_no_store(call_token_route):
    response = call_token_route(KmsSigner(KEY_ARN, FakeKms()))
    headers = {**(response.get("headers") or {}),
               **{name: values[0] for name, values in (response.get("multiValueHeaders") or {}).items()}}
    assert response["statusCode"] == 200 and headers["Cache-Control"] == "no-store", response


def test_renewal_is_bounded_by_when_the_certificate_was_last_shown():
    signer, now = KmsSigner(KEY_ARN, FakeKms()), 1_800_000_000
    fresh = issue(Principal.device("lamp-1", auth_time=now), signer, SETTINGS, now=now)
    assert fresh["expiresIn"] == 3600 and fresh["expiresAt"] == "2027-01-15T09:00:00Z"
    late = now + SETTINGS.renewal_seconds - 100  # within the bound: a token that ends with it
    assert issue(Principal.device("lamp-1", auth_time=now), signer, SETTINGS, now=late)["expiresIn"] == 100
    for principal in (Principal.device("lamp-1", auth_time=now), Principal.device("lamp-1"),
                      Principal.client("svc", ["devices.read"])):
        with pytest.raises(RenewalRefused):
            issue(principal, signer, SETTINGS, now=now + SETTINGS.renewal_seconds)
    with pytest.raises(SigningThrottled):
        issue(Principal.device("lamp-1", auth_time=now), KmsSigner(KEY_ARN, stubbed_kms("ThrottlingException")[0]),
              SETTINGS, now=now)


def test_renewal_counts_from_no_later_than_now_and_refuses_a_future_certificate_time():
    """verify_token refuses a token whose auth_time is ahead of the clock by more than the
    leeway; a principal that comes from elsewhere (an authorizer's context) is held the same."""
    signer, now = KmsSigner(KEY_ARN, FakeKms()), 1_800_000_000
    with pytest.raises(RenewalRefused):
        issue(Principal.device("lamp-1", auth_time=now + LEEWAY_SECONDS + 1), signer, SETTINGS, now=now)
    ahead = issue(Principal.device("lamp-1", auth_time=now + LEEWAY_SECONDS), signer, SETTINGS, now=now)
    assert jwt.decode(ahead["token"], options={"verify_signature": False})["auth_time"] == now


BASE = {DEVICE_TOKEN_ISSUER: "urn:x", DEVICE_TOKEN_AUDIENCE: "device-state", device_tokens.DEVICE_TOKEN_KMS_KEY: KEY_ARN}


@pytest.mark.parametrize("changes, lifetime, renewal", [
    ({}, 3600, 86400),
    ({"DEVICE_TOKEN_SECONDS": "900"}, 900, 86400),
    ({"DEVICE_TOKEN_SECONDS": "7200", "DEVICE_TOKEN_MAX_SECONDS": "7200"}, 7200, 86400),
    ({"DEVICE_TOKEN_MAX_SECONDS": "600"}, 600, 86400),
    ({"DEVICE_TOKEN_RENEWAL_SECONDS": "3600"}, 3600, 3600),
])
def test_settings_from_the_environment(changes, lifetime, renewal):
    settings = TokenSettings.from_environment({**BASE, **changes})
    assert (settings.lifetime_seconds, settings.renewal_seconds, settings.kms_key) == (lifetime, renewal, KEY_ARN)


@pytest.mark.parametrize("changes, said", [
    ({"DEVICE_TOKEN_SECONDS": "7200"}, "raise DEVICE_TOKEN_MAX_SECONDS"),
    ({"DEVICE_TOKEN_SECONDS": "30"}, "outside 60"),
    ({"DEVICE_TOKEN_SECONDS": "1h"}, "whole number"),
    ({"DEVICE_TOKEN_MAX_SECONDS": "86400"}, "outside 60..43200"),
    ({"DEVICE_TOKEN_RENEWAL_SECONDS": "600"}, "outside 3600"),
    ({DEVICE_TOKEN_ISSUER: ""}, "DEVICE_TOKEN_ISSUER"),
    ({device_tokens.DEVICE_TOKEN_KEY_FILE: "/k.pem"}, "exactly one"),
    ({device_tokens.DEVICE_TOKEN_KMS_KEY: ""}, "exactly one"),
])
def test_a_bad_setting_is_refused_whole(changes, said):
    with pytest.raises(AuthConfigError, match=said):
        TokenSettings.from_environment({**BASE, **changes})


def test_the_suites_and_make_serves_settings_sign_with_the_key_file():
    settings = TokenSettings.from_environment(DEVICE_TOKEN_ENVIRONMENT)
    assert isinstance(device_tokens.signer_for(settings), KeyFileSigner) and settings.kid == ISSUER.kid


def test_the_device_token_issuer_must_be_configured_whole_and_apart_from_the_main_one():
    main = {AUTH_ISSUER: ISSUER.issuer, AUTH_AUDIENCE: ISSUER.audience, AUTH_JWKS: json.dumps(ISSUER.jwks())}
    assert len(AuthConfig.from_environment(main).issuers) == 1
    with pytest.raises(AuthConfigError, match="must all be set"):
        AuthConfig.from_environment({**main, DEVICE_TOKEN_ISSUER: "urn:x"})
    with pytest.raises(AuthConfigError, match="must differ"):
        AuthConfig.from_environment({**main, DEVICE_TOKEN_ISSUER: ISSUER.issuer, DEVICE_TOKEN_AUDIENCE: "a",
                                     DEVICE_TOKEN_JWKS: json.dumps(ISSUER.jwks())})
    both = AuthConfig.from_environment({**main, DEVICE_TOKEN_ISSUER: "urn:x", DEVICE_TOKEN_AUDIENCE: "a",
                                        DEVICE_TOKEN_JWKS: json.dumps(ISSUER.jwks())})
    assert [trusted.devices_only for trusted in both.issuers] == [False, True]


def test_the_device_token_issuers_tokens_only_ever_name_a_device():
    from functions.auth.credentials import Unauthenticated, certificate_principal
    from tests.auth import DEVICE_TOKEN_ISSUER

    config = AuthConfig.from_environment({**ISSUER.environment(), **DEVICE_TOKEN_ENVIRONMENT})
    scoped = verify_token(DEVICE_TOKEN_ISSUER.token(["devices.write"], device="lamp-1", sub="device:lamp-1",
                                                    scope="devices.write"), config)
    assert (scoped.kind, scoped.device_id, scoped.scopes) == ("device", "lamp-1", frozenset())
    for claims in ({"sub": "device:lamp-1"},  # no device_id: a back-end's shape, refused
                   {"device": "lamp-1", "sub": "device:lamp-2"}, {"device": "lamp-1", "sub": "device-lamp-1"}):
        device = claims.pop("device", None)
        with pytest.raises(Unauthenticated, match="must name its device"):
            verify_token(DEVICE_TOKEN_ISSUER.token(device=device, **claims), config)
    # The main issuer's back-end tokens keep their scopes beside it (the control).
    assert verify_token(ISSUER.token(["devices.write"]), config).scopes == {"devices.write"}
    # A certificate authenticates now: the time a device token's renewal chain starts from.
    from localdev.tls import LocalCA
    import tempfile

    ca = LocalCA.load_or_create(tempfile.mkdtemp())
    pem = open(ca.device_certificate("lamp-1")[0]).read()
    later = int(time.time()) + 3600  # within the certificate's days, whenever the suite runs
    assert certificate_principal(pem, now=later).auth_time == later


def test_a_token_names_its_credentials_expiry_which_the_principal_and_its_authorizer_context_carry():
    """``cexp``: when the credential the token names expires (no WebSocket connection outlives it,
    docs/api/feed-and-push.md); absent for a credential that never expires, and for a token naming
    no credential."""
    kms = FakeKms()
    config = AuthConfig.from_environment({
        **ISSUER.environment(), DEVICE_TOKEN_ISSUER: SETTINGS.issuer, DEVICE_TOKEN_AUDIENCE: SETTINGS.audience,
        DEVICE_TOKEN_JWKS: json.dumps(kms.jwks())})
    now = int(time.time())
    held = Principal.device("lamp-1", auth_time=now, credential_id="abcdefgh")
    for principal, credential_expires, named in ((held, now + 600, now + 600), (held, None, None),
                                                 (Principal.device("lamp-1", auth_time=now), now + 600, None)):
        answer = issue(principal, KmsSigner(KEY_ARN, kms), SETTINGS, credential_expires_at=credential_expires)
        verified = verify_token(answer["token"], config)
        assert verified.credential_expires_at == named
        assert Principal.from_context(verified.as_context()) == verified
        if credential_expires is not None:
            assert verified.expires_at <= credential_expires


@pytest.mark.parametrize("cexp", ["600", 1.5, True, -1, {"at": 1}])
def test_a_credential_expiry_that_is_no_time_refuses_the_token(cexp):
    from functions.auth.credentials import Unauthenticated

    config = AuthConfig.from_environment({**ISSUER.environment(), **DEVICE_TOKEN_ENVIRONMENT})
    from tests.auth import DEVICE_TOKEN_ISSUER as DEVICE_ISSUER

    with pytest.raises(Unauthenticated, match="cexp"):
        verify_token(DEVICE_ISSUER.token(device="lamp-1", sub="device:lamp-1", cid="abcdefgh", cexp=cexp), config)


@pytest.mark.parametrize("creg", [600, "", "1e9", "4000000000.1234567", "-1", {"n": "1"}])
def test_a_credential_entry_that_is_no_entry_refuses_the_token_and_one_that_is_rides_to_the_holder(creg):
    from functions.auth.credentials import Unauthenticated
    from tests.auth import DEVICE_TOKEN_ISSUER as DEVICE_ISSUER

    config = AuthConfig.from_environment({**ISSUER.environment(), **DEVICE_TOKEN_ENVIRONMENT})
    with pytest.raises(Unauthenticated, match="creg"):
        verify_token(DEVICE_ISSUER.token(device="lamp-1", sub="device:lamp-1", cid="abcdefgh", creg=creg), config)
    verified = verify_token(DEVICE_ISSUER.token(device="lamp-1", sub="device:lamp-1", cid="abcdefgh",
                                                creg="4123456789"), config)
    assert verified.holder().registration == "4123456789"
    assert Principal.from_context(verified.as_context()) == verified


def test_a_token_of_a_certificate_never_registered_opens_nothing_once_it_is_registered_whatever_follows():
    """A token got over mutual TLS with a certificate of the trusted CA the device never
    registered names UNREGISTERED_CERTIFICATE: it opens the device while the device requires no
    registered certificate, and nothing once the certificate is registered, revoked and registered
    again (a token naming no entry would open the device again then)."""
    from functions.device_state.item.credentials import (CERTIFICATE_NEVER, UNREGISTERED_CERTIFICATE, Holder,
                                                         certificate_entry, token_entry)
    from functions.device_state.item import schema

    now = 1_800_000_000.0
    live = {schema.VERSION: {"N": "1"}, schema.CREATED_AT: {"S": "2026-11-30T00:00:00.000Z"}}
    entry = token_entry(live, "c" * 8, certificate=True)
    assert entry == UNREGISTERED_CERTIFICATE and token_entry(live, "c" * 8, certificate=False) is None
    token, naive = Holder("c" * 8, certificate=True, registration=entry), Holder("c" * 8, certificate=True)
    assert token.admits(live, now) and naive.admits(live, now)
    registered = {**live, schema.CREDENTIALS: {"M": {"c" * 8: {"N": certificate_entry(0)}}},
                  schema.CERTIFICATE_REQUIRED: {"BOOL": True}}
    revoked = {**registered, schema.CREDENTIALS: {"M": {}}}
    again = {**registered, schema.CREDENTIALS: {"M": {"c" * 8: {"N": certificate_entry(0)}}}}
    assert int(again[schema.CREDENTIALS]["M"]["c" * 8]["N"]) >= CERTIFICATE_NEVER
    assert [token.admits(item, now) for item in (registered, revoked, again)] == [False, False, False]
    assert naive.admits(again, now)  # the control: a token naming no entry is back
    assert token_entry(again, "c" * 8, certificate=True) == again[schema.CREDENTIALS]["M"]["c" * 8]["N"]


def test_a_token_got_with_a_certificate_ends_no_later_than_the_certificate(call_token_route, monkeypatch, tmp_path):
    """A device token minted from a certificate ending in 20 minutes ends with it (the mTLS probe:
    a resumed TLS session showed an expired certificate, and its tokens lived 24 hours on)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lamp-1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(minutes=20)).sign(key, hashes.SHA256()))
    issuer = Issuer.generate()
    signer = KeyFileSigner.from_file(str(issuer.save_key(tmp_path / "key.pem")), issuer.kid)
    monkeypatch.setattr(token_routes, "device_token_issuer", lambda: (SETTINGS, signer))
    event = make_event("POST", "/devices/lamp-1/token", {},
                       client_cert=client_cert(certificate.public_bytes(serialization.Encoding.DER)))
    answer = json.loads(lambda_handler(event, LambdaContext())["body"])
    assert answer["expiresIn"] <= 20 * 60, answer
    claims = jwt.decode(answer["token"], options={"verify_signature": False})
    assert claims["exp"] <= certificate.not_valid_after_utc.timestamp()


def test_a_token_is_refused_once_its_credential_has_ended_though_its_exp_is_within_the_leeway():
    """A token got with a certificate (or a credential registered with an end) carries that end as
    cexp, and its exp is no later; within the 60 s leeway past exp its requests and its renewal
    were answered 200 (the renewal with expiresIn -15), and the WebSocket heard nothing at all (a
    hostile review). At cexp it is refused: no leeway, as feed-and-push.md says."""
    from functions.auth.authorizer import principal_of
    from functions.auth.credentials import Unauthenticated

    settings, signer = device_tokens.device_token_issuer()  # the suite's, which every handler trusts
    now = int(time.time())
    held = Principal.device("lamp-1", auth_time=now - 30, credential_id="abcdefgh", certificate=True)
    answer = issue(held, signer, settings, now=now - 30, credential_expires_at=now - 5)
    assert answer["expiresIn"] == 25  # issued 30 s ago, its credential's end 5 s ago
    with pytest.raises(Unauthenticated, match="has expired"):
        principal_of({"headers": {"authorization": f"Bearer {answer['token']}"}, "requestContext": {}})
    alive = issue(held, signer, settings, now=now - 30, credential_expires_at=now + 60)
    assert principal_of({"headers": {"authorization": f"Bearer {alive['token']}"}, "requestContext": {}}).device_id == \
        "lamp-1"  # the same token before its credential's end
    with pytest.raises(RenewalRefused, match="has expired"):  # a renewal would be born expired
        issue(held, signer, settings, now=now, credential_expires_at=now - 5)


@pytest.mark.parametrize("claim, value", [("exp", 10**400), ("iat", -10**400), ("auth_time", 10**400)])
def test_a_time_claim_no_float_can_hold_is_a_401_not_a_500(claim, value):
    """math.isfinite() of an int of 400 digits raises OverflowError: a signed token with one was 500."""
    from functions.auth.credentials import Unauthenticated

    config = AuthConfig.from_environment(ISSUER.environment())
    with pytest.raises(Unauthenticated, match=claim):
        verify_token(ISSUER.token(**{claim: value}), config)
