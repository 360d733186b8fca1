"""The CDK stack, checked by property (aws_cdk.assertions), not by resource counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from aws_cdk.assertions import Template

from functions import config
from functions.auth import credentials, device_tokens, sealing
from functions.device_state import metrics as names
from functions.device_state import table as model
from functions.device_state import DEFAULT_BUDGET_SECONDS
from infra import api as api_module
from infra import monitoring
from infra.nag import REVIEWED
from tests.infra.conftest import synth_stack

REPO_ROOT = Path(__file__).resolve().parents[2]


def only(template: Template, resource_type: str, props: dict | None = None) -> tuple[str, dict]:
    found = template.find_resources(resource_type, {"Properties": props} if props else None)
    assert len(found) == 1, f"expected one {resource_type} matching {props}, found {list(found)}"
    return next(iter(found.items()))


def under(template: Template, resource_type: str, construct: str) -> tuple[str, dict]:
    """The one resource of the type within a top-level construct of the stack (its logical id
    starts with the construct's id)."""
    found = {logical: resource for logical, resource in template.find_resources(resource_type).items()
             if logical.startswith(construct)}
    assert len(found) == 1, f"expected one {resource_type} in {construct}, found {list(found)}"
    return next(iter(found.items()))


def api_function(template: Template, construct: str = "Function") -> tuple[str, dict]:
    """The API function, or with construct "WaitingFunction" the waiting function: both run
    api_module.HANDLER, and their construct ids in DeviceApi tell them apart."""
    found = {logical: resource for logical, resource in template.find_resources(
                 "AWS::Lambda::Function", {"Properties": {"Handler": api_module.HANDLER}}).items()
             if re.fullmatch(rf"DeviceApi{construct}[0-9A-F]{{8}}", logical)}
    assert len(found) == 1, f"expected one DeviceApi/{construct}, found {list(found)}"
    return next(iter(found.items()))


# ------------------------------------------------------------------- table


def test_table_keys_ttl_billing_and_recovery(template):
    _, table = only(template, "AWS::DynamoDB::Table")
    props = table["Properties"]
    assert props["KeySchema"] == [{"AttributeName": model.PARTITION_KEY, "KeyType": "HASH"},
                                  {"AttributeName": model.SORT_KEY, "KeyType": "RANGE"}]
    assert sorted(props["AttributeDefinitions"], key=str) == sorted(
        [{"AttributeName": model.PARTITION_KEY, "AttributeType": "S"},
         {"AttributeName": model.SORT_KEY, "AttributeType": "S"}], key=str)
    assert props["TimeToLiveSpecification"] == {"AttributeName": model.TTL_ATTRIBUTE, "Enabled": True}
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["DeletionProtectionEnabled"] is True
    assert table["DeletionPolicy"] == "Retain" and table["UpdateReplacePolicy"] == "Retain"


def test_throwaway_context_makes_a_disposable_table():
    _, stack = synth_stack({"throwaway": "true"})
    _, table = only(Template.from_stack(stack), "AWS::DynamoDB::Table")
    assert table["Properties"]["DeletionProtectionEnabled"] is False
    assert table["DeletionPolicy"] == "Delete"


# ---------------------------------------------------------------- function


def test_function_runtime_architecture_handler(template):
    _, function = api_function(template)
    props = function["Properties"]
    assert props["Runtime"] == "python3.13"
    assert props["Architectures"] == ["arm64"]
    assert props["TracingConfig"] == {"Mode": "Active"}


def test_powertools_layer_is_the_version_requirements_txt_pins_resolved_at_deploy_time(template):
    pins = dict(line.split("#")[0].strip().split("==") for line in
                (REPO_ROOT / "requirements.txt").read_text().splitlines() if "==" in line.split("#")[0])
    version = pins["aws-lambda-powertools[tracer]"]
    _, function = api_function(template)
    [layer] = function["Properties"]["Layers"]
    parameter = layer["Ref"]  # a template parameter, not a literal ARN
    declared = template.to_json()["Parameters"][parameter]
    assert declared["Type"] == "AWS::SSM::Parameter::Value<String>"  # CloudFormation reads SSM at deploy
    assert declared["Default"] == f"/aws/service/powertools/python/arm64/python3.13/{version}"


def test_timeout_exceeds_the_retry_budget_and_the_lease_wait_and_stays_under_api_gateways(template):
    from functions.api import handler
    from localdev import http_front

    _, function = api_function(template)
    timeout = function["Properties"]["Timeout"]
    assert DEFAULT_BUDGET_SECONDS + 2 <= timeout < 29
    assert config.MAX_BUDGET_SECONDS < 29
    assert handler.MAX_LEASE_WAIT_SECONDS + handler.RESPONSE_MARGIN_SECONDS < timeout
    assert http_front.LAMBDA_TIMEOUT_SECONDS == timeout  # make serve caps waits as Lambda does


def test_environment_is_exactly_what_the_config_reads(template):
    _, function = api_function(template)
    environment = function["Properties"]["Environment"]["Variables"]
    ours = {name for name in environment if not name.startswith("POWERTOOLS_")}
    # FLEET_INDEX is opt-in: set only when context fleetIndex declares a field (test_fleet_index_stack.py).
    # The signing and sealing variables name the KMS keys (no key file, no kid: those are make serve's).
    signing = set(device_tokens.ISSUING_VARIABLES) - {device_tokens.DEVICE_TOKEN_KEY_FILE,
                                                      device_tokens.DEVICE_TOKEN_KID} | {sealing.SEALING_KMS_KEY}
    assert ours == (set(config.API_VARIABLES) - {config.DYNAMODB_ENDPOINT, config.FLEET_INDEX}
                    | set(credentials.VARIABLES) | set(credentials.DEVICE_TOKEN_VARIABLES) | signing)
    table_id = next(iter(template.find_resources("AWS::DynamoDB::Table")))
    assert environment[config.TABLE_NAME] == {"Ref": table_id}
    assert environment["POWERTOOLS_METRICS_NAMESPACE"] == names.NAMESPACE
    assert environment["POWERTOOLS_SERVICE_NAME"] == names.SERVICE
    deployed = config.ApiConfig.from_environment({k: v for k, v in environment.items() if isinstance(v, str)}
                                              | {config.TABLE_NAME: "t", config.CURSOR_KEY: "k" * 64})
    assert deployed.require_if_match is False


def test_log_retention_is_set(template):
    """Every function logs to a group of its own kept 30 days (a function without one logs to
    a group Lambda makes, kept forever)."""
    groups = template.find_resources("AWS::Logs::LogGroup")
    assert groups and all(group["Properties"]["RetentionInDays"] == 30 for group in groups.values())
    functions = template.find_resources("AWS::Lambda::Function")
    without = [logical for logical, function in functions.items()
               if function["Properties"].get("LoggingConfig", {}).get("LogGroup", {}).get("Ref") not in groups]
    assert not without


def test_role_allows_exactly_the_dynamodb_actions_the_code_calls_on_this_table(template):
    table_id = next(iter(template.find_resources("AWS::DynamoDB::Table")))
    _, function = api_function(template)
    api_role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    dynamodb_statements = []
    for policy in template.find_resources("AWS::IAM::Policy").values():
        if {"Ref": api_role} not in policy["Properties"]["Roles"]:
            continue  # the stream processor's role is checked in test_changes_stack.py
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if any(action.startswith("dynamodb:") for action in actions):
                dynamodb_statements.append(statement)
    assert len(dynamodb_statements) == 1
    statement = dynamodb_statements[0]
    assert sorted(statement["Action"]) == sorted(api_module.DYNAMODB_ACTIONS)
    assert statement["Effect"] == "Allow"
    assert statement["Resource"] == {"Fn::GetAtt": [table_id, "Arn"]}


def test_the_library_calls_no_dynamodb_action_the_role_lacks():
    import re
    from pathlib import Path

    library = Path(__file__).resolve().parents[2] / "functions" / "device_state"
    source = "\n".join(path.read_text() for path in sorted(library.rglob("*.py")))
    called = set(re.findall(r'send\(\s*"([a-z_]+)"', source))  # every request goes through Store.send
    # IAM has no TransactWriteItems action: each action inside is authorised as the
    # PutItem / UpdateItem / DeleteItem / ConditionCheckItem it is.
    assert "transact_write_items" in called and '"ConditionCheck"' in source
    called.discard("transact_write_items")
    allowed = {"".join(part.capitalize() for part in name.split("_")) for name in called} | {"ConditionCheckItem"}
    assert {f"dynamodb:{name}" for name in allowed} == set(api_module.DYNAMODB_ACTIONS)


# --------------------------------------------------------------------- API


def test_every_route_is_a_lambda_proxy_integration_of_the_rest_apis_event(template):
    from tests.infra.test_auth_stack import http_routes

    routes = http_routes(template)
    assert routes
    integrations = template.find_resources("AWS::ApiGatewayV2::Integration", {"Properties": {
        "PayloadFormatVersion": "1.0"}})
    assert all(integration["Properties"]["IntegrationType"] == "AWS_PROXY" for integration in integrations.values())
    assert {props["PayloadFormatVersion"] for props in routes.values()} == {"1.0"}


def test_every_waiting_get_route_answers_head_too(template):
    from tests.infra.test_auth_stack import http_routes

    keys = set(http_routes(template))
    for key in keys:
        if key.startswith("GET "):
            assert "HEAD " + key.removeprefix("GET ") in keys, key


def test_stage_throttling_and_json_access_logs_from_context():
    _, stack = synth_stack({"throttleRateLimit": 42, "throttleBurstLimit": 84})
    _, stage = under(Template.from_stack(stack), "AWS::ApiGatewayV2::Stage", "DeviceApi")
    assert stage["Properties"]["StageName"] == "$default" and stage["Properties"]["AutoDeploy"] is True
    assert stage["Properties"]["DefaultRouteSettings"] == {"ThrottlingRateLimit": 42, "ThrottlingBurstLimit": 84}
    access = stage["Properties"]["AccessLogSettings"]
    assert json.loads(access["Format"])["requestId"] == "$context.requestId"


def test_the_outputs_are_the_api_urls_and_how_back_ends_get_tokens(template):
    from infra import auth, console, push

    outputs = template.find_outputs("*")
    assert sorted(outputs) == sorted([api_module.OUTPUT_NAME, auth.USER_POOL_OUTPUT, auth.CLIENT_OUTPUT,
                                      auth.TOKEN_ENDPOINT_OUTPUT, push.URL_OUTPUT, console.URL_OUTPUT,
                                      console.CLIENT_OUTPUT])
    assert api_module.OUTPUT_NAME == "Url"
    assert "execute-api" in json.dumps(outputs["Url"]["Value"])


def test_reserved_concurrency_defaults_to_a_cap_and_follows_context(template):
    from infra.stack import CONTEXT_DEFAULTS

    _, function = api_function(template)
    default = function["Properties"]["ReservedConcurrentExecutions"]
    assert default == CONTEXT_DEFAULTS["reservedConcurrency"] == 100
    for value, expected in ((250, 250), ("40", 40)):
        _, stack = synth_stack({"reservedConcurrency": value})
        _, function = api_function(Template.from_stack(stack))
        assert function["Properties"]["ReservedConcurrentExecutions"] == expected
    _, stack = synth_stack({"reservedConcurrency": "none"})
    _, function = api_function(Template.from_stack(stack))
    assert "ReservedConcurrentExecutions" not in function["Properties"]


def test_cdk_json_context_matches_the_code_defaults_and_runs_the_venv_python():
    from infra.stack import CONTEXT_DEFAULTS

    cdk_json = json.loads((REPO_ROOT / "cdk.json").read_text())
    context = {key: value for key, value in cdk_json["context"].items() if not key.startswith("@")}
    assert context == CONTEXT_DEFAULTS
    assert cdk_json["app"].split()[0] == ".venv/bin/python"  # plain `npx cdk` finds aws_cdk


def test_every_context_value_the_stack_reads_is_in_the_operations_table():
    import re

    from infra.stack import CONTEXT_DEFAULTS

    source = "\n".join(path.read_text() for path in (REPO_ROOT / "infra").glob("*.py"))
    read = set(CONTEXT_DEFAULTS) | set(re.findall(r'try_get_context\("(\w+)"\)', source))
    operations = (REPO_ROOT / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"^\| `(\w+)`(?: / `(\w+)`)? \|", operations, re.MULTILINE))
    documented = {name for pair in documented for name in pair if name}
    assert read - documented == set(), "context values missing from docs/operations.md's table"


