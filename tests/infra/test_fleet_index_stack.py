"""The fleet index in the CDK stack (context ``fleetIndex``): one keys-only index per declared
field on the table, exactly as the library defines them; the API functions' FLEET_INDEX and
their right to query those indexes; the reindex function (the backfill), its rights, alarm
and output; and none of it without the context. One stack is synthesized with four fields
(and cdk-nag's checks) for the whole module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk.assertions import Template

from functions import config
from functions.auth import credentials, sealing
from functions.device_state import FleetIndex
from functions.device_state import table as model
from functions.auth import device_tokens
from infra import api as api_module
from infra import monitoring
from infra import jobs as jobs_module
from infra import reindex
from tests.infra.conftest import synth_stack
from tests.infra.test_auth_stack import http_routes
from tests.infra.test_push_stack import PUSH_HANDLERS, actions, statements_of
from tests.infra.test_snapstart import alias_of, function_of
from tests.infra.test_stack import REPO_ROOT, alarm_named, alarms, api_function, missing_data_as, only

FLEET = "reported/firmware:string,reported/online:boolean,reported/battery:number,state/site:string"
FLEET_INDEX = FleetIndex.parse(FLEET)


@pytest.fixture(scope="module")
def fleet_app():
    return synth_stack({"fleetIndex": FLEET}, nag=True)


@pytest.fixture(scope="module")
def fleet_assembly(fleet_app):
    app, _ = fleet_app
    return app.synth()  # cdk-nag's checks run here: an unacknowledged finding raises


@pytest.fixture(scope="module")
def fleet(fleet_app, fleet_assembly) -> Template:
    return Template.from_stack(fleet_app[1])


def reindex_function(template: Template) -> tuple[str, dict]:
    return only(template, "AWS::Lambda::Function", {"Handler": reindex.HANDLER})


# ------------------------------------------------------------------ without the context


def test_without_the_context_there_is_no_index_no_reindex_function_and_no_fleet_index_variable(template):
    from infra.stack import CONTEXT_DEFAULTS

    assert CONTEXT_DEFAULTS["fleetIndex"] == ""
    _, table = only(template, "AWS::DynamoDB::Table")
    assert "GlobalSecondaryIndexes" not in table["Properties"]
    assert not template.find_resources("AWS::Lambda::Function", {"Properties": {"Handler": reindex.HANDLER}})
    assert not [logical for logical in alarms(template) if logical.startswith("MonitoringReindex")]
    assert reindex.OUTPUT_NAME not in template.find_outputs("*")
    for construct in ("Function", "WaitingFunction"):
        _, function = api_function(template, construct)
        assert config.FLEET_INDEX not in function["Properties"]["Environment"]["Variables"]
        assert not [s for s in statements_of(template, function) if "/index/" in json.dumps(s["Resource"])]


# ------------------------------------------------------------------------- the table


def test_the_table_has_exactly_the_librarys_keys_only_index_per_declared_field(fleet):
    _, table = only(fleet, "AWS::DynamoDB::Table")
    props = table["Properties"]
    expected = FLEET_INDEX.global_secondary_indexes()
    assert len(expected) == 4
    assert sorted(props["GlobalSecondaryIndexes"], key=lambda index: index["IndexName"]) == sorted(
        expected, key=lambda index: index["IndexName"])  # names, keys, KEYS_ONLY; no throughput (on demand)
    assert all(index["Projection"] == {"ProjectionType": "KEYS_ONLY"} for index in props["GlobalSecondaryIndexes"])
    assert sorted(props["AttributeDefinitions"], key=str) == sorted(
        [{"AttributeName": model.PARTITION_KEY, "AttributeType": "S"},
         {"AttributeName": model.SORT_KEY, "AttributeType": "S"}, *FLEET_INDEX.attribute_definitions()], key=str)
    types = {d["AttributeName"]: d["AttributeType"] for d in props["AttributeDefinitions"]}
    assert [types[f.attribute] for f in FLEET_INDEX.fields] == ["S", "N", "N", "S"]  # a boolean is stored as 0/1
    assert types["ixShard"] == "N"
    assert props["KeySchema"] == [{"AttributeName": model.PARTITION_KEY, "KeyType": "HASH"},
                                  {"AttributeName": model.SORT_KEY, "KeyType": "RANGE"}]


@pytest.mark.parametrize("declaration, message", [
    ("reported/firmware:text", r"'reported/firmware:text': declare a field as path:type"),
    ("firmware:string", r"'firmware': a path starts with state/, desired/, reported/ or connectivity/"),
    ("connectivity/since:string", r"'connectivity/since': of connectivity, only connectivity/connected:boolean"),
    ("reported/online:boolean,reported/online:number", r"'reported/online' is declared twice"),
    (",".join(f"reported/f{n}:number" for n in range(11)), r"at most 10 fields can be declared, not 11"),
])
def test_an_invalid_declaration_fails_synthesis_with_the_parsers_message(declaration, message):
    with pytest.raises(ValueError, match=r"^context fleetIndex: " + message):
        synth_stack({"fleetIndex": declaration})


# ------------------------------------------------------------------ the API functions


@pytest.mark.parametrize("construct", ["Function", "WaitingFunction"])
def test_the_api_functions_read_the_normalized_declaration(fleet, construct):
    _, function = api_function(fleet, construct)
    environment = function["Properties"]["Environment"]["Variables"]
    assert environment[config.FLEET_INDEX] == FLEET_INDEX.declaration == FLEET
    tokens = (set(credentials.DEVICE_TOKEN_VARIABLES) | set(device_tokens.ISSUING_VARIABLES)
              | set(sealing.VARIABLES))  # test_stack's
    ours = {name for name in environment if not name.startswith("POWERTOOLS_") and name not in tokens}
    # NEVER_WAIT: the API function's alone (test_waiting_stack.py)
    assert ours - {config.NEVER_WAIT} == set(config.API_VARIABLES) - {config.DYNAMODB_ENDPOINT,
                                                                     config.NEVER_WAIT} | set(credentials.VARIABLES)
    deployed = config.ApiConfig.from_environment({k: v for k, v in environment.items() if isinstance(v, str)}
                                              | {config.TABLE_NAME: "t", config.CURSOR_KEY: "k" * 64})
    assert deployed.fleet_index == FLEET_INDEX


@pytest.mark.parametrize("handler", PUSH_HANDLERS)
def test_the_push_functions_read_the_declaration_for_connectivity(fleet, handler):
    """A device's WebSocket connect and disconnect set connectivity/connected where it is declared."""
    _, function = function_of(fleet, handler)
    assert function["Properties"]["Environment"]["Variables"][config.FLEET_INDEX] == FLEET


