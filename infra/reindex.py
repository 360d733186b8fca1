"""The fleet index's backfill job (functions/reindex/handler.py), made only when the stack
declares at least one field (context ``fleetIndex``): a function of the API's asset on its
Powertools layer that sets the index attributes of every device written before a field was
declared. An operator invokes it once after such a deploy (asynchronously, the stack output
``ReindexFunction`` names it); it works until about a minute before its timeout, then
invokes itself again to go on from the position it saved on the table."""

from __future__ import annotations

from aws_cdk import CfnOutput, Duration
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from functions import config
from functions.device_state import FleetIndex
from functions.device_state import metrics as metric_names

from .api import ARCHITECTURE, LOG_RETENTION, RUNTIME

HANDLER = "functions.reindex.handler.handler"
OUTPUT_NAME = "ReindexFunction"  # the stack output naming the function (for `aws lambda invoke`)
TIMEOUT = Duration.minutes(15)  # Lambda's longest: fewer hand-overs to the next invocation
MEMORY_MB = 256  # pages of 100 items and one update per device: network-bound, not memory-bound
# One job at a time: an invocation made while another runs (the self-invocation, made just
# before the invocation returns, or an operator's second one) is throttled, and Lambda retries
# a throttled asynchronous event for up to six hours, so it runs after the first and resumes
# from the saved position (or finds every field ready and returns).
RESERVED_CONCURRENCY = 1
# What the job calls on the table: the fields' status items (Query of their partition first, to
# forget fields no longer declared; BatchGetItem, PutItem), the job's position (GetItem,
# PutItem, DeleteItem), the scan of devices and the update of each (Scan, UpdateItem).
# tests/infra/test_fleet_index_stack.py runs the code and checks every request it sends is here.
DYNAMODB_ACTIONS = (
    "dynamodb:Query",
    "dynamodb:Scan",
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
)


class Reindex(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, table: dynamodb.ITable, code: lambda_.Code,
                 layer: lambda_.ILayerVersion, fleet_index: FleetIndex, retention_seconds: int):
        super().__init__(scope, construct_id)
        if not fleet_index:
            raise ValueError("the reindex function needs at least one declared field")
        self.log_group = logs.LogGroup(self, "Logs", retention=LOG_RETENTION)
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        self.role.add_to_policy(iam.PolicyStatement(actions=list(DYNAMODB_ACTIONS), resources=[table.table_arn]))
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[self.log_group.log_group_arn]))
        self.function = lambda_.Function(
            self, "Function", runtime=RUNTIME, architecture=ARCHITECTURE, handler=HANDLER, code=code,
            layers=[layer], timeout=TIMEOUT, memory_size=MEMORY_MB, role=self.role, log_group=self.log_group,
            reserved_concurrent_executions=RESERVED_CONCURRENCY,
            # Lambda stops a chain of invocations of one function by another (itself included)
            # after about 16 links as a runaway loop; this one is meant, and ends when the scan
            # of the table does (a table of millions of devices takes more than 16 × 14 minutes).
            recursive_loop=lambda_.RecursiveLoop.ALLOW,
            environment={
                config.TABLE_NAME: table.table_name,
                config.CHANGE_RETENTION_SECONDS: str(retention_seconds),
                config.FLEET_INDEX: fleet_index.declaration,
                "POWERTOOLS_SERVICE_NAME": metric_names.SERVICE,
                "POWERTOOLS_METRICS_NAMESPACE": metric_names.NAMESPACE,
                "POWERTOOLS_LOG_LEVEL": "INFO",
            },
        )
        # Invoking itself: a policy of its own, apart from the role's default policy, because the
        # function depends on that one (CloudFormation creates the role's policy before the
        # function) and a statement naming the function's ARN there would be a circular dependency.
        self.self_invoke = iam.Policy(self, "InvokeItself", roles=[self.role], statements=[iam.PolicyStatement(
            actions=["lambda:InvokeFunction"], resources=[self.function.function_arn])])
        output = CfnOutput(self, "FunctionName", value=self.function.function_name,
                           description="The fleet index's backfill: aws lambda invoke --function-name <this> "
                                       "--invocation-type Event /dev/null, once after declaring a field")
        output.override_logical_id(OUTPUT_NAME)