# ------------------------------------------------------------------ alarms


def alarms(template) -> dict:
    return {logical: resource["Properties"] for logical, resource in
            template.find_resources("AWS::CloudWatch::Alarm").items()}


def alarm_named(template, name) -> dict:
    matches = [props for logical, props in alarms(template).items() if logical.startswith(f"Monitoring{name}")]
    assert len(matches) == 1, name
    return matches[0]


def missing_data_as(props: dict) -> str:
    """How an alarm treats missing data: no traffic is no fault, but the one alarm on a count the
    schedule makes every minute is missed by a count not made (the schedule stopped)."""
    return "breaching" if props.get("MetricName") == names.JOB_STUCK_EXECUTIONS else "notBreaching"


def test_every_alarm_notifies_the_topic_and_treats_missing_data_deliberately(template):
    topic_id = next(iter(template.find_resources("AWS::SNS::Topic")))
    for props in alarms(template).values():
        assert props["AlarmActions"] == [{"Ref": topic_id}]
        assert props["TreatMissingData"] == missing_data_as(props)
        assert props["AlarmDescription"]


@pytest.mark.parametrize("name, namespace, metric, statistic, threshold, dimension", [
    ("ConditionalCheckFailed", "AWS/DynamoDB", "ConditionalCheckFailedRequests", "Sum",
     monitoring.CONDITIONAL_CHECK_FAILED_PER_PERIOD, "TableName"),
    ("RetriesExhausted", names.NAMESPACE, names.RETRIES_EXHAUSTED, "Sum", monitoring.RETRIES_EXHAUSTED_PER_PERIOD,
     "service"),
    ("LambdaErrors", "AWS/Lambda", "Errors", "Sum", monitoring.LAMBDA_ERRORS_PER_PERIOD, "FunctionName"),
    ("LambdaThrottles", "AWS/Lambda", "Throttles", "Sum", monitoring.LAMBDA_THROTTLES_PER_PERIOD, "FunctionName"),
    ("Api5xx", "AWS/ApiGateway", "5xx", "Sum", monitoring.API_5XX_PER_PERIOD, "ApiId"),
    ("TransactionConflict", "AWS/DynamoDB", "TransactionConflict", "Sum",
     monitoring.TRANSACTION_CONFLICTS_PER_PERIOD, "TableName"),
])
def test_single_metric_alarms(template, name, namespace, metric, statistic, threshold, dimension):
    props = alarm_named(template, name)
    assert props["Namespace"] == namespace and props["MetricName"] == metric
    assert props["Statistic"] == statistic and props["Threshold"] == threshold
    assert props["Period"] == 300
    assert [d["Name"] for d in props["Dimensions"]] == [dimension]
    assert props["ComparisonOperator"] == "GreaterThanThreshold"


