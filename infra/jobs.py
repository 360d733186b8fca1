"""The job runner (functions/jobs/handler.py): a self-invoking function of the API's asset on its
Powertools layer, the engine docs/decisions.md chooses over Step Functions' Distributed Map and
SQS with Lambda. ``POST /jobs`` and a cancel invoke it for their job (the API function's
``JOB_RUNNER_FUNCTION``); it runs the job until about half a minute before its timeout and invokes
itself again while work is due. A schedule (every minute) invokes it with no job: it wakes each open
job that is due (a paced job's next batch, a deadline to sweep, a runner that died) and reports the
executions stuck in jobs no runner took (``JobStuckExecutions``)."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from functions import config
from functions.device_state import FleetIndex
from functions.device_state import metrics as metric_names

from .api import ARCHITECTURE, INDEX_ACTIONS, LOG_RETENTION, RUNTIME

HANDLER = "functions.jobs.handler.handler"
TIMEOUT = Duration.minutes(15)  # Lambda's longest: fewer hand-overs to the next invocation
# 16 device writes in flight, each a small request: network-bound; 512 MB for the CPU share the
# threads' JSON work needs.
MEMORY_MB = 512
SCHEDULE = Duration.minutes(1)  # how soon an idle job's due work or a dead runner's job is taken up
# What the runner calls on the table: the job's items (Query of its partition, GetItem, PutItem,
# UpdateItem, DeleteItem, BatchGetItem; transactions of those), the devices' items (GetItem,
# BatchGetItem, UpdateItem through the one pipeline) and, targeting, the fleet index (Query; a
# Scan of whether the table holds devices while a field it filters on is still building).
# tests/infra/test_fleet_index_stack.py runs the code and checks every request it sends is here.
DYNAMODB_ACTIONS = (
    "dynamodb:Scan",
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:ConditionCheckItem",
)


class JobRunner(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, table: dynamodb.ITable, code: lambda_.Code,
                 layer: lambda_.ILayerVersion, fleet_index: FleetIndex, cursor_key: secretsmanager.ISecret,
                 retention_seconds: int):
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(self, "Logs", retention=LOG_RETENTION)
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        self.role.add_to_policy(iam.PolicyStatement(actions=list(DYNAMODB_ACTIONS), resources=[table.table_arn]))
        index_arns = [f"{table.table_arn}/index/{index['IndexName']}" for index in fleet_index.global_secondary_indexes()]
        if index_arns:
            self.role.add_to_policy(iam.PolicyStatement(actions=list(INDEX_ACTIONS), resources=index_arns))
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[self.log_group.log_group_arn]))
        self.function = lambda_.Function(
            self, "Function", runtime=RUNTIME, architecture=ARCHITECTURE, handler=HANDLER, code=code,
            layers=[layer], timeout=TIMEOUT, memory_size=MEMORY_MB, role=self.role, log_group=self.log_group,
            # A job's chain of self-invocations is meant (Lambda stops one after about 16 links
            # as a runaway loop); each ends when the job is complete, idle or held by another.
            recursive_loop=lambda_.RecursiveLoop.ALLOW,
            environment={
                config.TABLE_NAME: table.table_name,
                config.CURSOR_KEY: cursor_key.secret_value.unsafe_unwrap(),  # the API's: a job's query cursor
                config.CHANGE_RETENTION_SECONDS: str(retention_seconds),
                **({config.FLEET_INDEX: fleet_index.declaration} if fleet_index else {}),
                "POWERTOOLS_SERVICE_NAME": metric_names.SERVICE,
                "POWERTOOLS_METRICS_NAMESPACE": metric_names.NAMESPACE,
                "POWERTOOLS_LOG_LEVEL": "INFO",
            },
        )
        # Invoking itself: a policy of its own (a statement naming the function in the role's
        # default policy would be a circular dependency, as in infra/reindex.py).
        self.self_invoke = iam.Policy(self, "InvokeItself", roles=[self.role], statements=[iam.PolicyStatement(
            actions=["lambda:InvokeFunction"], resources=[self.function.function_arn])])
        self.schedule = events.Rule(self, "Schedule", schedule=events.Schedule.rate(SCHEDULE),
                                    description="Wakes the jobs that are due (functions/jobs/handler.py)")
        self.schedule.add_target(targets.LambdaFunction(self.function, retry_attempts=0))

    def let_start(self, function: lambda_.Function, twin: lambda_.Function) -> None:
        """``function`` (the API's) starts a job's runner at once: its name and the right to invoke it.
        ``twin`` (the waiting function) has the same environment, not the right: it serves no POST."""
        for one in (function, twin):
            one.add_environment(config.JOB_RUNNER_FUNCTION, self.function.function_name)
        function.role.attach_inline_policy(iam.Policy(self, "StartedByTheApi", statements=[iam.PolicyStatement(
            actions=["lambda:InvokeFunction"], resources=[self.function.function_arn])]))
