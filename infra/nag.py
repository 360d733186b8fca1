"""cdk-nag's AwsSolutions checks, and the findings reviewed and accepted, each with its
reason (cdk-nag v3 acknowledges through CDK's own ``Validations`` API)."""

from __future__ import annotations

from aws_cdk import Acknowledgment, App, Stack, Validations
from cdk_nag import AwsSolutionsChecks

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
     "Callers are devices, automations and backends with AWS credentials: the API uses IAM (SigV4) "
     "authorization on every method instead of a Cognito user pool."),
    ("AwsSolutions::AwsSolutions-APIG3",
     "Stage throttling (rate and burst from context) and IAM authorization front the API; accounts that "
     "expose it more widely should attach their organisation's WAF web ACL."),
    ("AwsSolutions::AwsSolutions-SQS3",
     "The change feed's on-failure queue is itself the dead-letter destination of the stream processor's "
     "event source mapping; its messages are read by operators (docs/operations.md runbook), never consumed and retried."),
]


def add_checks(app: App) -> None:
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))


def acknowledge_reviewed_findings(stack: Stack) -> None:
    for finding, reason in REVIEWED:
        Validations.of(stack).acknowledge(Acknowledgment(id=finding, reason=reason))
