"""The change feed's infrastructure: the stream processor (a second handler in the API's
asset, on the same Powertools layer), its event source mapping on the table's stream, the
on-failure queue, and, when asked for (``publish_events``), the EventBridge bus for
DeviceStateChanged events."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from functions import config
from functions.changes.handler import BATCH_SIZE, FILTER_PATTERN, MAX_RECORD_AGE_SECONDS, MAX_RETRY_ATTEMPTS
from functions.device_state import metrics as metric_names

from .api import ARCHITECTURE, LOG_RETENTION, RUNTIME, published_alias, snap_start_conf

HANDLER = "functions.changes.handler.lambda_handler"
BUS_NAME = "device-state"
TIMEOUT = Duration.seconds(60)  # a batch of 100 puts and events takes a few seconds at most
MEMORY_MB = 256
# The stream keeps records 24 h; a record older than this is given up (to the queue) so one
# poisoned record cannot hold a device's feed for a day.
MAX_RECORD_AGE = Duration.seconds(MAX_RECORD_AGE_SECONDS)
MAX_BATCHING_WINDOW = Duration.seconds(0)  # the feed's lag matters more than invocations saved
FAILURE_RETENTION = Duration.days(14)  # SQS's longest: time to read and replay what failed


class ChangeFeed(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, table: dynamodb.ITable, code: lambda_.Code,
                 layer: lambda_.ILayerVersion, retention_seconds: int, snap_start: bool = True,
                 publish_events: bool = False):
        super().__init__(scope, construct_id)
        # One PutEvents entry per change is billed whether a rule listens or not: the bus is opt-in.
        self.bus = events.EventBus(self, "Bus", event_bus_name=BUS_NAME) if publish_events else None
        self.failures = sqs.Queue(self, "OnFailure", encryption=sqs.QueueEncryption.SQS_MANAGED,
                                  enforce_ssl=True, retention_period=FAILURE_RETENTION)
        self.log_group = logs.LogGroup(self, "ProcessorLogs", retention=LOG_RETENTION)
        self.role = iam.Role(self, "ProcessorRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        # The processor writes change items, and the job executions a batch makes final with their
        # job's counts (a transaction of puts and an update); it reads only a job's spec, once.
        self.role.add_to_policy(iam.PolicyStatement(actions=["dynamodb:PutItem", "dynamodb:UpdateItem",
                                                             "dynamodb:GetItem"], resources=[table.table_arn]))
        if self.bus is not None:
            self.role.add_to_policy(iam.PolicyStatement(actions=["events:PutEvents"],
                                                        resources=[self.bus.event_bus_arn]))
        self.role.add_to_policy(iam.PolicyStatement(
            actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[self.log_group.log_group_arn]))
        self.function = lambda_.Function(
            self, "Processor", runtime=RUNTIME, architecture=ARCHITECTURE, handler=HANDLER, code=code,
            layers=[layer], timeout=TIMEOUT, memory_size=MEMORY_MB, role=self.role, log_group=self.log_group,
            snap_start=snap_start_conf(snap_start),
            environment={
                config.TABLE_NAME: table.table_name,
                config.CHANGE_RETENTION_SECONDS: str(retention_seconds),
                **({config.EVENT_BUS_NAME: self.bus.event_bus_name} if self.bus is not None else {}),
                "POWERTOOLS_SERVICE_NAME": metric_names.SERVICE,
                "POWERTOOLS_METRICS_NAMESPACE": metric_names.NAMESPACE,
                "POWERTOOLS_LOG_LEVEL": "INFO",
            },
        )
        self.alias = published_alias(self.function) if snap_start else self.function
        # The mapping grants the stream reads (and SendMessage on the queue) to the role itself.
        self.alias.add_event_source(sources.DynamoEventSource(
            table, starting_position=lambda_.StartingPosition.TRIM_HORIZON, batch_size=BATCH_SIZE,
            max_batching_window=MAX_BATCHING_WINDOW, bisect_batch_on_error=True,
            retry_attempts=MAX_RETRY_ATTEMPTS, max_record_age=MAX_RECORD_AGE, report_batch_item_failures=True,
            parallelization_factor=1,  # one batch per shard at a time: the feed's order
            on_failure=sources.SqsDlq(self.failures), filters=[lambda_.FilterCriteria.filter(FILTER_PATTERN)]))
