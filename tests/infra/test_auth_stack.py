"""Callers in the CDK stack: the HTTP API hands every request to the functions, which
authenticate it themselves (no gateway authorizer); the Lambda authorizer guards WebSocket
connects; the Cognito pool and app client, the AUTH_* configuration of both functions,
mutual TLS on a device domain, and your own issuer instead of Cognito."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Template

from functions import config
from functions.auth import jwks_resource
from functions.auth.credentials import AUTH_AUDIENCE, AUTH_ISSUER, AUTH_JWKS, DEVICE_TOKEN_VARIABLES, VARIABLES
from functions.auth.device_tokens import ISSUING_VARIABLES
from functions.auth.principals import RESOURCE_SERVER, SCOPES
from functions.auth.sealing import VARIABLES as SEALING_VARIABLES
from infra import api as api_module
from infra import auth, console, push
from tests.auth import ISSUER
from tests.infra.conftest import synth_stack
from tests.infra.test_stack import api_function as api_function_of
from tests.infra.test_stack import only

DEVICE_DOMAIN = {"deviceDomainName": "devices.example.com",
                 "certificateArn": "arn:aws:acm:eu-west-1:123456789012:certificate/0b1c2d3e",
                 "truststoreUri": "s3://example-truststore/devices/ca-bundle.pem"}


def template_with(context: dict) -> Template:
    _, stack = synth_stack(context)
    return Template.from_stack(stack)


@pytest.fixture(scope="module")
def device_domain_template() -> Template:
    return template_with(DEVICE_DOMAIN)


def http_routes(template: Template) -> dict[str, dict]:
    """{route key ("$default", "GET /devices/{deviceId}/changes"): route properties, with the
    "IntegrationUri" of its integration} of the HTTP API."""
    [api_id] = template.find_resources("AWS::ApiGatewayV2::Api", {"Properties": {"ProtocolType": "HTTP"}})
    integrations = template.find_resources("AWS::ApiGatewayV2::Integration")
    routes = {}
    for route in template.find_resources("AWS::ApiGatewayV2::Route").values():
        props = route["Properties"]
        if props["ApiId"] == {"Ref": api_id}:
            integration = props["Target"]["Fn::Join"][1][1]["Ref"]
            routes[props["RouteKey"]] = {**props, "IntegrationUri": integrations[integration]["Properties"][
                "IntegrationUri"], "PayloadFormatVersion": integrations[integration]["Properties"][
                "PayloadFormatVersion"]}
    return routes


def gateway_path(rule: str) -> str:
    return "/" + api_module.resource_path(rule)


def function_environment(template: Template, handler: str) -> dict:
    """The environment of the functions running ``handler`` (the API function and the waiting
    function run the same one, with the same environment but the API function's signing and sealing variables)."""
    found = template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": handler}})
    environments = [{name: value for name, value in function["Properties"]["Environment"]["Variables"].items()
                     if name not in ISSUING_VARIABLES + SEALING_VARIABLES and name != config.NEVER_WAIT} for function in found.values()]
    assert environments and all(environment == environments[0] for environment in environments), handler
    return environments[0]


# ------------------------------------------------------------ routes and authorizer


def test_the_rules_become_api_gateway_paths():
    assert gateway_path("/devices/<device_id>/leases/<lease_id>") == "/devices/{deviceId}/leases/{leaseId}"
    assert gateway_path("/devices/<device_id>/versions/<version>") == "/devices/{deviceId}/versions/{version}"


def test_every_request_reaches_a_function_with_no_gateway_authorizer(template):
    """The $default route takes every request the waiting routes do not (the function answers
    404 and 405 itself), and no route has an authorizer: the function authenticates."""
    routes = http_routes(template)
    assert set(routes) == {"$default"} | {f"{method} /{path}" for method, path in api_module.WAITING_ROUTES}
    for key, props in routes.items():
        assert props["AuthorizationType"] == "NONE" and "AuthorizerId" not in props, key
        assert props["PayloadFormatVersion"] == "1.0", key  # the event the handler reads
    assert not template.find_resources("AWS::ApiGatewayV2::Authorizer", {"Properties": {"ApiId": {
        "Ref": next(iter(template.find_resources("AWS::ApiGatewayV2::Api", {"Properties": {"ProtocolType": "HTTP"}})))}}})
    assert not template.find_resources("AWS::ApiGateway::RestApi")


def test_api_gateway_may_invoke_the_functions_of_this_api_only(template):
    [api_id] = template.find_resources("AWS::ApiGatewayV2::Api", {"Properties": {"ProtocolType": "HTTP"}})
    permissions = [permission["Properties"] for permission in template.find_resources(
        "AWS::Lambda::Permission", {"Properties": {"Principal": "apigateway.amazonaws.com"}}).values()
        if {"Ref": api_id} in permission["Properties"]["SourceArn"]["Fn::Join"][1]]
    invoked = {json.dumps(permission["FunctionName"]) for permission in permissions}
    assert invoked == {json.dumps(props["IntegrationUri"]) for props in http_routes(template).values()}


def test_the_authorizer_function(template):
    _, api_function = api_function_of(template)
    _, function = only(template, "AWS::Lambda::Function", {"Handler": api_module.AUTHORIZER_HANDLER})
    props = function["Properties"]
    assert props["Runtime"] == api_function["Properties"]["Runtime"] == "python3.13"
    assert props["Architectures"] == ["arm64"]
    assert props["Code"] == api_function["Properties"]["Code"]  # the same asset
    assert props["MemorySize"] <= 256 and props["Timeout"] <= 10
    assert "LogGroup" in props["LoggingConfig"]
    assert props["LoggingConfig"]["LogGroup"] != api_function["Properties"]["LoggingConfig"]["LogGroup"]
    assert "Layers" not in props  # it needs no Powertools


def test_the_authorizer_may_not_touch_dynamodb(template):
    _, function = only(template, "AWS::Lambda::Function", {"Handler": api_module.AUTHORIZER_HANDLER})
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    actions = set()
    for policy in template.find_resources("AWS::IAM::Policy").values():
        if {"Ref": role} in policy["Properties"]["Roles"]:
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                action = statement["Action"]
                actions |= set(action if isinstance(action, list) else [action])
    assert actions and not [action for action in actions if action.startswith("dynamodb:")]
    assert {action.split(":")[0] for action in actions} <= {"logs", "xray"}
    assert "ManagedPolicyArns" not in template.find_resources("AWS::IAM::Role")[role]["Properties"]


# ------------------------------------------------------------------------- Cognito


def test_the_user_pool_has_no_self_sign_up_and_is_kept(template):
    _, pool = only(template, "AWS::Cognito::UserPool")
    assert pool["Properties"]["AdminCreateUserConfig"]["AllowAdminCreateUserOnly"] is True
    assert pool["Properties"]["DeletionProtection"] == "ACTIVE"
    assert pool["DeletionPolicy"] == "Retain"


def test_a_throwaway_stack_throws_the_user_pool_away():
    _, pool = only(template_with({"throwaway": "true"}), "AWS::Cognito::UserPool")
    assert pool["Properties"]["DeletionProtection"] == "INACTIVE" and pool["DeletionPolicy"] == "Delete"


def test_the_resource_server_defines_the_four_scopes(template):
    pool_id, _ = only(template, "AWS::Cognito::UserPool")
    _, server = only(template, "AWS::Cognito::UserPoolResourceServer")
    props = server["Properties"]
    assert props["Identifier"] == RESOURCE_SERVER == "device-state"
    assert props["UserPoolId"] == {"Ref": pool_id}
    assert [scope["ScopeName"] for scope in props["Scopes"]] == list(SCOPES)
    assert set(SCOPES) == {"devices.read", "devices.write", "devices.report", "devices.admin"}


def test_the_back_end_client_uses_client_credentials_with_a_secret_and_the_scopes(template):
    server_id, _ = only(template, "AWS::Cognito::UserPoolResourceServer")
    _, client = only(template, "AWS::Cognito::UserPoolClient", {"AllowedOAuthFlows": ["client_credentials"]})
    props = client["Properties"]
    assert props["AllowedOAuthFlows"] == ["client_credentials"] and props["AllowedOAuthFlowsUserPoolClient"]
    assert props["GenerateSecret"] is True
    assert props["AllowedOAuthScopes"] == [{"Fn::Join": ["", [{"Ref": server_id}, f"/{scope}"]]}
                                           for scope in SCOPES]


def test_the_domain_prefix_defaults_to_the_stack_and_account_and_follows_context(template):
    _, domain = only(template, "AWS::Cognito::UserPoolDomain")
    assert domain["Properties"]["Domain"] == {"Fn::Join": ["", ["devicestatestack-", {"Ref": "AWS::AccountId"}]]}
    _, domain = only(template_with({"authDomainPrefix": "acme-devices"}), "AWS::Cognito::UserPoolDomain")
    assert domain["Properties"]["Domain"] == "acme-devices"


def test_both_functions_trust_the_pool_with_its_keys_resolved_at_deploy(template):
    pool_id, _ = only(template, "AWS::Cognito::UserPool")
    client_id, _ = only(template, "AWS::Cognito::UserPoolClient", {"AllowedOAuthFlows": ["client_credentials"]})
    console_client_id, _ = only(template, "AWS::Cognito::UserPoolClient", {"AllowedOAuthFlows": ["code"]})
    jwks_id, jwks = only(template, "Custom::Jwks")
    issuer = {"Fn::Join": ["", ["https://cognito-idp.", {"Ref": "AWS::Region"}, ".", {"Ref": "AWS::URLSuffix"},
                                "/", {"Ref": pool_id}]]}
    for handler in (api_module.HANDLER, api_module.AUTHORIZER_HANDLER):
        environment = function_environment(template, handler)
        assert environment[AUTH_ISSUER] == issuer, handler
        assert environment[AUTH_AUDIENCE] == {"Fn::Join": ["", [{"Ref": client_id}, ",", {"Ref": console_client_id}]]}, \
            handler  # the back-ends' client and the console's (infra/console.py)
        assert environment[AUTH_JWKS] == {"Fn::GetAtt": [jwks_id, "Jwks"]}, handler
    assert set(function_environment(template, api_module.AUTHORIZER_HANDLER)) == set(VARIABLES) | set(
        DEVICE_TOKEN_VARIABLES)
    assert jwks["Properties"]["Issuer"] == issuer


def test_the_jwks_resource_runs_the_standard_library_fetcher_inline(template):
    jwks_id, jwks = only(template, "Custom::Jwks")
    _, function = only(template, "AWS::Lambda::Function", {"Handler": "index.on_event",
                                                           "Code": {"ZipFile": open(jwks_resource.__file__).read()}})
    assert function["Properties"]["Runtime"] == "python3.13"
    imports = [line for line in function["Properties"]["Code"]["ZipFile"].splitlines()
               if line.startswith(("import ", "from "))]
    assert imports == ["import json", "import time", "import urllib.request"]


def test_the_outputs_say_how_back_ends_get_tokens(template):
    pool_id, _ = only(template, "AWS::Cognito::UserPool")
    client_id, _ = only(template, "AWS::Cognito::UserPoolClient", {"AllowedOAuthFlows": ["client_credentials"]})
    domain_id, _ = only(template, "AWS::Cognito::UserPoolDomain")
    outputs = template.find_outputs("*")
    assert outputs[auth.USER_POOL_OUTPUT]["Value"] == {"Ref": pool_id}
    assert outputs[auth.CLIENT_OUTPUT]["Value"] == {"Ref": client_id}
    assert outputs[auth.TOKEN_ENDPOINT_OUTPUT]["Value"] == {"Fn::Join": ["", [
        "https://", {"Ref": domain_id}, ".auth.", {"Ref": "AWS::Region"}, ".amazoncognito.com/oauth2/token"]]}


# ------------------------------------------------------------------ mutual TLS


def test_a_device_domain_has_mutual_tls_and_maps_the_api(device_domain_template):
    [api_id] = device_domain_template.find_resources("AWS::ApiGatewayV2::Api", {"Properties": {"ProtocolType": "HTTP"}})
    domain_id, domain = only(device_domain_template, "AWS::ApiGatewayV2::DomainName")
    props = domain["Properties"]
    assert props["DomainName"] == DEVICE_DOMAIN["deviceDomainName"]
    assert props["MutualTlsAuthentication"]["TruststoreUri"] == DEVICE_DOMAIN["truststoreUri"]
    [configuration] = props["DomainNameConfigurations"]
    assert configuration["CertificateArn"] == DEVICE_DOMAIN["certificateArn"]
    assert configuration["EndpointType"] == "REGIONAL" and configuration["SecurityPolicy"] == "TLS_1_2"
    _, mapping = only(device_domain_template, "AWS::ApiGatewayV2::ApiMapping")
    assert mapping["Properties"]["DomainName"] == {"Ref": domain_id}
    assert mapping["Properties"]["ApiId"] == {"Ref": api_id}
    outputs = device_domain_template.find_outputs("*")
    assert outputs[api_module.DEVICE_URL_OUTPUT]["Value"] == "https://devices.example.com/"
    assert api_module.DEVICE_DOMAIN_TARGET_OUTPUT in outputs


def test_with_a_device_domain_every_request_still_reaches_the_function(device_domain_template):
    """A device sends a certificate and no Authorization header: nothing before the function
    may ask for one."""
    assert all(props["AuthorizationType"] == "NONE" for props in http_routes(device_domain_template).values())


@pytest.mark.parametrize("missing", ["certificateArn", "truststoreUri"])
def test_a_device_domain_needs_a_certificate_and_a_truststore(missing):
    with pytest.raises(ValueError, match="certificateArn and truststoreUri"):
        synth_stack({**DEVICE_DOMAIN, missing: ""})


# -------------------------------------------------------------- your own issuer


@pytest.fixture
def own_jwks(tmp_path):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(ISSUER.jwks(), indent=2))
    return path


