"""The API function and the HTTP API in front of it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import jsii
from aws_cdk import CfnOutput, Duration, RemovalPolicy
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_apigatewayv2 as apigatewayv2
from aws_cdk import aws_apigatewayv2_integrations as integrations
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from functions import config
from functions.api import routes
from functions.api.routes import openapi_path
from functions.device_state import metrics as metric_names
from functions.device_state import DEFAULT_RETENTION_SECONDS
from functions.device_state import DEFAULT_BUDGET_SECONDS, DEFAULT_MAX_ATTEMPTS
from functions.device_state import FleetIndex

from .bundling import REPO_ROOT, bundling_options, pinned_version

RUNTIME = lambda_.Runtime.PYTHON_3_13
PYTHON_VERSION = "3.13"
ARCHITECTURE = lambda_.Architecture.ARM_64
# Powertools publishes each release's layer ARN per region as a public SSM parameter
# (/aws/service/powertools/python/<arch>/<python>/<version>); CloudFormation resolves it at
# deploy time, so the layer always matches the version requirements.txt pins.
POWERTOOLS_LAYER_PARAMETER = "/aws/service/powertools/python/arm64/python{python}/{version}"
HANDLER = "functions.api.handler.lambda_handler"
OUTPUT_NAME = "Url"  # the stack output holding the API's base URL
# Every request answers by the function's end (functions.api.common.answer_deadline): waits
# and the retry budget are capped by the remaining time, and this stays under API Gateway's 29 s.
TIMEOUT = Duration.seconds(28)
MEMORY_MB = 512
LOG_RETENTION = logs.RetentionDays.ONE_MONTH
ALIAS_NAME = "live"  # what API Gateway and the stream's event source mapping invoke
# Every DynamoDB action the library calls, and no other.
# (Transactions need no action of their own: each action inside is authorised as the
# PutItem / UpdateItem / DeleteItem / ConditionCheckItem it is.)
DYNAMODB_ACTIONS = (
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:Scan",
    "dynamodb:Query",
)
# What a fleet query (functions/device_state/fleet/query.py) calls on each declared field's
# index: IAM authorises a query of an index on the index's own ARN, not the table's.
INDEX_ACTIONS = ("dynamodb:Query",)
# The Lambda authorizer of the WebSocket API's $connect: it verifies a token in milliseconds.
AUTHORIZER_HANDLER = "functions.auth.authorizer.lambda_handler"
AUTHORIZER_TIMEOUT = Duration.seconds(5)
AUTHORIZER_MEMORY_MB = 256
# The Lambda event of the HTTP API: payload format 1.0 (multiValueHeaders,
# multiValueQueryStringParameters, requestContext.identity.clientCert), which the handler reads.
PAYLOAD_FORMAT = apigatewayv2.PayloadFormatVersion.VERSION_1_0
# Access log fields (HTTP API $context variables), one JSON object a line.
ACCESS_LOG_FIELDS = {
    "requestId": "$context.requestId", "ip": "$context.identity.sourceIp", "requestTime": "$context.requestTime",
    "httpMethod": "$context.httpMethod", "path": "$context.path", "routeKey": "$context.routeKey",
    "status": "$context.status", "protocol": "$context.protocol", "responseLength": "$context.responseLength",
    "integrationStatus": "$context.integrationStatus", "integrationLatency": "$context.integrationLatency",
    "error": "$context.error.message",
}
DEVICE_URL_OUTPUT, DEVICE_DOMAIN_TARGET_OUTPUT = "DeviceUrl", "DeviceDomainTarget"
# The key listings' cursors are sealed with (functions/device_state/fleet/cursors.py): letters and digits
# Secrets Manager generates at the first deploy, resolved by CloudFormation into the API
# functions' environment (a dynamic reference: the template holds the secret's ARN, never its
# value, and no function calls Secrets Manager, at cold start or ever).
CURSOR_KEY_CHARACTERS = 64
CURSOR_KEY_SECRET = "CursorKey"  # the secret's construct id; a later generation's adds its number


def resource_path(rule: str) -> str:
    """A route's rule (functions/api/routes.py) as an API Gateway resource path:
    ``/devices/<device_id>/leases/<lease_id>`` is ``devices/{deviceId}/leases/{leaseId}``."""
    return openapi_path(rule).lstrip("/")


# The routes that wait (long-polls of the change feed and of the delta, and a lease request, each
# with waitSeconds), as their declarations say (functions/api/routes.py, which the dev server reads
# too). A wait holds its Lambda execution for its whole length, so these methods integrate the
# waiting function, whose reserved concurrency caps them: however many clients wait, the API
# function's executions stay free for writes.
WAITING_ROUTES = routes.WAITING_ROUTES


@dataclass(frozen=True)
class DeviceDomain:
    """A custom domain with mutual TLS for devices that call with a client certificate."""

    name: str
    certificate_arn: str
    truststore_uri: str  # s3://bucket/key of the PEM bundle of CAs device certificates chain to

    def __post_init__(self):
        if not self.certificate_arn or not self.truststore_uri.startswith("s3://"):
            raise ValueError("context deviceDomainName needs certificateArn and truststoreUri (s3://bucket/key)")


class DeviceApi(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        table: dynamodb.ITable,
        throttle_rate: float,
        throttle_burst: int,
        require_if_match: bool = False,
        reserved_concurrency: int | None = None,
        waiting_reserved_concurrency: int | None = None,
        change_retention_seconds: int = DEFAULT_RETENTION_SECONDS,
        tombstone_seconds: int = config.DEFAULT_TOMBSTONE_SECONDS,
        snap_start: bool = True,
        auth_environment: dict[str, str],
        token_environment: dict[str, str] | None = None,
        device_domain: DeviceDomain | None = None,
        fleet_index: FleetIndex = FleetIndex(),
        cursor_key_generation: int = 1,
        require_registered_credentials: bool = False,
    ):
        super().__init__(scope, construct_id)
        # The asset and the layer are shared with the stream processor (infra/changes.py).
        self.code = lambda_.Code.from_asset(str(REPO_ROOT / "functions"), bundling=bundling_options(PYTHON_VERSION))
        self.layer = lambda_.LayerVersion.from_layer_version_arn(
            self, "Powertools", ssm.StringParameter.value_for_string_parameter(self, powertools_layer_parameter()))
        self.cursor_key = cursor_key_secret(self, cursor_key_generation)
        environment = {
            config.TABLE_NAME: table.table_name,
            config.CURSOR_KEY: self.cursor_key.secret_value.unsafe_unwrap(),  # {{resolve:secretsmanager:…}}
            config.MAX_ATTEMPTS: str(DEFAULT_MAX_ATTEMPTS),
            config.RETRY_BUDGET_SECONDS: str(DEFAULT_BUDGET_SECONDS),
            config.SETTLE_SECONDS: str(config.DEFAULT_SETTLE_SECONDS),
            config.TOMBSTONE_SECONDS: str(tombstone_seconds),
            config.REQUIRE_IF_MATCH: "true" if require_if_match else "false",
            config.REQUIRE_REGISTERED_CREDENTIALS: "true" if require_registered_credentials else "false",
            config.CHANGE_RETENTION_SECONDS: str(change_retention_seconds),
            # The declared fields (normalized), only when there are any, like every opt-in setting.
            **({config.FLEET_INDEX: fleet_index.declaration} if fleet_index else {}),
            "POWERTOOLS_SERVICE_NAME": metric_names.SERVICE,
            "POWERTOOLS_METRICS_NAMESPACE": metric_names.NAMESPACE,
            "POWERTOOLS_LOG_LEVEL": "INFO",
            **auth_environment,
        }
        # Two functions of the same code, configuration and rights: one for the waiting routes
        # (WAITING_ROUTES), one for every other, each with its own reserved concurrency. Only the
        # latter serves POST /devices/{id}/token, credentials, enrollments and provisioning, so only
        # it has the signing and sealing variables (and kms:Sign, kms:Encrypt and kms:Decrypt).
        index_arns = [f"{table.table_arn}/index/{index['IndexName']}"
                      for index in fleet_index.global_secondary_indexes()]
        self.function = self._api_function(
            "Function", table, {**environment, **(token_environment or {}), config.NEVER_WAIT: "true"},
            reserved_concurrency, snap_start, index_arns)
        self.waiting_function = self._api_function("WaitingFunction", table, environment,
                                                   waiting_reserved_concurrency, snap_start, index_arns)
        self.alias = published_alias(self.function) if snap_start else self.function
        self.waiting_alias = published_alias(self.waiting_function) if snap_start else self.waiting_function
        # The Lambda authorizer guards the WebSocket API's $connect (infra/push.py). The HTTP API
        # has none: the function authenticates and authorizes every request itself (``authorize()``
        # in functions/auth/rights.py), answering 401/403 as problem details.
        self.authorizer_function, self.authorizer_handler = self._authorizer(auth_environment, snap_start)

        self.access_logs = logs.LogGroup(self, "AccessLogs", retention=LOG_RETENTION)
        integration, waiting = (
            integrations.HttpLambdaIntegration(name, alias, payload_format_version=PAYLOAD_FORMAT)
            for name, alias in (("Api", self.alias), ("Waiting", self.waiting_alias)))
        # Every request the waiting routes do not take goes to the API function (the $default
        # route): it answers each route, 404 for a path that is none and 405 with Allow for a method.
        # "HttpApi", not "Api": the REST API of earlier releases had that id, and CloudFormation
        # cannot change a logical id's resource type (tests/infra/test_upgrade.py).
        self.api = apigatewayv2.HttpApi(self, "HttpApi", api_name="device-state", description="Device-state service",
                                        create_default_stage=False, default_integration=integration)
        self.stage = apigatewayv2.HttpStage(
            self, "Stage", http_api=self.api, stage_name="$default", auto_deploy=True,
            throttle=apigatewayv2.ThrottleSettings(rate_limit=throttle_rate, burst_limit=throttle_burst),
            access_log_settings=AccessLogs(self.access_logs, ACCESS_LOG_FIELDS))
        for path, methods in _paths(WAITING_ROUTES).items():
            self.api.add_routes(path=f"/{path}", methods=[apigatewayv2.HttpMethod(m) for m in methods],
                                integration=waiting)
        url = CfnOutput(self, "Url", value=self.stage.url, description="Base URL of the device-state API")
        url.override_logical_id(OUTPUT_NAME)
        if device_domain:
            self._device_domain(device_domain)

    def _api_function(self, name: str, table: dynamodb.ITable, environment: dict[str, str],
                      reserved_concurrency: int | None, snap_start: bool,
                      index_arns: list[str] | None = None) -> lambda_.Function:
        """A function of the API's handler with its own log group and its own role (the table's
        DYNAMODB_ACTIONS, INDEX_ACTIONS on each fleet index's ARN and its own log group, nothing else)."""
        log_group = logs.LogGroup(self, f"{name}Logs", retention=LOG_RETENTION)
        role = iam.Role(self, f"{name}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        role.add_to_policy(iam.PolicyStatement(actions=list(DYNAMODB_ACTIONS), resources=[table.table_arn]))
        if index_arns:
            role.add_to_policy(iam.PolicyStatement(actions=list(INDEX_ACTIONS), resources=list(index_arns)))
        role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[log_group.log_group_arn]))
        return lambda_.Function(
            self, name, runtime=RUNTIME, architecture=ARCHITECTURE, handler=HANDLER, code=self.code,
            layers=[self.layer], reserved_concurrent_executions=reserved_concurrency, timeout=TIMEOUT,
            memory_size=MEMORY_MB, role=role, log_group=log_group, tracing=lambda_.Tracing.ACTIVE,
            snap_start=snap_start_conf(snap_start), environment=environment)

    def _authorizer(self, auth_environment: dict[str, str], snap_start: bool) -> tuple[lambda_.Function,
                                                                                      lambda_.IFunction]:
        """The REQUEST authorizer function (and what API Gateway invokes of it) of the WebSocket
        API's $connect. It has no DynamoDB rights: it reads nothing but the request and its
        AUTH_* configuration."""
        log_group = logs.LogGroup(self, "AuthorizerLogs", retention=LOG_RETENTION)
        role = iam.Role(self, "AuthorizerRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[log_group.log_group_arn]))
        function = lambda_.Function(
            self, "AuthorizerFunction", runtime=RUNTIME, architecture=ARCHITECTURE, handler=AUTHORIZER_HANDLER,
            code=self.code, timeout=AUTHORIZER_TIMEOUT, memory_size=AUTHORIZER_MEMORY_MB, role=role,
            log_group=log_group, tracing=lambda_.Tracing.ACTIVE, snap_start=snap_start_conf(snap_start),
            environment=dict(auth_environment))
        return function, published_alias(function) if snap_start else function

    def _device_domain(self, device_domain: DeviceDomain) -> None:
        """A regional custom domain with mutual TLS: API Gateway verifies the client certificate
        against the truststore and hands it to the function (``requestContext.identity.clientCert``)."""
        bucket, _, key = device_domain.truststore_uri.removeprefix("s3://").partition("/")
        domain = apigatewayv2.DomainName(  # a new id too, for the same reason as the API's
            self, "HttpDeviceDomain", domain_name=device_domain.name,
            certificate=acm.Certificate.from_certificate_arn(self, "DeviceCertificate",
                                                              device_domain.certificate_arn),
            endpoint_type=apigatewayv2.EndpointType.REGIONAL, security_policy=apigatewayv2.SecurityPolicy.TLS_1_2,
            mtls=apigatewayv2.MTLSConfig(bucket=s3.Bucket.from_bucket_name(self, "Truststore", bucket), key=key))
        apigatewayv2.ApiMapping(self, "DeviceDomainMapping", api=self.api, domain_name=domain, stage=self.stage)
        for name, value, description in (
                (DEVICE_URL_OUTPUT, f"https://{device_domain.name}/", "Base URL for devices (mutual TLS)"),
                (DEVICE_DOMAIN_TARGET_OUTPUT, domain.regional_domain_name,
                 f"Where {device_domain.name}'s DNS record (CNAME or alias) points")):
            CfnOutput(self, name, value=value, description=description).override_logical_id(name)


def _paths(routes) -> dict[str, list[str]]:
    """{path: [method, ...]} of (method, path) routes, methods in a stable order."""
    paths: dict[str, list[str]] = {}
    for method, path in sorted(routes):
        paths.setdefault(path, []).append(method)
    return paths


@jsii.implements(apigatewayv2.IAccessLogSettings)
class AccessLogs:
    """An API Gateway v2 stage's access logs: one JSON object a line, of ``fields``
    ($context variables), into ``log_group``."""

    def __init__(self, log_group: logs.ILogGroup, fields: dict[str, str]):
        self._log_group = log_group
        self._fields = fields

    @property
    def destination(self) -> apigatewayv2.IAccessLogDestination:
        return apigatewayv2.LogGroupLogDestination(self._log_group)

    @property
    def format(self) -> apigateway.AccessLogFormat:
        return apigateway.AccessLogFormat.custom(json.dumps(self._fields))


def snap_start_conf(enabled: bool) -> lambda_.SnapStartConf | None:
    """SnapStart on published versions: Lambda runs init when a version is published and
    starts new execution environments from its snapshot (``functions.device_state.restore``
    reseeds and reconnects after each restore)."""
    return lambda_.SnapStartConf.ON_PUBLISHED_VERSIONS if enabled else None


def cursor_key_secret(scope: Construct, generation: int) -> secretsmanager.Secret:
    """The cursor key's secret. Replacing the key is a deploy with the next ``generation``
    (context cursorKeyGeneration): a new secret under a new id, so the functions' reference
    changes and CloudFormation resolves it again (it never rereads an unchanged reference)."""
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
        raise ValueError(f"context cursorKeyGeneration: {generation!r} is not a whole number of at least 1")
    return secretsmanager.Secret(
        scope, CURSOR_KEY_SECRET if generation == 1 else f"{CURSOR_KEY_SECRET}{generation}",
        description="Seals the list and fleet-query cursors of the device-state API (docs/operations.md)",
        generate_secret_string=secretsmanager.SecretStringGenerator(
            password_length=CURSOR_KEY_CHARACTERS, exclude_punctuation=True, include_space=False),
        removal_policy=RemovalPolicy.DESTROY)  # a replaced key only invalidates cursors; nothing keeps it


def published_alias(function: lambda_.Function) -> lambda_.Alias:
    """An alias on the version published from the current code and configuration: callers
    invoke it, so they always reach a published version (SnapStart works only on those)."""
    return lambda_.Alias(function, "Live", alias_name=ALIAS_NAME, version=function.current_version)


def powertools_layer_parameter() -> str:
    """The public SSM parameter naming the layer of the Powertools version requirements.txt pins."""
    return POWERTOOLS_LAYER_PARAMETER.format(python=PYTHON_VERSION, version=pinned_version("aws-lambda-powertools"))
