"""Alarms (to an SNS topic) and a dashboard: contention first, then the usual faults.

Thresholds and periods are constants here, each with the reason for its value; the
runbook in docs/operations.md says what each alarm means and what to do.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_apigatewayv2 as apigatewayv2
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from functions.device_state import metrics as names

PERIOD = Duration.minutes(5)
# Failed conditional writes are billed like successful ones; more than ~1 a second for
# 5 minutes means clients are fighting over devices (or a client loops on stale ETags).
CONDITIONAL_CHECK_FAILED_PER_PERIOD = 300
# Any request that gave up under contention was answered 503: users felt it.
RETRIES_EXHAUSTED_PER_PERIOD = 0
# Any write whose answer was lost and could not be settled was answered 504: users must check.
OUTCOME_UNKNOWN_PER_PERIOD = 0
# Conflicts per successful update: above 0.5, every other write pays for a retry.
CONFLICTS_PER_UPDATE = 0.5
RETRY_RATE_EVALUATION_PERIODS = 3  # sustained for 15 minutes, not a burst
LAMBDA_ERRORS_PER_PERIOD = 0
LAMBDA_THROTTLES_PER_PERIOD = 0
# A throttled waiting request is a 500 for a long-poll or a lease request: more clients wait at
# once than waitingReservedConcurrency allows.
WAITING_THROTTLES_PER_PERIOD = 0
# A throttled authorizer is a 500 for a caller with good credentials. (Its Errors are no alarm:
# every refused token is one, since raising "Unauthorized" is how a Lambda authorizer says 401.)
AUTHORIZER_THROTTLES_PER_PERIOD = 0
API_5XX_PER_PERIOD = 5
# The API function's own duration, not the HTTP API's latency: the waiting routes (long-polls, lease
# waits) share the API and answer only when their wait ends, so 1 % of them would hold its p99 above
# any threshold. The retry budget is 5 s; p99 above 3 s means heavy contention.
API_P99_LATENCY_MS = 3000
# Transactions that collided with other writes on the same items; the library retries
# them, but a steady stream means scenes fight over the same devices.
TRANSACTION_CONFLICTS_PER_PERIOD = 50
# A holder whose heartbeat was refused had its lease run out mid-job: its later writes
# are fenced off, but the job may be half done. Any one is worth a look.
LEASE_HEARTBEATS_LOST_PER_PERIOD = 0
# Device tokens the signing key could not sign (KMS failing or unreachable; throttling is on
# the dashboard: a fleet reconnecting meets it by design and backs off)
SIGNING_UNAVAILABLE_PER_PERIOD = 0
# Refused assertions (401 at the token and provisioning routes): a device with a wrong clock or
# key refused once a minute is a handful; more than one a second for 5 minutes is a fleet
# misconfigured at once (a key rotated on the service, not on the devices) or someone guessing.
ASSERTIONS_REFUSED_PER_PERIOD = 300
# Refused provisionings (an enrollment ended or full, an id its pattern refuses, a device that
# exists): a factory line's devices failing to provision; any one is worth a look.
PROVISIONINGS_REFUSED_PER_PERIOD = 0
# Secrets the sealing key could not open or seal (KMS throttled, failing or unreachable): the
# devices with secrets and every provisioning got 429 or 503.
SEALING_FAILURES_PER_PERIOD = 0
DYNAMODB_THROTTLES_PER_PERIOD = 0
# The change feed (docs/operations.md, the runbook): the feed trails writes by the stream
# processor's iterator age; a minute means followers see changes a minute late.
FEED_ITERATOR_AGE_MS = 60_000
FEED_FAILURES_VISIBLE = 0  # any record on the on-failure queue is a change the feed could not record
FEED_PROCESSOR_ERRORS_PER_PERIOD = 0  # a whole invocation failed (records are retried, the feed stalls)
# A version the processor marked lost (its change failed every try, or DynamoDB refuses it for good):
# followers get 410 there. The invocation succeeds and the queue stays empty, so only this says so.
FEED_CHANGES_LOST_PER_PERIOD = 0
DYNAMODB_SYSTEM_ERRORS_PER_PERIOD = 0
# Push (infra/push.py): subscribers get a change the fan-out's iterator age after the change feed
# recorded it; a minute late is as late as the feed may be.
FANOUT_ITERATOR_AGE_MS = 60_000
FANOUT_FAILURES_VISIBLE = 0  # any batch on its queue: subscribers of its devices missed a change's push
FANOUT_ERRORS_PER_PERIOD = 0  # a whole invocation failed (its batch is retried, pushes are late)
PUSH_ERRORS_PER_PERIOD = 0  # a connect, subscribe or disconnect crashed
# The fleet index's backfill (infra/reindex.py): any failed invocation is a page Lambda retries
# twice; after that the job's chain stops and queries on the new fields answer IndexBuilding.
REINDEX_ERRORS_PER_PERIOD = 0
# Jobs (infra/jobs.py): a runner invocation that failed (its job is taken up again by the schedule,
# the devices' marks keep every write single), and executions of jobs due with no runner at them
# for over five minutes (the schedule or the runner is failing: the jobs stand still).
JOB_ERRORS_PER_PERIOD = 0
JOB_STUCK_EXECUTIONS = 0
# What CloudWatch needs of the alarm topic's key to publish to it.
CLOUDWATCH_KEY_ACTIONS = ("kms:Decrypt", "kms:GenerateDataKey*")
# The operations the function calls, for DynamoDB's per-operation metrics (their Operation dimension).
DYNAMODB_OPERATIONS = ("GetItem", "PutItem", "UpdateItem", "DeleteItem", "Scan", "Query", "BatchGetItem",
                       "TransactWriteItems")


def service_metric(name: str, statistic: str = "Sum") -> cloudwatch.Metric:
    """One of the service's own metrics (as Powertools emits them)."""
    return cloudwatch.Metric(namespace=names.NAMESPACE, metric_name=name, dimensions_map=names.DIMENSIONS,
                             statistic=statistic, period=PERIOD)