def test_retries_exhausted_alarm_names_the_service_dimension(template):
    props = alarm_named(template, "RetriesExhausted")
    assert props["Dimensions"] == [{"Name": name, "Value": value} for name, value in names.DIMENSIONS.items()]


def test_latency_alarm_is_the_api_functions_p99_duration_which_no_waiting_route_reaches(template):
    # The HTTP API's Latency takes in the long-polls and lease waits, which answer when their wait
    # ends (up to 20 s): 1 % of them held the p99 above the threshold for good.
    props = alarm_named(template, "ApiLatencyP99")
    assert props["ExtendedStatistic"] == "p99" and props["Threshold"] == monitoring.API_P99_LATENCY_MS
    logical, _ = api_function(template)
    assert props["Namespace"] == "AWS/Lambda" and props["MetricName"] == "Duration"
    assert props["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": logical}}]


def test_retry_rate_alarm_is_metric_math_over_the_service_metrics(template):
    props = alarm_named(template, "RetryRate")
    expression = next(m for m in props["Metrics"] if "Expression" in m)
    assert "conflicts / updates" in expression["Expression"]
    stats = {m["Id"]: m["MetricStat"] for m in props["Metrics"] if "MetricStat" in m}
    assert stats["updates"]["Metric"]["MetricName"] == names.UPDATES
    assert stats["conflicts"]["Metric"]["MetricName"] == names.VERSION_CONFLICTS
    assert all(stat["Metric"]["Namespace"] == names.NAMESPACE for stat in stats.values())
    assert props["Threshold"] == monitoring.CONFLICTS_PER_UPDATE
    assert props["EvaluationPeriods"] == monitoring.RETRY_RATE_EVALUATION_PERIODS


