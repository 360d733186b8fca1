"""cdk-nag's AwsSolutions checks, and the findings reviewed and accepted, each with its
reason (cdk-nag v3 acknowledges through CDK's own ``Validations`` API)."""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Stack, Validations
from aws_cdk import aws_apigatewayv2 as apigatewayv2
from aws_cdk import custom_resources
from cdk_nag import AwsSolutionsChecks

from .api import DeviceApi
from .push import CONNECTION_METHODS, STAGE_NAME, Push

REVIEWED: list[tuple[str, str]] = [
    ("AwsSolutions::AwsSolutions-IAM5[Resource::*]",
     "Only X-Ray's PutTraceSegments/PutTelemetryRecords (added by active tracing) and the stream processor's "
     "dynamodb:ListStreams (added by its event source mapping) use Resource *: those actions support no "
     "resource-level permissions. The other DynamoDB actions are scoped to the table's or its stream's ARN."),
    ("AwsSolutions::AwsSolutions-L1",
     "Python 3.13 is pinned on purpose: AWS publishes the Powertools layer this function uses for "
     "python313/arm64; moving to a newer runtime goes with its layer, in one reviewed change."),
    ("AwsSolutions::AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
     "AmazonAPIGatewayPushToCloudWatchLogs]",
     "API Gateway's account-level logging role uses the AWS-managed policy made for exactly that purpose."),
    ("AwsSolutions::AwsSolutions-COG4",
     "No route has a Cognito authorizer: the API function verifies Cognito's tokens itself, and also device "
     "certificates (mutual TLS) and another issuer's tokens, and authorizes each request by what it touches "
     "(a device only itself), which a Cognito authorizer cannot."),
    ("AwsSolutions::AwsSolutions-COG2",
     "The user pool has no users: back-ends get tokens by the client-credentials flow (an app client id and "
     "secret), where MFA does not apply. Self sign-up is off."),
    ("AwsSolutions::AwsSolutions-COG8",
     "Cognito's Plus feature plan (threat protection) guards user sign-ins; this pool has none, only "
     "client-credentials grants, and Plus is billed per monthly active user."),
    ("AwsSolutions::AwsSolutions-SQS3",
     "The change feed's and the fan-out's on-failure queues are themselves the dead-letter destinations of their "
     "event source mappings; their messages are read by operators (docs/operations.md runbook), never consumed "
     "and retried."),
]


def add_checks(app: App) -> None:
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


# Acknowledged on the HTTP API's routes.
HTTP_ROUTES: tuple[str, str] = (
    "AwsSolutions::AwsSolutions-APIG4",
    "The API function authenticates every request itself (bearer tokens, or the client certificate mutual TLS "
    "verified) and authorizes it by what it touches with the one authorize() (functions/auth/rights.py), "
    "answering 401/403 as problem details before reading or writing anything; only the OpenAPI document is "
    "public. A gateway authorizer would cost an invocation per request and could not see bodies.")


# Acknowledged, for its own handler only, where each custom resource provider is (its role is
# beside it).
PROVIDER_INVOKES_HANDLER: tuple[str, str] = (
    "AwsSolutions::AwsSolutions-IAM5[Resource::<{handler}.Arn>:*]",
    "CDK's custom resource provider framework may invoke its one handler function in any version (the "
    "ARN's :* suffix); it can invoke nothing else.")


# Acknowledged on the WebSocket API's routes but $connect, which has the Lambda authorizer.
WEBSOCKET_MESSAGE_ROUTES: tuple[str, str] = (
    "AwsSolutions::AwsSolutions-APIG4",
    "API Gateway runs a WebSocket API's authorizer on $connect only (no other route may have one): every later "
    "message of a connection comes from the caller authenticated when it connected, whose principal API Gateway "
    "hands the push function with each message; the function checks that caller may read each device it "
    "subscribes to (functions/push/handler.py).")


# Acknowledged where the push functions' roles are, for this one WebSocket API and stage.
MANAGE_CONNECTIONS: tuple[str, str] = (
    "AwsSolutions::AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:"
    "<{api}>/{stage}/{method}/@connections/*]",
    "A connection's id exists only at run time (API Gateway names each connection at $connect), so the push and "
    "fan-out functions may post to and close any connection of this one WebSocket API's stage: no other API, "
    "stage or @connections method.")


# Acknowledged on the secret that holds the cursor key (infra/api.py).
CURSOR_KEY_ROTATION: tuple[str, str] = (
    "AwsSolutions::AwsSolutions-SMG4",
    "The cursor key only seals listing cursors (an HMAC, so readers cannot forge a page position); it is no "
    "credential and guards no data. The functions read it from their environment, which CloudFormation fills "
    "at deploy, so a rotation Secrets Manager made alone would reach no function; it is replaced by a deploy "
    "with the next cursorKeyGeneration instead, which refuses the cursors issued before (docs/operations.md).")


def acknowledge_reviewed_findings(stack: Stack) -> None:
    for finding, reason in REVIEWED:
        Validations.of(stack).acknowledge(Acknowledgment(id=finding, reason=reason))
    finding, reason = HTTP_ROUTES
    for construct in stack.node.find_all():
        if isinstance(construct, apigatewayv2.HttpRoute):
            Validations.of(construct).acknowledge(Acknowledgment(id=finding, reason=reason))
        if isinstance(construct, apigatewayv2.WebSocketRoute) and construct.route_key != "$connect":
            Validations.of(construct).acknowledge(Acknowledgment(id=WEBSOCKET_MESSAGE_ROUTES[0],
                                                                 reason=WEBSOCKET_MESSAGE_ROUTES[1]))
        if isinstance(construct, Push):
            api = stack.resolve(stack.get_logical_id(construct.api.node.default_child))
            for method in CONNECTION_METHODS:
                Validations.of(construct).acknowledge(Acknowledgment(
                    id=MANAGE_CONNECTIONS[0].format(api=api, stage=STAGE_NAME, method=method),
                    reason=MANAGE_CONNECTIONS[1]))
        if isinstance(construct, DeviceApi):
            Validations.of(construct.cursor_key).acknowledge(Acknowledgment(id=CURSOR_KEY_ROTATION[0],
                                                                            reason=CURSOR_KEY_ROTATION[1]))
        if isinstance(construct, custom_resources.Provider):
            handler = stack.resolve(stack.get_logical_id(construct.on_event_handler.node.default_child))
            Validations.of(construct.node.scope).acknowledge(Acknowledgment(
                id=PROVIDER_INVOKES_HANDLER[0].format(handler=handler), reason=PROVIDER_INVOKES_HANDLER[1]))
