"""cdk-nag's AwsSolutions checks, and the findings reviewed and accepted, each with its
reason (cdk-nag v3 acknowledges through CDK's own ``Validations`` API)."""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Stack, Validations
from aws_cdk import aws_apigatewayv2 as apigatewayv2
from aws_cdk import custom_resources
from cdk_nag import AwsSolutionsChecks

from .api import DeviceApi
from .console import Console
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
     "Back-ends get tokens by the client-credentials flow, where MFA does not apply. The console's users, whom an "
     "administrator adds (self sign-up is off), may add a TOTP second factor (MFA optional): Cognito takes "
     "'required' only when a pool is created, and deployed stacks' pools exist already."),
    ("AwsSolutions::AwsSolutions-COG8",
     "Cognito's Plus feature plan (threat protection) is billed per monthly active user; the pool's users are the "
     "few operators an administrator adds (no self sign-up), and back-ends use client credentials."),
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
    "fan-out functions may post to, look up and close any connection of this one WebSocket API's stage: no other API, "
    "stage or @connections method.")


# Acknowledged on the secret that holds the cursor key (infra/api.py).
CURSOR_KEY_ROTATION: tuple[str, str] = (
    "AwsSolutions::AwsSolutions-SMG4",
    "The cursor key only seals listing cursors (an HMAC, so readers cannot forge a page position); it is no "
    "credential and guards no data. The functions read it from their environment, which CloudFormation fills "
    "at deploy, so a rotation Secrets Manager made alone would reach no function; it is replaced by a deploy "
    "with the next cursorKeyGeneration instead, which refuses the cursors issued before (docs/operations.md).")


# Acknowledged on the console's bucket and distribution (infra/console.py).
CONSOLE_HOSTING: list[tuple[str, str]] = [
    ("AwsSolutions::AwsSolutions-S1",
     "The console's bucket holds its static files, the same for every visitor and no data; only CloudFront reads "
     "it (origin access control) and only its deployment writes it. What the console does is calls to the API, "
     "which the API's access logs record."),
    ("AwsSolutions::AwsSolutions-CFR3",
     "The distribution serves the console's static files and nothing else; every call the page makes goes to the "
     "HTTP API or the WebSocket API, whose access logs record who did what."),
    ("AwsSolutions::AwsSolutions-CFR4",
     "The distribution uses CloudFront's default *.cloudfront.net certificate, whose TLS policy CloudFront sets; a "
     "minimum protocol version needs a custom domain and its own certificate."),
    ("AwsSolutions::AwsSolutions-CFR1",
     "The console is for the operators of the fleet wherever they are; it holds no data (sign-in is Cognito's, "
     "data is the API's, which authorizes every call)."),
    ("AwsSolutions::AwsSolutions-CFR2",
     "The distribution serves static files, cached; WAF's charge per web ACL and per request would guard no data. "
     "The APIs the console calls have their own throttling and authorization."),
]

# Acknowledged on the function CDK's BucketDeployment brings (a singleton of the stack), which copies
# the console's files from the CDK assets bucket into the console's bucket at deploy.
CONSOLE_DEPLOYMENT: list[tuple[str, str]] = [
    ("AwsSolutions::AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
     "AWSLambdaBasicExecutionRole]",
     "CDK's BucketDeployment function is made with the AWS-managed basic execution role (its own logs only)."),
] + [(f"AwsSolutions::AwsSolutions-IAM5[{finding}]",
      "CDK's BucketDeployment grants: read the console's asset in the CDK assets bucket, write and prune the "
      "console's own bucket; wildcards over those two buckets' objects, nothing else.")
     for finding in ("Action::s3:GetObject*", "Action::s3:GetBucket*", "Action::s3:List*", "Action::s3:DeleteObject*",
                     "Action::s3:Abort*",
                     "Resource::arn:<AWS::Partition>:s3:::cdk-hnb659fds-assets-<AWS::AccountId>-<AWS::Region>/*",
                     "Resource::<{bucket}.Arn>/*")]
BUCKET_DEPLOYMENT_ID = "Custom::CDKBucketDeployment"  # the start of the singleton's construct id


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
        if isinstance(construct, Console):
            for hosting, why in CONSOLE_HOSTING:
                Validations.of(construct).acknowledge(Acknowledgment(id=hosting, reason=why))
            bucket = stack.resolve(stack.get_logical_id(construct.bucket.node.default_child))
            for child in stack.node.children:
                if child.node.id.startswith(BUCKET_DEPLOYMENT_ID):
                    for deployment, why in CONSOLE_DEPLOYMENT:
                        Validations.of(child).acknowledge(Acknowledgment(id=deployment.format(bucket=bucket), reason=why))
        if isinstance(construct, custom_resources.Provider):
            handler = stack.resolve(stack.get_logical_id(construct.on_event_handler.node.default_child))
            Validations.of(construct.node.scope).acknowledge(Acknowledgment(
                id=PROVIDER_INVOKES_HANDLER[0].format(handler=handler), reason=PROVIDER_INVOKES_HANDLER[1]))