@pytest.mark.parametrize("construct", ["Function", "WaitingFunction"])
def test_the_api_functions_may_query_each_declared_index_and_no_other(fleet, construct):
    table_id, _ = only(fleet, "AWS::DynamoDB::Table")
    _, function = api_function(fleet, construct)
    statements = statements_of(fleet, function)
    table = [s for s in statements if s["Resource"] == {"Fn::GetAtt": [table_id, "Arn"]}]
    assert len(table) == 1 and sorted(actions(table[0])) == sorted(api_module.DYNAMODB_ACTIONS)
    [indexes] = [s for s in statements if "/index/" in json.dumps(s["Resource"])]
    assert actions(indexes) == ["dynamodb:Query"] and indexes["Effect"] == "Allow"
    assert sorted(indexes["Resource"], key=json.dumps) == sorted(
        [{"Fn::Join": ["", [{"Fn::GetAtt": [table_id, "Arn"]}, f"/index/{index['IndexName']}"]]}
         for index in FLEET_INDEX.global_secondary_indexes()], key=json.dumps)


def test_devices_count_goes_to_the_api_function(template):
    """GET /devices/count is no waiting route: the $default route takes it to the API function,
    which tells it from a device named "count" (functions/api)."""
    api_alias, _ = alias_of(template, api_function(template)[0])
    routes = http_routes(template)
    assert not [key for key in routes if "/count" in key]
    assert routes["$default"]["IntegrationUri"] == {"Ref": api_alias}


# --------------------------------------------------------------- the reindex function


def test_the_reindex_function_runs_the_backfill_on_the_api_asset_for_15_minutes(fleet):
    _, api = api_function(fleet)
    logical, function = reindex_function(fleet)
    props = function["Properties"]
    assert props["Handler"] == reindex.HANDLER == "functions.reindex.handler.handler"
    assert props["Runtime"] == "python3.13" and props["Architectures"] == ["arm64"]
    assert props["Code"] == api["Properties"]["Code"] and props["Layers"] == api["Properties"]["Layers"]
    assert props["Timeout"] == 900
    assert props["MemorySize"] == reindex.MEMORY_MB <= 512
    assert props["ReservedConcurrentExecutions"] == 1  # one job at a time
    assert props["RecursiveLoop"] == "Allow"  # its chain of self-invocations is not cut after 16
    group = props["LoggingConfig"]["LogGroup"]["Ref"]
    assert fleet.to_json()["Resources"][group]["Properties"]["RetentionInDays"] == 30
    assert not fleet.find_resources("AWS::Lambda::Alias", {"Properties": {"FunctionName": {"Ref": logical}}})