def test_your_own_issuer_replaces_cognito(own_jwks):
    template = template_with({"authIssuer": ISSUER.issuer, "authAudience": ISSUER.audience,
                              "authJwksFile": str(own_jwks)})
    assert not template.find_resources("AWS::Cognito::UserPool")
    assert not template.find_resources("Custom::Jwks")
    for handler in (api_module.HANDLER, api_module.AUTHORIZER_HANDLER):
        environment = function_environment(template, handler)
        assert environment[AUTH_ISSUER] == ISSUER.issuer and environment[AUTH_AUDIENCE] == ISSUER.audience
        assert json.loads(environment[AUTH_JWKS]) == ISSUER.jwks()
    assert sorted(template.find_outputs("*")) == sorted([api_module.OUTPUT_NAME, push.URL_OUTPUT, console.URL_OUTPUT])


@pytest.mark.parametrize("context, message", [
    ({"authAudience": ""}, "authAudience and authJwksFile"),
    ({"authJwksFile": "no/such/jwks.json"}, "no/such/jwks.json"),
    ({"authJwksFile": "cdk.json"}, "no keys"),
])
def test_your_own_issuer_needs_an_audience_and_a_readable_jwks(own_jwks, context, message):
    with pytest.raises(ValueError, match=message):
        synth_stack({"authIssuer": ISSUER.issuer, "authAudience": ISSUER.audience,
                     "authJwksFile": str(own_jwks), **context})


