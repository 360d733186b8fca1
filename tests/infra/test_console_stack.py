"""The console in the CDK stack: its files in a private bucket only CloudFront reads (origin access
control), the distribution's response-headers policy with the page's CSP, CORS on the HTTP API for
the distribution's origin alone, the user-pool app client of its own (authorization code with
PKCE, no secret) whose tokens the functions accept, and the config.json the deployment writes,
which names Cognito's hosted UI and never make serve's local sign-in."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from aws_cdk.assertions import Template

from functions.auth.credentials import AUTH_AUDIENCE
from infra import console
from tests.infra.conftest import synth_stack
from tests.infra.test_auth_stack import function_environment
from tests.infra.test_stack import api_function, only

OWN_ISSUER = {"authIssuer": "https://issuer.example", "authAudience": "device-state"}


@pytest.fixture(scope="module")
def synthesized():
    """(template, the cloud assembly's directory) of the default stack, fleet fields declared."""
    app, stack = synth_stack({"fleetIndex": "reported/firmware:string,state/site:string"})
    assembly = app.synth()
    return Template.from_stack(stack), Path(assembly.directory)


@pytest.fixture(scope="module")
def template(synthesized) -> Template:
    return synthesized[0]


def distribution(template: Template) -> tuple[str, dict]:
    return only(template, "AWS::CloudFront::Distribution")


def console_origin(template: Template) -> dict:
    logical, _ = distribution(template)
    return {"Fn::Join": ["", ["https://", {"Fn::GetAtt": [logical, "DomainName"]}]]}


def console_client(template: Template) -> tuple[str, dict]:
    return only(template, "AWS::Cognito::UserPoolClient", {"AllowedOAuthFlows": ["code"]})


def test_the_files_are_in_a_private_bucket_that_only_the_distribution_reads(template):
    bucket_id, bucket = only(template, "AWS::S3::Bucket")
    assert bucket["Properties"]["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True, "BlockPublicPolicy": True, "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    _, policy = only(template, "AWS::S3::BucketPolicy")
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    [deny] = [statement for statement in statements if statement["Effect"] == "Deny"]
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    [allow] = [statement for statement in statements if statement["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "cloudfront.amazonaws.com"} and allow["Action"] == "s3:GetObject"
    distribution_id, properties = distribution(template)
    assert json.dumps(distribution_id) in json.dumps(allow["Condition"])  # this distribution, no other
    [origin] = properties["Properties"]["DistributionConfig"]["Origins"]
    assert origin["OriginAccessControlId"] and origin["S3OriginConfig"]["OriginAccessIdentity"] == ""
    assert origin["DomainName"] == {"Fn::GetAtt": [bucket_id, "RegionalDomainName"]}
    behavior = properties["Properties"]["DistributionConfig"]["DefaultCacheBehavior"]
    assert behavior["ViewerProtocolPolicy"] == "redirect-to-https" and behavior["AllowedMethods"] == ["GET", "HEAD"]
    [association] = behavior["FunctionAssociations"]
    assert association["EventType"] == "viewer-request"


def test_every_answer_carries_the_pages_content_security_policy(template):
    _, properties = distribution(template)
    policy_id = properties["Properties"]["DistributionConfig"]["DefaultCacheBehavior"]["ResponseHeadersPolicyId"]
    policy = template.to_json()["Resources"][policy_id["Ref"]]["Properties"]["ResponseHeadersPolicyConfig"]
    security = policy["SecurityHeadersConfig"]
    csp = json.dumps(security["ContentSecurityPolicy"]["ContentSecurityPolicy"])
    for directive in ("default-src 'none'", "script-src 'self';", "style-src 'self';", "frame-ancestors 'none'",
                      "require-trusted-types-for 'script'", "connect-src 'self' https://*.execute-api."):
        assert directive in csp, directive
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "amazoncognito.com" in csp  # the hosted UI's token endpoint, where the page trades its code
    assert security["ContentSecurityPolicy"]["Override"] is True
    assert security["FrameOptions"] == {"FrameOption": "DENY", "Override": True}
    assert security["ContentTypeOptions"] == {"Override": True}


def test_the_http_api_answers_cors_for_the_consoles_origin_only(template):
    _, api = only(template, "AWS::ApiGatewayV2::Api", {"ProtocolType": "HTTP"})
    cors = api["Properties"]["CorsConfiguration"]
    assert cors["AllowOrigins"] == [console_origin(template)]  # never *
    assert {"authorization", "if-match", "content-type"} <= set(cors["AllowHeaders"])
    assert "etag" in cors["ExposeHeaders"] and set(cors["AllowMethods"]) >= {"GET", "PATCH", "PUT", "DELETE"}
    _, websocket = only(template, "AWS::ApiGatewayV2::Api", {"ProtocolType": "WEBSOCKET"})
    assert "CorsConfiguration" not in websocket["Properties"]


def test_the_console_has_a_public_app_client_of_its_own_with_pkce_and_the_functions_accept_its_tokens(template):
    client_id, client = console_client(template)
    properties = client["Properties"]
    assert properties.get("GenerateSecret") is False  # a page keeps no secret: PKCE instead
    assert properties["AllowedOAuthFlowsUserPoolClient"] is True and properties["SupportedIdentityProviders"] == [
        "COGNITO"]
    scopes = json.dumps(properties["AllowedOAuthScopes"])
    assert "devices.read" in scopes and "devices.write" in scopes and "devices.report" not in scopes
    origin = console_origin(template)
    assert properties["CallbackURLs"] == [{"Fn::Join": ["", [*origin["Fn::Join"][1], "/console/"]]}]
    for handler in ("functions.api.handler.lambda_handler", "functions.push.handler.lambda_handler",
                    "functions.auth.authorizer.lambda_handler"):
        audiences = json.dumps(function_environment(template, handler)[AUTH_AUDIENCE])
        assert json.dumps({"Ref": client_id}) in audiences, handler
    _, backend = only(template, "AWS::Cognito::UserPoolClient", {"AllowedOAuthFlows": ["client_credentials"]})
    assert backend["Properties"]["GenerateSecret"] is True


def deployed_config(assembly: Path) -> dict:
    """The config.json the deployment writes (its asset, markers where the deploy puts values)."""
    [found] = [path for path in assembly.glob("asset.*/config.json")]
    return json.loads(re.sub(r"<<marker:0x[0-9a-f]+:\d+>>", '"(filled in at deploy)"', found.read_text()))


def test_config_json_names_the_hosted_ui_and_the_apis_never_a_local_sign_in(synthesized):
    template, assembly = synthesized
    config = deployed_config(assembly)
    assert config["auth"]["kind"] == "cognito" and "tokenPath" not in config["auth"]
    assert config["auth"]["scopes"] == "openid device-state/devices.read device-state/devices.write"
    assert config["fleetFields"] == [{"path": "reported/firmware", "type": "string"},
                                     {"path": "state/site", "type": "string"}]
    [deployment] = template.find_resources("Custom::CDKBucketDeployment").values()
    markers = json.dumps(deployment["Properties"]["SourceMarkers"])
    client_id, _ = console_client(template)
    for value in (json.dumps({"Ref": client_id}), "execute-api", "amazoncognito.com"):
        assert value in markers, value  # filled in at deploy: the client, the APIs' URLs, the hosted UI
    assert deployment["Properties"]["DestinationBucketKeyPrefix"] == "console/"
    assert deployment["Properties"]["DistributionPaths"] == ["/console/*"]
    assert deployment["Properties"]["SystemMetadata"] == {"cache-control": "no-cache"}
    files = {path.name for path in assembly.glob("asset.*/js/*.js")}
    assert {"main.js", "auth.js", "device.js", "fleet.js", "live.js"} <= files
    assert not [path for path in assembly.glob("asset.*/**/*") if "local-token" in path.name]


def test_with_your_own_issuer_there_is_no_app_client_and_the_page_asks_for_a_token(tmp_path):
    from tests.auth import ISSUER

    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(ISSUER.jwks()))
    app, stack = synth_stack({**OWN_ISSUER, "authJwksFile": str(jwks)})
    template = Template.from_stack(stack)
    assert not template.find_resources("AWS::Cognito::UserPoolClient")
    assert deployed_config(Path(app.synth().directory))["auth"] == {"kind": "token"}
    assert "amazoncognito.com" not in json.dumps(template.find_resources("AWS::CloudFront::ResponseHeadersPolicy"))
    assert function_environment(template, "functions.api.handler.lambda_handler")[AUTH_AUDIENCE] == "device-state"


def test_console_false_leaves_no_bucket_distribution_cors_or_client():
    _, stack = synth_stack({"console": "false"})
    template = Template.from_stack(stack)
    for kind in ("AWS::S3::Bucket", "AWS::CloudFront::Distribution", "Custom::CDKBucketDeployment"):
        assert not template.find_resources(kind), kind
    _, api = only(template, "AWS::ApiGatewayV2::Api", {"ProtocolType": "HTTP"})
    assert "CorsConfiguration" not in api["Properties"]
    assert len(template.find_resources("AWS::Cognito::UserPoolClient")) == 1  # the back-ends' alone
    audiences = function_environment(template, "functions.api.handler.lambda_handler")[AUTH_AUDIENCE]
    assert "," not in json.dumps(audiences)


def test_the_console_url_and_client_are_stack_outputs(template):
    outputs = template.to_json()["Outputs"]
    assert console.URL_OUTPUT in outputs and console.CLIENT_OUTPUT in outputs
    assert api_function(template)  # the stack is whole
