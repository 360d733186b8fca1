"""cdk-nag's AwsSolutions checks, and the findings reviewed and accepted, each with its
reason (cdk-nag v3 acknowledges through CDK's own ``Validations`` API)."""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Stack, Validations
from aws_cdk import aws_apigateway as apigateway
from aws_cdk import custom_resources
from cdk_nag import AwsSolutionsChecks

from .api import PUBLIC_PATHS

REVIEWED: list[tuple[str, str]] = [
    ("AwsSolutions::AwsSolutions-IAM5[Resource::*]",
     "Only X-Ray's PutTraceSegments/PutTelemetryRecords (added by active tracing) and the stream processor's "
     "dynamodb:ListStreams (added by its event source mapping) use Resource *: those actions support no "
     "resource-level permissions. The other DynamoDB actions are scoped to the table's or its stream's ARN."),
    ("AwsSolutions::AwsSolutions-L1",
     "Python 3.13 is pinned on purpose: AWS publishes the Powertools layer this function uses for "
     "python313/arm64; moving to a newer runtime goes with its layer, in one reviewed change."),
    ("AwsSolutions::AwsSolutions-APIG2",
     "The Lambda validates every body, header and parameter against the contract (docs/api.md) and answers "
     "RFC 9457 problem details; API Gateway models would duplicate that and answer in another format."),
    ("AwsSolutions::AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
     "AmazonAPIGatewayPushToCloudWatchLogs]",
     "API Gateway's account-level logging role uses the AWS-managed policy made for exactly that purpose."),
    ("AwsSolutions::AwsSolutions-COG4",
     "Every non-public method has a Lambda (REQUEST) authorizer, not a Cognito one: it verifies Cognito's "
     "tokens and also device certificates (mutual TLS) and another issuer's tokens, and its policy names the "
     "routes a caller may call (a device's only with its own id), which a Cognito authorizer cannot."),
    ("AwsSolutions::AwsSolutions-COG2",
     "The user pool has no users: back-ends get tokens by the client-credentials flow (an app client id and "
     "secret), where MFA does not apply. Self sign-up is off."),
    ("AwsSolutions::AwsSolutions-COG8",
     "Cognito's Plus feature plan (threat protection) guards user sign-ins; this pool has none, only "
     "client-credentials grants, and Plus is billed per monthly active user."),
    ("AwsSolutions::AwsSolutions-APIG3",
     "Stage throttling (rate and burst from context) and the Lambda authorizer front the API; accounts that "
     "expose it more widely should attach their organisation's WAF web ACL."),
    ("AwsSolutions::AwsSolutions-SQS3",
     "The change feed's on-failure queue is itself the dead-letter destination of the stream processor's "
     "event source mapping; its messages are read by operators (docs/operations.md runbook), never consumed and retried."),
]


def add_checks(app: App) -> None:
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


# Acknowledged on the public methods only: every other method has the Lambda authorizer.
PUBLIC_METHODS: tuple[str, str] = (
    "AwsSolutions::AwsSolutions-APIG4",
    "The OpenAPI document (GET/HEAD /openapi.json, and ANY there, which the handler answers 405) is public "
    "on purpose: it describes the API to callers before they hold credentials, and holds no device data.")


# Acknowledged, for its own handler only, where each custom resource provider is (its role is
# beside it).
PROVIDER_INVOKES_HANDLER: tuple[str, str] = (
    "AwsSolutions::AwsSolutions-IAM5[Resource::<{handler}.Arn>:*]",
    "CDK's custom resource provider framework may invoke its one handler function in any version (the "
    "ARN's :* suffix); it can invoke nothing else.")


def acknowledge_reviewed_findings(stack: Stack) -> None:
    for finding, reason in REVIEWED:
        Validations.of(stack).acknowledge(Acknowledgment(id=finding, reason=reason))
    finding, reason = PUBLIC_METHODS
    for construct in stack.node.find_all():
        if isinstance(construct, apigateway.Method) and construct.resource.path.lstrip("/") in PUBLIC_PATHS:
            Validations.of(construct).acknowledge(Acknowledgment(id=finding, reason=reason))
        if isinstance(construct, custom_resources.Provider):
            handler = stack.resolve(stack.get_logical_id(construct.on_event_handler.node.default_child))
            Validations.of(construct.node.scope).acknowledge(Acknowledgment(
                id=PROVIDER_INVOKES_HANDLER[0].format(handler=handler), reason=PROVIDER_INVOKES_HANDLER[1]))