# What CloudFormation resolves at deploy time, counted at its longest: a resource's name or id
# (Ref: a function's name is at most 64 characters, and CloudFormation's generated names stay
# under), a key's ARN, the device tokens' JWKS (a custom resource's: two EC keys while one is
# rotated in), the cursor key a dynamic reference reads. Lambda holds 4 KB of a function's
# resolved environment.
RESOLVED_AT_MOST = {"Ref": 64, "Arn": 128, "Jwks": 512, "{{resolve:": api_module.CURSOR_KEY_CHARACTERS}
LAMBDA_ENVIRONMENT_BYTES = 4096


def resolved_bytes(value) -> int:
    if isinstance(value, str):
        return RESOLVED_AT_MOST["{{resolve:"] if value.startswith("{{resolve:") else len(value.encode())
    [(function, argument)] = value.items()
    if function == "Fn::Join":
        parts = argument[1]
        if isinstance(parts[0], str) and parts[0].startswith("{{resolve:"):
            return RESOLVED_AT_MOST["{{resolve:"]
        return sum(map(resolved_bytes, parts))
    if function == "Ref":
        return RESOLVED_AT_MOST["Ref"]
    assert function == "Fn::GetAtt" and argument[1] in RESOLVED_AT_MOST, value
    return RESOLVED_AT_MOST[argument[1]]