def test_the_reindex_environment_is_exactly_what_its_config_reads(fleet):
    table_id, _ = only(fleet, "AWS::DynamoDB::Table")
    _, api = api_function(fleet)
    _, function = reindex_function(fleet)
    environment = function["Properties"]["Environment"]["Variables"]
    ours = {name for name in environment if not name.startswith("POWERTOOLS_")}
    assert ours == set(config.REINDEX_VARIABLES) - {config.DYNAMODB_ENDPOINT}
    assert environment[config.TABLE_NAME] == {"Ref": table_id}
    assert environment[config.FLEET_INDEX] == FLEET_INDEX.declaration
    api_environment = api["Properties"]["Environment"]["Variables"]
    assert environment[config.CHANGE_RETENTION_SECONDS] == api_environment[config.CHANGE_RETENTION_SECONDS]
    assert {name: value for name, value in environment.items() if name.startswith("POWERTOOLS_")} == {
        name: value for name, value in api_environment.items() if name.startswith("POWERTOOLS_")}
    assert config.fleet_index({k: v for k, v in environment.items() if isinstance(v, str)}) == FLEET_INDEX


def test_the_reindex_role_may_use_the_table_its_logs_and_invoke_itself_only(fleet):
    table_id, _ = only(fleet, "AWS::DynamoDB::Table")
    logical, function = reindex_function(fleet)
    statements = statements_of(fleet, function)
    [table] = [s for s in statements if any(a.startswith("dynamodb:") for a in actions(s))]
    assert table["Resource"] == {"Fn::GetAtt": [table_id, "Arn"]} and table["Effect"] == "Allow"
    assert set(actions(table)) == {"dynamodb:Query", "dynamodb:Scan", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
                                   "dynamodb:DeleteItem", "dynamodb:BatchGetItem"}
    [logs] = [s for s in statements if any(a.startswith("logs:") for a in actions(s))]
    assert logs["Resource"] == {"Fn::GetAtt": [function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"], "Arn"]}
    [invoke] = [s for s in statements if any(a.startswith("lambda:") for a in actions(s))]
    assert actions(invoke) == ["lambda:InvokeFunction"] and invoke["Effect"] == "Allow"
    assert invoke["Resource"] == {"Fn::GetAtt": [logical, "Arn"]}  # itself, unqualified, and nothing else
    assert {a.split(":")[0] for s in statements for a in actions(s)} == {"dynamodb", "logs", "lambda"}
    # The self-invoke statement is in a policy the function does not depend on: no cycle.
    invoke_policy = next(policy_id for policy_id, policy in fleet.find_resources("AWS::IAM::Policy").items()
                         if invoke in policy["Properties"]["PolicyDocument"]["Statement"])
    assert invoke_policy not in function.get("DependsOn", [])


def iam_actions(requests: list[tuple[str, dict]]) -> set[tuple[str, bool]]:
    """The IAM actions DynamoDB authorises ``requests`` as (a transaction: each item's own
    action), each with whether it names an index."""
    needed = set()
    for operation, request in requests:
        kinds = ([next(iter(item)) for item in request["TransactItems"]] if operation == "transact_write_items"
                 else ["".join(part.capitalize() for part in operation.split("_"))])
        for kind in kinds:
            needed.add((f"dynamodb:{kind}{'Item' if operation == 'transact_write_items' else ''}",
                        "IndexName" in request))
    return needed


def granted_actions(template: Template, function: dict) -> set[tuple[str, bool]]:
    """The DynamoDB actions the function's role allows, each with whether on the indexes."""
    return {(action, "/index/" in json.dumps(statement["Resource"]))
            for statement in statements_of(template, function) if statement["Effect"] == "Allow"
            for action in actions(statement) if action.startswith("dynamodb:")}


@pytest.fixture
def deployed_fleet(moto_table):
    """A table holding devices when the stack's fields are declared (a deploy that declares
    them on a table in use)."""
    from functions.device_state import DeviceStateManager
    from functions.device_state.table import create_table

    client, name = moto_table[0], moto_table[1] + "-indexed"
    create_table(client, name, fleet_index=FLEET_INDEX)
    before = DeviceStateManager(client, name)  # before the deploy: no field declared
    for number in range(3):
        before.create(f"lamp-{number}", {}, sections={"reported": {"firmware": "1.0"}})
    return client, name


def test_the_reindex_and_job_runner_code_send_only_what_their_roles_allow(fleet, deployed_fleet):
    """Each function's code run in process as it runs deployed (on moto), every request it sends
    recorded: a request its role does not allow is an AccessDenied only AWS would show. The
    runner meets the field still building (it scans whether the table holds devices), then the
    backfill runs, then the runner again."""
    from functions.device_state import DeviceStateManager
    from tests.helpers import RecordingClient

    client, name = deployed_fleet
    runner_client, reindex_client = RecordingClient(client), RecordingClient(client)
    jobs = DeviceStateManager(runner_client, name, fleet_index=FLEET_INDEX, cursor_key=b"k" * 32)
    jobs.jobs().create({"jobId": "j1", "filter": 'eq(reported/firmware,"1.0")', "desired": {"mode": "eco"}})
    runner_client.requests.clear()  # the API function's part
    jobs.job_runner(concurrency=1).run("j1", 1.5)
    jobs.due_jobs()
    assert DeviceStateManager(reindex_client, name, fleet_index=FLEET_INDEX).reindex(budget_seconds=30)
    jobs.job_runner(concurrency=1).run("j1", 1.5)
    assert ("dynamodb:Query", True) in iam_actions(runner_client.requests)  # it found the devices on the index
    assert all(jobs.get(f"lamp-{number}").desired == {"mode": "eco"} for number in range(3))  # and wrote them
    for handler, sent in ((reindex.HANDLER, reindex_client.requests), (jobs_module.HANDLER, runner_client.requests)):
        _, function = only(fleet, "AWS::Lambda::Function", {"Handler": handler})
        needed = iam_actions(sent)
        assert ("dynamodb:Scan", False) in needed and ("dynamodb:Query", False) in needed, handler
        assert needed <= granted_actions(fleet, function), (handler, needed - granted_actions(fleet, function))


def test_the_reindex_errors_alarm_notifies_the_topic(fleet):
    topic_id, _ = only(fleet, "AWS::SNS::Topic")
    logical, _ = reindex_function(fleet)
    props = alarm_named(fleet, "ReindexErrors")
    assert props["Namespace"] == "AWS/Lambda" and props["MetricName"] == "Errors" and props["Statistic"] == "Sum"
    assert props["Threshold"] == monitoring.REINDEX_ERRORS_PER_PERIOD == 0 and props["Period"] == 300
    assert props["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": logical}}]
    assert props["ComparisonOperator"] == "GreaterThanThreshold"
    for alarm in alarms(fleet).values():  # as every alarm of the stack
        assert alarm["AlarmActions"] == [{"Ref": topic_id}] and alarm["TreatMissingData"] == missing_data_as(alarm)