@pytest.mark.parametrize("name, metric", [("DynamoDbThrottles", "ThrottledRequests"),
                                          ("DynamoDbSystemErrors", "SystemErrors")])
def test_dynamodb_fault_alarms_cover_every_operation_the_code_uses(template, name, metric):
    props = alarm_named(template, name)
    stats = [m["MetricStat"]["Metric"] for m in props["Metrics"] if "MetricStat" in m]
    assert {s["MetricName"] for s in stats} == {metric}
    operations = {d["Value"] for s in stats for d in s["Dimensions"] if d["Name"] == "Operation"}
    called = {action.split(":")[1] for action in api_module.DYNAMODB_ACTIONS} - {"ConditionCheckItem"}
    assert operations == called | {"TransactWriteItems"}
    # DynamoDB publishes an operation's series only when it had one: each missing one counts as 0,
    # or a period where one operation alone was throttled sums to nothing and the alarm stays quiet.
    [total] = [metric["Expression"] for metric in props["Metrics"] if "Expression" in metric]
    ids = [metric["Id"] for metric in props["Metrics"] if "MetricStat" in metric]
    assert sorted(term.strip() for term in total.split("+")) == sorted(f"FILL({id_}, 0)" for id_ in ids)


def test_cloudwatch_may_use_the_alarm_topics_customer_managed_key(template):
    key_id, key = under(template, "AWS::KMS::Key", "Monitoring")
    assert key["Properties"]["EnableKeyRotation"] is True
    _, topic = only(template, "AWS::SNS::Topic")
    assert topic["Properties"]["KmsMasterKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    grants = [statement for statement in key["Properties"]["KeyPolicy"]["Statement"]
              if statement.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    assert len(grants) == 1 and grants[0]["Effect"] == "Allow"
    actions = grants[0]["Action"] if isinstance(grants[0]["Action"], list) else [grants[0]["Action"]]
    assert {"kms:Decrypt", "kms:GenerateDataKey*"} <= set(actions)


def test_alarm_email_subscription_from_context():
    _, stack = synth_stack({"alarmEmail": "ops@example.com"})
    _, subscription = only(Template.from_stack(stack), "AWS::SNS::Subscription")
    assert subscription["Properties"]["Protocol"] == "email"
    assert subscription["Properties"]["Endpoint"] == "ops@example.com"


# ------------------------------------------------------ metric contract


def custom_metrics_in(value) -> set[str]:
    """Metric names used under the service's namespace anywhere in a template value."""
    found = set()
    if isinstance(value, dict):
        if value.get("Namespace") == names.NAMESPACE and "MetricName" in value:
            found.add(value["MetricName"])
        for member in value.values():
            found |= custom_metrics_in(member)
    elif isinstance(value, list):
        for member in value:
            found |= custom_metrics_in(member)
    return found


def test_every_alarmed_custom_metric_is_one_the_code_emits(template):
    alarmed = custom_metrics_in(alarms(template))
    assert alarmed and alarmed <= set(names.ALL_METRICS)


def test_every_metric_the_code_emits_is_on_the_dashboard(template):
    _, dashboard = only(template, "AWS::CloudWatch::Dashboard")
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    for metric in names.ALL_METRICS:
        assert f'\\"{names.NAMESPACE}\\",\\"{metric}\\"' in body, metric


# ------------------------------------------------------------------- nag


def test_cdk_nag_aws_solutions_has_no_unacknowledged_finding():
    app, _ = synth_stack(nag=True)
    app.synth()  # a policy-validation failure raises here


def test_cdk_nag_would_fail_without_the_acknowledgements():
    import aws_cdk as cdk

    from infra.nag import add_checks
    from infra.stack import DeviceStateStack
    from tests.infra.conftest import NO_BUNDLING

    app = cdk.App(context=NO_BUNDLING)
    DeviceStateStack(app, "DeviceStateStack")
    add_checks(app)
    with pytest.raises(Exception, match="(?i)validation"):
        app.synth()


def test_every_acknowledgement_carries_a_reason():
    assert REVIEWED
    for finding, reason in REVIEWED:
        assert finding.startswith("AwsSolutions::AwsSolutions-")
        assert len(reason) > 40


@pytest.mark.parametrize(("name", "value"), [
    ("requireRegisteredCredentials", "yes"), ("console", "1"), ("snapStart", "on"),
    ("reservedConcurrency", 0), ("waitingReservedConcurrency", "-1"), ("throttleRateLimit", "-5"),
    ("throttleRateLimit", "abc"), ("throttleBurstLimit", "0"), ("deviceTokenSeconds", "1h"),
    ("throttleRateLimit", "inf"), ("reservedConcurrency", 1.5), ("throttleBurstLimit", "2.5"),
])
def test_a_context_value_the_stack_cannot_read_stops_the_synth_naming_it(name, value):
    """A flag read as false unless exactly "true" turned a security flag off on a "yes" and a
    default-on one off; a reserved concurrency of 0 throttled every request; "abc" failed bare."""
    with pytest.raises(ValueError, match=rf"context {name}: {value!r}"):
        synth_stack({name: value})


def test_flags_read_true_and_false_in_any_case_and_as_json_booleans():
    from aws_cdk import App

    from infra.stack import _flag

    for value, expected in ((True, True), ("TRUE", True), ("true", True), (False, False), ("False", False)):
        app = App(context={"requireIfMatch": value})
        assert _flag(app, "requireIfMatch") is expected


def test_the_idle_inventory_in_costs_md_counts_what_the_template_creates(template):
    """docs/costs.md prices what a deployed stack holds idle; its counts drifted (23 alarms and ten
    log groups against 28 and 14, a KMS key and the cursor secret left out)."""
    text = re.sub(r"\s+", " ", (REPO_ROOT / "docs" / "costs.md").read_text())
    inventory = text[text.index("## What `make deploy` creates and costs idle"):]
    counted = {"CloudWatch alarms": "AWS::CloudWatch::Alarm", "log groups with retention": "AWS::Logs::LogGroup"}
    for words, kind in counted.items():
        assert f"{len(template.find_resources(kind))} {words}" in inventory, words
    spelled = {"three KMS keys": "AWS::KMS::Key", "a Secrets Manager secret": "AWS::SecretsManager::Secret",
               "two SQS on-failure queues": "AWS::SQS::Queue"}
    numbers = {"a": 1, "two": 2, "three": 3}
    for words, kind in spelled.items():
        assert words in inventory and numbers[words.split()[0]] == len(template.find_resources(kind)), words