def test_every_function_environment_fits_lambdas_4_kb_with_the_largest_jwks_and_declaration_taken(tmp_path):
    """Your own issuer's JWKS at the most the synth takes, ten fields declared, a device domain:
    each function's environment, resolved, fits in Lambda's 4 KB (a larger one fails the
    deploy, which no synth test would show)."""
    key = ISSUER.jwks()["keys"][0]
    padding = jwks_resource.MAX_BYTES - len(jwks_resource.compact({"keys": [key, {**key, "kid": ""}]}))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [key, {**key, "kid": "k" * padding}]}))
    assert len(jwks_resource.compact(json.loads(path.read_text()))) == jwks_resource.MAX_BYTES
    fleet = ",".join(f"reported/sensors/sensor-{number:02d}/temperature:number" for number in range(10))
    template = template_with({**DEVICE_DOMAIN, "authIssuer": ISSUER.issuer, "authAudience": ISSUER.audience,
                              "authJwksFile": str(path), "fleetIndex": fleet, "requireRegisteredCredentials": True})
    sizes = {logical: sum(len(name) + resolved_bytes(value) for name, value in
                          function["Properties"].get("Environment", {}).get("Variables", {}).items())
             for logical, function in template.find_resources("AWS::Lambda::Function").items()}
    assert max(sizes.values()) > jwks_resource.MAX_BYTES  # the JWKS is in
    assert all(size <= LAMBDA_ENVIRONMENT_BYTES for size in sizes.values()), sizes


