"""The issuer whose tokens the API accepts, as the AUTH_ISSUER, AUTH_AUDIENCE and AUTH_JWKS
both functions read (functions/auth/credentials.py): a Cognito user pool whose app client
gives back-ends tokens by the client-credentials flow, or your own issuer (context
``authIssuer``), in which case no user pool is made. Either way the keys are resolved at
deploy time and handed over inline: Cognito's by a custom resource, your own issuer's read
from a file at synth. No function fetches keys at request time."""

from __future__ import annotations

import json
from pathlib import Path

from aws_cdk import CfnOutput, CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_cognito as cognito
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import custom_resources
from constructs import Construct

from functions.auth import jwks_resource
from functions.auth.credentials import AUTH_AUDIENCE, AUTH_ISSUER, AUTH_JWKS, AuthConfig
from functions.auth.principals import ADMIN_SCOPE, READ_SCOPE, REPORT_SCOPE, RESOURCE_SERVER, SCOPES, WRITE_SCOPE

from .api import ARCHITECTURE, LOG_RETENTION, RUNTIME
from .bundling import REPO_ROOT

SCOPE_DESCRIPTIONS = {  # what functions/auth/rights.py grants each scope
    READ_SCOPE: "Read and list devices, their versions, changes and lease queues",
    WRITE_SCOPE: "Create, replace and delete devices; write state and desired; take leases",
    REPORT_SCOPE: "Write devices' reported sections",
    ADMIN_SCOPE: "Register and revoke devices' credentials; create, read and end enrollments",
}
ACCESS_TOKEN_VALIDITY = Duration.hours(1)
# The stack outputs' names (what `cdk deploy` prints and docs/operations.md refers to).
USER_POOL_OUTPUT, CLIENT_OUTPUT, TOKEN_ENDPOINT_OUTPUT = "UserPoolId", "BackendClientId", "TokenEndpoint"


class CallerIdentity(Construct):
    """``environment``: the AUTH_* variables under which both functions accept the issuer's tokens."""

    def __init__(self, scope: Construct, construct_id: str, *, throwaway: bool, domain_prefix: str = "",
                 issuer: str = "", audience: str = "", jwks_file: str = ""):
        super().__init__(scope, construct_id)
        self.user_pool = self.client = self.domain = None
        self.oauth_scopes: dict[str, cognito.OAuthScope] = {}
        if issuer:
            self.environment = own_issuer_environment(issuer, audience, jwks_file)
            return
        stack = Stack.of(self)
        self.user_pool = cognito.UserPool(
            self, "UserPool", self_sign_up_enabled=False,
            # The console's users (added by an administrator) sign in with this much, and may add TOTP.
            password_policy=cognito.PasswordPolicy(min_length=14, require_digits=True, require_lowercase=True,
                                                   require_uppercase=True, require_symbols=True),
            mfa=cognito.Mfa.OPTIONAL, mfa_second_factor=cognito.MfaSecondFactor(sms=False, otp=True),
            deletion_protection=not throwaway,
            removal_policy=RemovalPolicy.DESTROY if throwaway else RemovalPolicy.RETAIN)
        scopes = [cognito.ResourceServerScope(scope_name=name, scope_description=SCOPE_DESCRIPTIONS[name])
                  for name in SCOPES]
        server = self.user_pool.add_resource_server("ResourceServer", identifier=RESOURCE_SERVER, scopes=scopes)
        # A Cognito domain prefix is unique per region across all accounts: the account makes it ours.
        prefix = domain_prefix or f"{stack.stack_name.lower()}-{stack.account}"
        domain = self.domain = self.user_pool.add_domain(
            "Domain", cognito_domain=cognito.CognitoDomainOptions(domain_prefix=prefix))
        self.oauth_scopes = {scope.scope_name: cognito.OAuthScope.resource_server(server, scope) for scope in scopes}
        self.client = self.user_pool.add_client(
            "BackendClient", generate_secret=True, access_token_validity=ACCESS_TOKEN_VALIDITY,
            prevent_user_existence_errors=True,
            o_auth=cognito.OAuthSettings(flows=cognito.OAuthFlows(client_credentials=True),
                                         scopes=list(self.oauth_scopes.values())))
        issuer = f"https://cognito-idp.{stack.region}.{stack.url_suffix}/{self.user_pool.user_pool_id}"
        self.environment = {AUTH_ISSUER: issuer, AUTH_AUDIENCE: self.client.user_pool_client_id,
                            AUTH_JWKS: self._resolved_jwks(issuer)}
        for name, value, description in (
                (USER_POOL_OUTPUT, self.user_pool.user_pool_id, "Cognito user pool of the API's callers"),
                (CLIENT_OUTPUT, self.client.user_pool_client_id, "App client for back-ends (client credentials)"),
                (TOKEN_ENDPOINT_OUTPUT, domain.base_url() + "/oauth2/token", "Where back-ends get tokens")):
            CfnOutput(self, name, value=value, description=description).override_logical_id(name)

    def _resolved_jwks(self, issuer: str) -> str:
        """The issuer's JWKS, read by functions/auth/jwks_resource.py when the stack is created or the
        issuer changes (CloudFormation updates a custom resource only when its properties do)."""
        log_group = logs.LogGroup(self, "JwksLogs", retention=LOG_RETENTION)
        role = iam.Role(self, "JwksRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[log_group.log_group_arn]))
        function = lambda_.Function(
            self, "JwksFunction", runtime=RUNTIME, architecture=ARCHITECTURE, handler="index.on_event",
            code=lambda_.Code.from_inline(Path(jwks_resource.__file__).read_text()),
            timeout=Duration.minutes(1), memory_size=128, role=role, log_group=log_group)
        # The provider framework's own function, with its own role (not AWSLambdaBasicExecutionRole).
        framework_logs = logs.LogGroup(self, "JwksProviderLogs", retention=LOG_RETENTION)
        framework_role = iam.Role(self, "JwksProviderRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        framework_role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[framework_logs.log_group_arn]))
        provider = custom_resources.Provider(self, "JwksProvider", on_event_handler=function, log_group=framework_logs,
                                             framework_on_event_role=framework_role)
        resource = CustomResource(self, "Jwks", service_token=provider.service_token, resource_type="Custom::Jwks",
                                  properties={"Issuer": issuer})
        return resource.get_att_string("Jwks")


def own_issuer_environment(issuer: str, audience: str, jwks_file: str) -> dict[str, str]:
    """Your own issuer's AUTH_* variables, its JWKS file read now and checked as the functions
    will check it, so a wrong file fails the synth and not the first request."""
    if not audience or not jwks_file:
        raise ValueError("context authIssuer needs authAudience and authJwksFile too")
    path = REPO_ROOT / jwks_file
    try:
        jwks = jwks_resource.compact(json.loads(path.read_text()))
    except (OSError, ValueError) as error:
        raise ValueError(f"context authJwksFile: {path}: {error}") from None
    environment = {AUTH_ISSUER: issuer, AUTH_AUDIENCE: audience, AUTH_JWKS: jwks}
    AuthConfig.from_environment(environment)
    return environment
