"""The browser console, deployed: its static files (console/) in a private S3 bucket that only
CloudFront reads (origin access control), served under /console/ with a response-headers policy
carrying the Content-Security-Policy; its settings (config.json) written beside them by the
deployment; CORS on the HTTP API for the distribution's origin alone; and, with Cognito, a
user-pool app client of its own (public, no secret: authorization code with PKCE through the
hosted UI). The console calls the public API with the signed-in person's token; it holds no
rights of its own. make serve's local sign-in (localdev/console.py) is no part of any of this.

Made in two steps, because of what depends on what: ``Console`` (bucket, distribution, app
client) before the API functions, whose AUTH_AUDIENCE names the app client; ``publish`` after
them, with the API's and the WebSocket's URLs (config.json, CORS)."""

from __future__ import annotations

from aws_cdk import CfnOutput, Duration, RemovalPolicy, Stack
from aws_cdk import aws_apigatewayv2 as apigatewayv2
from aws_cdk import aws_cloudfront as cloudfront
from aws_cdk import aws_cloudfront_origins as origins
from aws_cdk import aws_cognito as cognito
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_deployment as s3deploy
from constructs import Construct

from functions.auth.principals import READ_SCOPE, WRITE_SCOPE
from functions.device_state import FleetIndex

from .api import LOG_RETENTION
from .bundling import REPO_ROOT

CONSOLE_DIR = REPO_ROOT / "console"
PREFIX = "console"  # the console's address: https://<distribution>/console/
URL_OUTPUT, CLIENT_OUTPUT = "ConsoleUrl", "ConsoleClientId"
# What a console user's token may do: read and change devices (never report for one).
CONSOLE_SCOPES = (READ_SCOPE, WRITE_SCOPE)
# The console's calls: every method of the API, the headers it sends and those it reads.
CORS_METHODS = ("GET", "HEAD", "PUT", "PATCH", "POST", "DELETE")
CORS_HEADERS = ("authorization", "content-type", "if-match", "if-none-match", "idempotency-key", "lease-token")
CORS_EXPOSED = ("etag", "location", "retry-after")
CORS_MAX_AGE_SECONDS = 600
# / and /console go to /console/; a path ending in / is its index.html (S3 has no directory index).
INDEX_FUNCTION = """function handler(event) {
  var request = event.request;
  if (request.uri === "/" || request.uri === "/%s") {
    return {statusCode: 302, statusDescription: "Found", headers: {location: {value: "/%s/"}}};
  }
  if (request.uri.endsWith("/")) request.uri += "index.html";
  return request;
}""" % (PREFIX, PREFIX)


def content_security_policy(connect: list[str]) -> str:
    """The page's policy, as make serve sends it (localdev/console.py), with the origins it calls."""
    return ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
            f"connect-src 'self' {' '.join(connect)}; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; "
            "require-trusted-types-for 'script'; trusted-types 'none'")