# ------------------------------------------------------------------------- nag


@pytest.mark.parametrize("context", [DEVICE_DOMAIN, {"authIssuer": "x"}], ids=["device domain", "own issuer"])
def test_cdk_nag_stays_clean_with_a_device_domain_and_with_your_own_issuer(context, own_jwks):
    if "authIssuer" in context:
        context = {"authIssuer": ISSUER.issuer, "authAudience": ISSUER.audience, "authJwksFile": str(own_jwks)}
    app, _ = synth_stack(context, nag=True)
    app.synth()  # a policy-validation failure raises here


def test_the_authorizer_alarm_watches_its_throttles_and_has_a_runbook_entry(template):
    from infra import monitoring
    from tests.infra.test_stack import REPO_ROOT, alarm_named

    function_id, _ = only(template, "AWS::Lambda::Function", {"Handler": api_module.AUTHORIZER_HANDLER})
    props = alarm_named(template, "AuthorizerThrottles")
    assert props["Namespace"] == "AWS/Lambda" and props["MetricName"] == "Throttles"
    assert props["Threshold"] == monitoring.AUTHORIZER_THROTTLES_PER_PERIOD
    assert props["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": function_id}}]
    assert "`AuthorizerThrottles`" in (REPO_ROOT / "docs" / "operations.md").read_text()