def per_operation_sum(table: dynamodb.ITable, metric_name: str, label: str) -> cloudwatch.MathExpression:
    """A DynamoDB metric summed over the operations the code uses. DynamoDB publishes a series
    only for an operation that had one, and a sum with a series missing in a period is none
    (the table's own ``metric_..._for_operations`` sum them bare): each missing one counts as 0,
    so one operation throttled alone still fires the alarm."""
    metrics = {f"op{index}": table.metric(metric_name, statistic="Sum", period=PERIOD,
                                           dimensions_map={"TableName": table.table_name, "Operation": operation})
               for index, operation in enumerate(DYNAMODB_OPERATIONS)}
    return cloudwatch.MathExpression(expression=" + ".join(f"FILL({name}, 0)" for name in metrics),
                                     using_metrics=metrics, label=label, period=PERIOD)


class Monitoring(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, table: dynamodb.ITable,
                 function: lambda_.IFunction, api: apigatewayv2.HttpApi, alarm_email: str | None = None,
                 change_feed=None, authorizer: lambda_.IFunction | None = None,
                 waiting_function: lambda_.IFunction | None = None, push=None,
                 reindex: lambda_.IFunction | None = None, jobs: lambda_.IFunction | None = None):
        super().__init__(scope, construct_id)
        # CloudWatch can publish to an encrypted topic only if the key's policy lets it use the
        # key; the AWS-managed alias/aws/sns key's policy cannot be changed, so the topic gets
        # its own customer-managed key (about 1 USD a month) that grants cloudwatch.amazonaws.com.
        self.key = kms.Key(self, "AlarmTopicKey", enable_key_rotation=True,
                           description="Encrypts the device-state alarm topic; CloudWatch may use it")
        self.key.add_to_resource_policy(iam.PolicyStatement(
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=list(CLOUDWATCH_KEY_ACTIONS), resources=["*"]))
        self.topic = sns.Topic(self, "AlarmTopic", display_name="Device-state alarms", master_key=self.key)
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            effect=iam.Effect.DENY, actions=["sns:Publish"], principals=[iam.AnyPrincipal()],
            resources=[self.topic.topic_arn], conditions={"Bool": {"aws:SecureTransport": "false"}}))
        if alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(alarm_email))

        updates = service_metric(names.UPDATES)
        conflicts = service_metric(names.VERSION_CONFLICTS)
        conflicts_per_update = cloudwatch.MathExpression(
            expression="IF(updates > 0, conflicts / updates, 0)",
            using_metrics={"updates": updates, "conflicts": conflicts},
            label="Version conflicts per successful update", period=PERIOD)
        not_breaching = cloudwatch.TreatMissingData.NOT_BREACHING  # no traffic is not a fault

        self.alarms: dict[str, cloudwatch.Alarm] = {}
        self._alarm("ConditionalCheckFailed", table.metric_conditional_check_failed_requests(
            statistic="Sum", period=PERIOD), CONDITIONAL_CHECK_FAILED_PER_PERIOD, not_breaching,
            "DynamoDB refused more conditional writes than usual: heavy contention or clients on stale ETags")
        self._alarm("RetriesExhausted", service_metric(names.RETRIES_EXHAUSTED), RETRIES_EXHAUSTED_PER_PERIOD,
                    not_breaching, "PATCHes gave up under contention and answered 503")
        self._alarm("OutcomeUnknown", service_metric(names.OUTCOME_UNKNOWN), OUTCOME_UNKNOWN_PER_PERIOD,
                    not_breaching, "Writes answered 504 outcome-unknown: DynamoDB's answers were lost and could "
                                   "not be settled")
        self._alarm("RetryRate", conflicts_per_update, CONFLICTS_PER_UPDATE, not_breaching,
                    "More than one version conflict per two successful updates, sustained",
                    evaluation_periods=RETRY_RATE_EVALUATION_PERIODS)
        self._alarm("TransactionConflict", cloudwatch.Metric(
            namespace="AWS/DynamoDB", metric_name="TransactionConflict", dimensions_map={"TableName": table.table_name},
            statistic="Sum", period=PERIOD), TRANSACTION_CONFLICTS_PER_PERIOD, not_breaching,
            "Transactions keep colliding on the same devices (DynamoDB TransactionConflict)")
        self._alarm("LeaseHeartbeatsLost", service_metric(names.LEASE_HEARTBEATS_LOST),
                    LEASE_HEARTBEATS_LOST_PER_PERIOD, not_breaching,
                    "A lease holder's heartbeat was refused: its lease expired mid-job")
        self._alarm("SigningUnavailable", service_metric(names.SIGNING_UNAVAILABLE), SIGNING_UNAVAILABLE_PER_PERIOD,
                    not_breaching, "Devices asking for a token got 503: the signing key (KMS) failed or did not answer")
        self._alarm("AssertionsRefused", service_metric(names.ASSERTIONS_REFUSED), ASSERTIONS_REFUSED_PER_PERIOD,
                    not_breaching, "Devices' assertions were refused (401) more than once a second: a fleet with a "
                                   "wrong key or clock, or someone guessing credentials")
        self._alarm("ProvisioningsRefused", service_metric(names.PROVISIONINGS_REFUSED),
                    PROVISIONINGS_REFUSED_PER_PERIOD, not_breaching,
                    "Devices could not provision themselves: an enrollment ended or full, an id its pattern refuses, "
                    "or a device of that id exists")
        self._alarm("SealingFailures", service_metric(names.SEALING_FAILURES), SEALING_FAILURES_PER_PERIOD,
                    not_breaching, "Secrets could not be opened or sealed (KMS throttled or failing): devices with "
                                   "secrets and provisionings got 429 or 503")
        self._alarm("LambdaErrors", function.metric_errors(statistic="Sum", period=PERIOD),
                    LAMBDA_ERRORS_PER_PERIOD, not_breaching, "The API function failed (not a 4xx: a crash)")
        self._alarm("LambdaThrottles", function.metric_throttles(statistic="Sum", period=PERIOD),
                    LAMBDA_THROTTLES_PER_PERIOD, not_breaching, "Lambda refused invocations (concurrency)")
        self._alarm("Api5xx", api.metric_server_error(statistic="Sum", period=PERIOD), API_5XX_PER_PERIOD,
                    not_breaching, "The API answered 5xx")
        self._alarm("ApiLatencyP99", function.metric_duration(statistic="p99", period=PERIOD), API_P99_LATENCY_MS,
                    not_breaching, "p99 duration of the API function (every route but the waiting ones) is high")
        self._alarm("DynamoDbThrottles", per_operation_sum(table, "ThrottledRequests", "DynamoDB throttled requests"),
                    DYNAMODB_THROTTLES_PER_PERIOD, not_breaching,
                    "DynamoDB throttled requests, on demand or provisioned (the library sends each again twice: "
                    "users see latency, then 503s)")
        self._alarm("DynamoDbSystemErrors", per_operation_sum(table, "SystemErrors", "DynamoDB system errors"),
                    DYNAMODB_SYSTEM_ERRORS_PER_PERIOD, not_breaching, "DynamoDB answered 5xx")

        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", default_interval=Duration.hours(3))
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Updates and attempts", width=12, left=[
                updates, service_metric(names.UPDATE_ATTEMPTS)]),
            cloudwatch.GraphWidget(title="Contention", width=12, left=[
                conflicts, service_metric(names.RETRIES_EXHAUSTED), service_metric(names.CONDITION_FAILURES),
                service_metric(names.CONTENTION_HOLD, "SampleCount")],
                right=[conflicts_per_update]),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(title="PATCH latency and contention holds (ms)", width=12, left=[
                service_metric(names.PATCH_LATENCY, "p50"), service_metric(names.PATCH_LATENCY, "p99"),
                service_metric(names.CONTENTION_HOLD, "p99")]),
            cloudwatch.GraphWidget(title="DynamoDB and replays", width=12, left=[
                table.metric_conditional_check_failed_requests(statistic="Sum", period=PERIOD)],
                right=[service_metric(names.IDEMPOTENT_REPLAYS), service_metric(names.OUTCOME_UNKNOWN)]),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Transactions", width=12, left=[
                service_metric(names.TRANSACTIONS), service_metric(names.TRANSACTION_RETRIES),
                service_metric(names.TRANSACTION_CONFLICTS)]),
            cloudwatch.GraphWidget(title="DynamoDB request units billed to the API (docs/costs.md)", width=12, left=[
                service_metric(names.READ_UNITS), service_metric(names.WRITE_UNITS)],
                right=[cloudwatch.MathExpression(
                    expression="IF(updates > 0, writes / updates, 0)", label="Write units per successful update",
                    period=PERIOD, using_metrics={"writes": service_metric(names.WRITE_UNITS), "updates": updates})]),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Leases", width=12, left=[
                service_metric(names.LEASES_ACQUIRED), service_metric(names.LEASE_BUSY),
                service_metric(names.LEASES_RECLAIMED), service_metric(names.LEASE_HEARTBEATS_LOST)]),
            cloudwatch.GraphWidget(title="Lease wait (ms)", width=12, left=[
                service_metric(names.LEASE_WAIT, "p50"), service_metric(names.LEASE_WAIT, "p99")]),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Device tokens (POST /devices/{id}/token)", width=12, left=[
                service_metric(names.DEVICE_TOKENS)], right=[
                service_metric(names.SIGNING_THROTTLED), service_metric(names.SIGNING_UNAVAILABLE)]),
            cloudwatch.GraphWidget(title="Device identity: provisioning, refusals and revocations", width=12, left=[
                service_metric(names.PROVISIONINGS), service_metric(names.PROVISIONINGS_REFUSED),
                service_metric(names.ASSERTIONS_REFUSED)], right=[
                service_metric(names.CREDENTIALS_REVOKED), service_metric(names.REVOKED_CREDENTIAL_REQUESTS),
                service_metric(names.SEALING_FAILURES)]),
        )
        if change_feed is not None:
            self._watch_change_feed(change_feed, not_breaching)
        if authorizer is not None:
            self._watch_authorizer(authorizer, not_breaching)
        if waiting_function is not None:
            self._watch_waiting(waiting_function, not_breaching)
        if push is not None:
            self._watch_push(push, not_breaching)
        if reindex is not None:
            self._watch_reindex(reindex, not_breaching)
        if jobs is not None:
            self._watch_jobs(jobs, not_breaching)
        self.dashboard.add_widgets(cloudwatch.AlarmStatusWidget(
            title="Alarms", width=24, alarms=list(self.alarms.values())))

    def _watch_change_feed(self, feed, not_breaching: cloudwatch.TreatMissingData) -> None:
        """Alarms and widgets of the change feed (infra/changes.py)."""
        processor = feed.function
        iterator_age = processor.metric("IteratorAge", statistic="Maximum", period=PERIOD)
        self._alarm("ChangeFeedIteratorAge", iterator_age, FEED_ITERATOR_AGE_MS, not_breaching,
                    "The change feed lags the table by over a minute (stream processor iterator age)")
        self._alarm("ChangeFeedFailures", feed.failures.metric_approximate_number_of_messages_visible(
            statistic="Maximum", period=PERIOD), FEED_FAILURES_VISIBLE, not_breaching,
            "Stream records the processor gave up on are on the on-failure queue: the feed of their devices "
            "stops before them")
        self._alarm("ChangeProcessorErrors", processor.metric_errors(statistic="Sum", period=PERIOD),
                    FEED_PROCESSOR_ERRORS_PER_PERIOD, not_breaching, "The stream processor failed whole batches")
        self._alarm("ChangesLost", service_metric(names.CHANGES_LOST), FEED_CHANGES_LOST_PER_PERIOD, not_breaching,
                    "The processor marked versions lost (their change failed every try or DynamoDB refuses it): "
                    "followers of those devices get 410 there")
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Change feed lag (ms)", width=12, left=[
                service_metric(names.CHANGE_LAG, "p50"), service_metric(names.CHANGE_LAG, "p95")],
                right=[iterator_age]),
            cloudwatch.GraphWidget(title="Change throughput", width=12, left=[
                service_metric(names.CHANGES_RECORDED), service_metric(names.CHANGES_LOST)], right=[
                processor.metric_errors(statistic="Sum", period=PERIOD),
                feed.failures.metric_approximate_number_of_messages_visible(statistic="Maximum", period=PERIOD)]),
        )

    def _watch_authorizer(self, authorizer: lambda_.IFunction, not_breaching: cloudwatch.TreatMissingData) -> None:
        """The Lambda authorizer's alarm and widget (infra/api.py; it guards WebSocket connects)."""
        self._alarm("AuthorizerThrottles", authorizer.metric_throttles(statistic="Sum", period=PERIOD),
                    AUTHORIZER_THROTTLES_PER_PERIOD, not_breaching,
                    "Lambda refused authorizer invocations: WebSocket connects failed whatever their credentials")
        self.dashboard.add_widgets(cloudwatch.GraphWidget(
            title="Authorizer (errors include every refused token)", width=24,
            left=[authorizer.metric_invocations(statistic="Sum", period=PERIOD),
                  authorizer.metric_errors(statistic="Sum", period=PERIOD),
                  authorizer.metric_throttles(statistic="Sum", period=PERIOD)],
            right=[authorizer.metric_duration(statistic="p99", period=PERIOD)]))

    def _watch_waiting(self, waiting: lambda_.IFunction, not_breaching: cloudwatch.TreatMissingData) -> None:
        """The waiting function's alarms and widget (infra/api.py, WAITING_ROUTES)."""
        self._alarm("WaitingThrottles", waiting.metric_throttles(statistic="Sum", period=PERIOD),
                    WAITING_THROTTLES_PER_PERIOD, not_breaching,
                    "Long-polls or lease requests were refused (500): more clients waited at once than the waiting "
                    "function's reserved concurrency")
        # Its crashes were LambdaErrors' when these routes ran in the API function.
        self._alarm("WaitingErrors", waiting.metric_errors(statistic="Sum", period=PERIOD), LAMBDA_ERRORS_PER_PERIOD,
                    not_breaching, "The waiting function failed (not a 4xx: a crash)")
        self.dashboard.add_widgets(cloudwatch.GraphWidget(
            title="Waiting requests (long-polls, lease waits)", width=24,
            left=[waiting.metric("ConcurrentExecutions", statistic="Maximum", period=PERIOD)],
            right=[waiting.metric_throttles(statistic="Sum", period=PERIOD),
                   waiting.metric_errors(statistic="Sum", period=PERIOD)]))

    def _watch_push(self, push, not_breaching: cloudwatch.TreatMissingData) -> None:
        """Alarms and widgets of push (infra/push.py): the WebSocket routes' function and the fan-out."""
        fanout, function = push.fanout, push.function
        iterator_age = fanout.metric("IteratorAge", statistic="Maximum", period=PERIOD)
        queued = push.failures.metric_approximate_number_of_messages_visible(statistic="Maximum", period=PERIOD)
        self._alarm("FanOutIteratorAge", iterator_age, FANOUT_ITERATOR_AGE_MS, not_breaching,
                    "The fan-out lags the change feed by over a minute: WebSocket subscribers get changes late")
        self._alarm("FanOutFailures", queued, FANOUT_FAILURES_VISIBLE, not_breaching,
                    "Stream records the fan-out gave up on are on its on-failure queue: subscribers of their devices "
                    "were not sent those changes (they get them with the device's next change or a new subscribe)")
        self._alarm("FanOutErrors", fanout.metric_errors(statistic="Sum", period=PERIOD), FANOUT_ERRORS_PER_PERIOD,
                    not_breaching, "The fan-out failed whole batches")
        self._alarm("PushErrors", function.metric_errors(statistic="Sum", period=PERIOD), PUSH_ERRORS_PER_PERIOD,
                    not_breaching, "The WebSocket routes' function failed (a crash, not an error message)")
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Push: WebSocket", width=12, left=[
                push.api.metric("ConnectCount", statistic="Sum", period=PERIOD),
                push.api.metric("MessageCount", statistic="Sum", period=PERIOD),
                service_metric(names.CONNECTIONS_REFUSED), service_metric(names.CONNECTIONS_FORGOTTEN)], right=[
                function.metric_errors(statistic="Sum", period=PERIOD),
                function.metric_duration(statistic="p99", period=PERIOD)]),
            cloudwatch.GraphWidget(title="Push: fan-out", width=12, left=[iterator_age], right=[
                fanout.metric_errors(statistic="Sum", period=PERIOD), queued]),
        )

    def _watch_reindex(self, reindex: lambda_.IFunction, not_breaching: cloudwatch.TreatMissingData) -> None:
        """The fleet index's backfill: its alarm and widget (infra/reindex.py)."""
        self._alarm("ReindexErrors", reindex.metric_errors(statistic="Sum", period=PERIOD), REINDEX_ERRORS_PER_PERIOD,
                    not_breaching, "The fleet index's backfill failed (a crash or a timeout): once Lambda's retries "
                                   "fail too its chain stops; invoke it again and it resumes where it stopped")
        self.dashboard.add_widgets(cloudwatch.GraphWidget(
            title="Fleet index backfill", width=24,
            left=[reindex.metric_invocations(statistic="Sum", period=PERIOD),
                  reindex.metric_errors(statistic="Sum", period=PERIOD)],
            right=[reindex.metric_duration(statistic="Maximum", period=PERIOD)]))

    def _watch_jobs(self, runner: lambda_.IFunction, not_breaching: cloudwatch.TreatMissingData) -> None:
        """The job runner: its errors, the executions stuck in jobs no runner took, and the
        executions made final, in one widget (infra/jobs.py)."""
        # A series with no datapoint in a period makes the sum none: a timeout or a crash outside
        # a job's run emits no JobErrors, so each missing one counts as 0.
        errors = cloudwatch.MathExpression(
            expression="FILL(runner, 0) + FILL(steps, 0)", label="Job runner errors", period=PERIOD,
            using_metrics={"runner": runner.metric_errors(statistic="Sum", period=PERIOD),
                           "steps": service_metric(names.JOB_ERRORS)})
        self._alarm("JobErrors", errors, JOB_ERRORS_PER_PERIOD, not_breaching,
                    "A job runner invocation failed: the schedule takes its job up again within a minute; "
                    "the logs of the job runner say why")
        # The schedule counts them every minute, none included: a period without a count is a schedule
        # disabled or failing, or a runner that cannot be invoked, and that is what this alarm is for.
        self._alarm("JobStuckExecutions", service_metric(names.JOB_STUCK_EXECUTIONS, "Maximum"),
                    JOB_STUCK_EXECUTIONS, cloudwatch.TreatMissingData.BREACHING,
                    "Executions sit in jobs due for over five minutes with no runner at them, or the schedule "
                    "did not count them: the job runner or its schedule is failing")
        self.dashboard.add_widgets(cloudwatch.GraphWidget(
            title="Jobs", width=24,
            left=[service_metric(names.JOB_EXECUTIONS_FINAL), service_metric(names.JOB_STUCK_EXECUTIONS, "Maximum")],
            right=[runner.metric_invocations(statistic="Sum", period=PERIOD), errors]))

    def _alarm(self, name: str, metric: cloudwatch.IMetric, threshold: float,
               treat_missing_data: cloudwatch.TreatMissingData, description: str,
               evaluation_periods: int = 1) -> None:
        alarm = cloudwatch.Alarm(
            self, name, metric=metric, threshold=threshold, evaluation_periods=evaluation_periods,
            datapoints_to_alarm=evaluation_periods,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            treat_missing_data=treat_missing_data, alarm_description=description)
        alarm.add_alarm_action(actions.SnsAction(self.topic))
        self.alarms[name] = alarm