class Console(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, user_pool: cognito.IUserPool | None = None,
                 domain: cognito.UserPoolDomain | None = None,
                 oauth_scopes: dict[str, cognito.OAuthScope] | None = None):
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.domain = domain
        self.bucket = s3.Bucket(self, "Files", block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                                encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
                                object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
                                removal_policy=RemovalPolicy.DESTROY)  # what it holds is rebuilt by any deploy
        # The API and the WebSocket by their region's execute-api domain, not their own: the HTTP
        # API's CORS names this distribution, so the distribution cannot name the API (a cycle).
        api_domain = f"*.execute-api.{stack.region}.{stack.url_suffix}"
        connect = [f"https://{api_domain}", f"wss://{api_domain}"] + ([domain.base_url()] if domain else [])
        headers = cloudfront.ResponseHeadersPolicy(
            self, "Headers", comment="Device-state console: CSP and security headers",
            security_headers_behavior=cloudfront.ResponseSecurityHeadersBehavior(
                content_security_policy=cloudfront.ResponseHeadersContentSecurityPolicy(
                    content_security_policy=content_security_policy(connect), override=True),
                content_type_options=cloudfront.ResponseHeadersContentTypeOptions(override=True),
                frame_options=cloudfront.ResponseHeadersFrameOptions(
                    frame_option=cloudfront.HeadersFrameOption.DENY, override=True),
                referrer_policy=cloudfront.ResponseHeadersReferrerPolicy(
                    referrer_policy=cloudfront.HeadersReferrerPolicy.NO_REFERRER, override=True),
                strict_transport_security=cloudfront.ResponseHeadersStrictTransportSecurity(
                    access_control_max_age=Duration.days(365), include_subdomains=True, override=True)))
        index = cloudfront.Function(self, "Index", code=cloudfront.FunctionCode.from_inline(INDEX_FUNCTION),
                                    runtime=cloudfront.FunctionRuntime.JS_2_0,
                                    comment="Device-state console: / and /console to /console/, a / to its index.html")
        self.distribution = cloudfront.Distribution(
            self, "Distribution", comment="Device-state console",
            default_behavior=cloudfront.BehaviorOptions(
                origin=origins.S3BucketOrigin.with_origin_access_control(self.bucket),
                viewer_protocol_policy=cloudfront.ViewerProtocolPolicy.REDIRECT_TO_HTTPS,
                allowed_methods=cloudfront.AllowedMethods.ALLOW_GET_HEAD,
                cache_policy=cloudfront.CachePolicy.CACHING_OPTIMIZED, compress=True,
                response_headers_policy=headers,
                function_associations=[cloudfront.FunctionAssociation(
                    function=index, event_type=cloudfront.FunctionEventType.VIEWER_REQUEST)]),
            http_version=cloudfront.HttpVersion.HTTP2_AND_3, price_class=cloudfront.PriceClass.PRICE_CLASS_100)
        self.origin = f"https://{self.distribution.distribution_domain_name}"
        self.url = f"{self.origin}/{PREFIX}/"
        self.client = None
        if user_pool is not None:
            self.client = user_pool.add_client(
                "ConsoleClient", generate_secret=False, prevent_user_existence_errors=True,
                enable_token_revocation=True, access_token_validity=Duration.hours(1),
                id_token_validity=Duration.hours(1), refresh_token_validity=Duration.hours(12),
                supported_identity_providers=[cognito.UserPoolClientIdentityProvider.COGNITO],
                o_auth=cognito.OAuthSettings(
                    flows=cognito.OAuthFlows(authorization_code_grant=True),
                    scopes=[cognito.OAuthScope.OPENID, *(oauth_scopes[name] for name in CONSOLE_SCOPES)],
                    callback_urls=[self.url], logout_urls=[self.url]))
            CfnOutput(self, CLIENT_OUTPUT, value=self.client.user_pool_client_id,
                      description="App client of the console (hosted UI, authorization code with PKCE)"
                      ).override_logical_id(CLIENT_OUTPUT)
        CfnOutput(self, URL_OUTPUT, value=self.url, description="The browser console").override_logical_id(URL_OUTPUT)

    def settings(self, api_url: str, websocket_url: str, fleet_index: FleetIndex) -> dict:
        """What config.json tells the page (make serve's is localdev/console.py's)."""
        if self.client is not None:
            auth = {"kind": "cognito", "domain": self.domain.base_url(), "clientId": self.client.user_pool_client_id,
                    "scopes": " ".join(["openid", *(f"device-state/{name}" for name in CONSOLE_SCOPES)])}
        else:
            auth = {"kind": "token"}  # your own issuer: a token of it is pasted in
        return {"api": api_url, "webSocket": websocket_url, "auth": auth,
                "fleetFields": [{"path": field.path, "type": field.type} for field in fleet_index.fields]}

    def publish(self, *, http_api: apigatewayv2.HttpApi, api_url: str, websocket_url: str,
                fleet_index: FleetIndex) -> None:
        """The files and config.json into the bucket (CloudFront's copies invalidated), and CORS on
        the HTTP API for this console's origin only."""
        self.deployment = s3deploy.BucketDeployment(
            self, "Deployment", destination_bucket=self.bucket, destination_key_prefix=f"{PREFIX}/",
            sources=[s3deploy.Source.asset(str(CONSOLE_DIR)),
                     s3deploy.Source.json_data("config.json", self.settings(api_url, websocket_url, fleet_index))],
            distribution=self.distribution, distribution_paths=[f"/{PREFIX}/*"], prune=True, memory_limit=256,
            log_group=logs.LogGroup(self, "DeploymentLogs", retention=LOG_RETENTION),
            # Browsers ask again (a 304 while unchanged), so a deploy never leaves a page mixing old and new modules.
            cache_control=[s3deploy.CacheControl.no_cache()])
        http_api.node.default_child.add_property_override("CorsConfiguration", {
            "AllowOrigins": [self.origin], "AllowMethods": list(CORS_METHODS), "AllowHeaders": list(CORS_HEADERS),
            "ExposeHeaders": list(CORS_EXPOSED), "MaxAge": CORS_MAX_AGE_SECONDS})
