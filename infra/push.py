"""Push over WebSocket: the WebSocket API (stage ``prod``) with the Lambda authorizer on
``$connect``, the push function behind its routes (functions/push/handler.py),
and the fan-out (functions/push/fanout.py): a consumer of the table's stream of its own that
brings each device's subscribers up to every change item the change feed writes, and closes a
device's own connections once it no longer holds the credential they were opened with. Both
functions run the API's asset on its Powertools layer."""

from __future__ import annotations

from aws_cdk import CfnOutput, Duration, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import aws_apigatewayv2 as apigatewayv2
from aws_cdk import aws_apigatewayv2_authorizers as authorizers
from aws_cdk import aws_apigatewayv2_integrations as integrations
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from functions import config
from functions.device_state import FleetIndex
from functions.push.connections import CONNECTIONS_ENDPOINT
from functions.push.fanout import BATCH_SIZE, FILTER_PATTERNS, MAX_RETRY_ATTEMPTS

from .api import ARCHITECTURE, LOG_RETENTION, RUNTIME, AccessLogs, published_alias, snap_start_conf

HANDLER = "functions.push.handler.lambda_handler"
FANOUT_HANDLER = "functions.push.fanout.lambda_handler"
STAGE_NAME = "prod"
URL_OUTPUT = "WebSocketUrl"
ROUTE_SELECTION_EXPRESSION = "$request.body.action"  # a message's "action" picks its route
# Every route, each to the push function; $default answers any other action with an error.
ROUTES = ("$connect", "$disconnect", "$default", "subscribe", "unsubscribe")
# A subscribe's catch-up posts every change after since before it returns; API Gateway waits
# at most 29 s for any route's integration.
TIMEOUT = Duration.seconds(28)
MEMORY_MB = 256
# A batch posts to every subscriber of up to BATCH_SIZE devices, each post bounded by
# functions/push/connections.py's 2 s connect and 5 s read timeouts.
FANOUT_TIMEOUT = Duration.seconds(60)
# What the subscriptions, the connections and the change log's reads call, and no other.
DYNAMODB_ACTIONS = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem",
                    "dynamodb:Query", "dynamodb:BatchGetItem")
# @connections: post a message, close a connection, ask whether one is open (a connect at its device's cap)
CONNECTION_METHODS = ("POST", "DELETE", "GET")
# What each function does with them: the push function answers and asks whether a connection is
# open, the fan-out sends changes and closes a revoked credential's connections.
FUNCTION_CONNECTION_METHODS = {"Function": ("POST", "GET"), "FanOut": ("POST", "DELETE")}
# Nothing on the fan-out's queue needs replaying (the subscribers of its devices catch up with
# the device's next change, or by subscribing again): a week to read why it failed.
FAILURE_RETENTION = Duration.days(7)
# Access log fields (WebSocket $context variables), one JSON object a line.
ACCESS_LOG_FIELDS = {
    "requestId": "$context.requestId", "connectionId": "$context.connectionId",
    "eventType": "$context.eventType", "routeKey": "$context.routeKey", "status": "$context.status",
    "requestTime": "$context.requestTime", "ip": "$context.identity.sourceIp",
    "principalId": "$context.authorizer.principalId", "error": "$context.error.message",
}