def test_the_reindex_alarm_has_a_runbook_entry():
    assert "`ReindexErrors`" in (REPO_ROOT / "docs" / "operations.md").read_text(), \
        "docs/operations.md has no runbook entry for ReindexErrors"


def test_an_output_names_the_reindex_function_for_aws_lambda_invoke(fleet, template):
    logical, _ = reindex_function(fleet)
    outputs = fleet.find_outputs("*")
    assert outputs[reindex.OUTPUT_NAME]["Value"] == {"Ref": logical}  # the function's name
    assert sorted(outputs) == sorted([*template.find_outputs("*"), reindex.OUTPUT_NAME])


# ------------------------------------------------------------------------------- nag


def test_cdk_nag_passes_with_a_fleet_index_and_the_reindex_function_needs_no_new_acknowledgement(fleet_assembly):
    report = json.loads((Path(fleet_assembly.directory) / "validation-report.json").read_text())
    [nag] = report["pluginReports"]
    assert nag["pluginName"] == "AwsSolutions" and nag["conclusion"] == "success" and nag["violations"] == []
    acknowledged = {violation["ruleName"] for violation in nag["suppressedViolations"]
                    for construct in violation["violatingConstructs"]
                    if construct["constructPath"].startswith("DeviceStateStack/Reindex/")}
    assert acknowledged == {"AwsSolutions-L1"}  # the pinned runtime, as every function's