class Push(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, table: dynamodb.ITable, code: lambda_.Code,
                 layer: lambda_.ILayerVersion, authorizer: lambda_.IFunction, auth_environment: dict[str, str],
                 retention_seconds: int, throttle_rate: float, throttle_burst: int, snap_start: bool = True,
                 fleet_index: FleetIndex = FleetIndex(), require_registered_credentials: bool = False):
        super().__init__(scope, construct_id)
        self.api = apigatewayv2.WebSocketApi(self, "Api", api_name="device-state-push",
                                             description="Device-state push: follow devices' changes",
                                             route_selection_expression=ROUTE_SELECTION_EXPRESSION)
        self.access_logs = logs.LogGroup(self, "AccessLogs", retention=LOG_RETENTION)
        self.stage = apigatewayv2.WebSocketStage(
            self, "Stage", web_socket_api=self.api, stage_name=STAGE_NAME, auto_deploy=True,
            throttle=apigatewayv2.ThrottleSettings(rate_limit=throttle_rate, burst_limit=throttle_burst),
            access_log_settings=AccessLogs(self.access_logs, ACCESS_LOG_FIELDS))
        # A WebSocket stage's access logs need API Gateway's account-level CloudWatch role (one
        # per account and region, shared by every API there); kept when the stack is deleted.
        role = iam.Role(self, "CloudWatchRole", assumed_by=iam.ServicePrincipal("apigateway.amazonaws.com"),
                        managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(
                            "service-role/AmazonAPIGatewayPushToCloudWatchLogs")])
        self.cloud_watch_account = apigateway.CfnAccount(self, "Account", cloud_watch_role_arn=role.role_arn)
        for resource in (role, self.cloud_watch_account):
            resource.apply_removal_policy(RemovalPolicy.RETAIN)
        self.stage.node.add_dependency(self.cloud_watch_account)

        environment = {
            config.TABLE_NAME: table.table_name,
            config.CHANGE_RETENTION_SECONDS: str(retention_seconds),
            CONNECTIONS_ENDPOINT: self.stage.callback_url,
            # a device's connect must find the credential it comes with (certificates registered, if required)
            config.REQUIRE_REGISTERED_CREDENTIALS: "true" if require_registered_credentials else "false",
            # a device's connect and disconnect set connectivity/connected where it is declared
            **({config.FLEET_INDEX: fleet_index.declaration} if fleet_index else {}),
            **auth_environment,
        }
        self.function = self._function("Function", HANDLER, TIMEOUT, table, code, layer, environment, snap_start)
        self.fanout = self._function("FanOut", FANOUT_HANDLER, FANOUT_TIMEOUT, table, code, layer, environment,
                                     snap_start)
        self.alias = published_alias(self.function) if snap_start else self.function
        self.fanout_alias = published_alias(self.fanout) if snap_start else self.fanout

        integration = integrations.WebSocketLambdaIntegration("Push", self.alias)
        # API Gateway answers 401 without calling a WebSocket REQUEST authorizer when any of its
        # identity sources is missing, and clients send the token in one of three places: the
        # Authorization header, a bearer.<token> subprotocol (Sec-WebSocket-Protocol: browsers
        # cannot set headers) or ?token=. So the authorizer has no identity source and runs on
        # every $connect (WebSocket authorizers cache nothing anyway);
        # functions/auth/credentials.authenticate_event reads whichever came.
        connect_authorizer = authorizers.WebSocketLambdaAuthorizer("ConnectAuthorizer", authorizer, identity_source=[])
        for route in ROUTES:
            self.api.add_route(route, integration=integration,
                               authorizer=connect_authorizer if route == "$connect" else None)
        authorizer_resource = self.api.node.find_child("ConnectAuthorizer").node.default_child
        authorizer_resource.add_property_deletion_override("IdentitySource")  # CDK writes []; it is optional

        self.failures = sqs.Queue(self, "FanOutFailures", encryption=sqs.QueueEncryption.SQS_MANAGED,
                                  enforce_ssl=True, retention_period=FAILURE_RETENTION)
        # The mapping grants the stream reads (and SendMessage on the queue) to the role itself.
        # TRIM_HORIZON: a mapping created anew (first deploy, or replaced) starts from the oldest
        # record the stream keeps, not the newest, so no change written meanwhile goes unsent;
        # records already sent are skipped by each subscription's watermark. Bisect: a batch
        # that fails whole (a timeout: many subscribers) is split until it fits.
        self.fanout_alias.add_event_source(sources.DynamoEventSource(
            table, starting_position=lambda_.StartingPosition.TRIM_HORIZON, batch_size=BATCH_SIZE,
            bisect_batch_on_error=True, retry_attempts=MAX_RETRY_ATTEMPTS, report_batch_item_failures=True,
            on_failure=sources.SqsDlq(self.failures),
            filters=[lambda_.FilterCriteria.filter(pattern) for pattern in FILTER_PATTERNS]))

        url = CfnOutput(self, "Url", value=self.stage.url, description="WebSocket URL for push (wss://)")
        url.override_logical_id(URL_OUTPUT)

    def connections_arns(self, methods: tuple[str, ...]) -> list[str]:
        """execute-api ARNs of ``methods`` on this API's connections, in its stage."""
        stack = Stack.of(self)
        return [stack.format_arn(service="execute-api", resource=self.api.api_id,
                                 resource_name=f"{STAGE_NAME}/{method}/@connections/*")
                for method in methods]

    def _function(self, name: str, handler: str, timeout: Duration, table: dynamodb.ITable, code: lambda_.Code,
                  layer: lambda_.ILayerVersion, environment: dict[str, str], snap_start: bool) -> lambda_.Function:
        """A function with its own log group and role: DYNAMODB_ACTIONS on the table, its log
        group, and what it does with this API's connections (``FUNCTION_CONNECTION_METHODS``)."""
        log_group = logs.LogGroup(self, f"{name}Logs", retention=LOG_RETENTION)
        role = iam.Role(self, f"{name}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        role.add_to_policy(iam.PolicyStatement(actions=list(DYNAMODB_ACTIONS), resources=[table.table_arn]))
        role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[log_group.log_group_arn]))
        role.add_to_policy(iam.PolicyStatement(actions=["execute-api:ManageConnections"],
                                               resources=self.connections_arns(FUNCTION_CONNECTION_METHODS[name])))
        return lambda_.Function(
            self, name, runtime=RUNTIME, architecture=ARCHITECTURE, handler=handler, code=code, layers=[layer],
            timeout=timeout, memory_size=MEMORY_MB, role=role, log_group=log_group,
            snap_start=snap_start_conf(snap_start), environment=environment)
