"""Push in the CDK stack: the WebSocket API, its routes and authorizer, the push function,
the fan-out's event source mapping and on-failure queue, their rights, output and alarms."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from aws_cdk.assertions import Template

from functions import config
from functions.auth import authorizer as authorizer_code
from functions.auth import credentials
from functions.push.connections import CONNECTIONS_ENDPOINT
from functions.push.fanout import BATCH_SIZE, FILTER_PATTERNS, MAX_RETRY_ATTEMPTS
from infra import api as api_module
from infra import monitoring
from infra import push
from infra.stack import CONTEXT_DEFAULTS
from tests.auth import token
from tests.infra.conftest import synth_stack
from tests.infra.test_snapstart import alias_of, function_of
from tests.infra.test_stack import REPO_ROOT, alarm_named, api_function, only, under

PUSH_HANDLERS = (push.HANDLER, push.FANOUT_HANDLER)


def routes(template) -> dict[str, dict]:
    """The WebSocket API's routes (the HTTP API's are tests/infra/test_auth_stack.http_routes)."""
    api_id, _ = under(template, "AWS::ApiGatewayV2::Api", "Push")
    return {route["Properties"]["RouteKey"]: route["Properties"]
            for route in template.find_resources("AWS::ApiGatewayV2::Route").values()
            if route["Properties"]["ApiId"] == {"Ref": api_id}}


def statements_of(template, function: dict) -> list[dict]:
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    return [statement for policy in template.find_resources("AWS::IAM::Policy").values()
            if {"Ref": role} in policy["Properties"]["Roles"]
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]]


def actions(statement: dict) -> list[str]:
    return statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]


# ------------------------------------------------------------------ the WebSocket API


def test_a_websocket_api_routes_messages_by_their_action(template):
    _, api = under(template, "AWS::ApiGatewayV2::Api", "Push")
    assert api["Properties"]["ProtocolType"] == "WEBSOCKET"
    assert api["Properties"]["RouteSelectionExpression"] == "$request.body.action"
    assert set(routes(template)) == {"$connect", "$disconnect", "$default", "subscribe", "unsubscribe"}


def test_every_route_integrates_the_push_functions_alias(template):
    push_alias, _ = alias_of(template, function_of(template, push.HANDLER)[0])
    integrations = template.find_resources("AWS::ApiGatewayV2::Integration")
    for key, route in routes(template).items():
        target = route["Target"]["Fn::Join"][1]
        assert target[0] == "integrations/", key
        integration = integrations[target[1]["Ref"]]["Properties"]
        assert integration["IntegrationType"] == "AWS_PROXY"
        assert {"Ref": push_alias} in integration["IntegrationUri"]["Fn::Join"][1], key


def test_the_lambda_authorizer_guards_connect_and_only_connect(template):
    authorizer_id, authorizer = only(template, "AWS::ApiGatewayV2::Authorizer")
    authorizer_alias, _ = alias_of(template, function_of(template, api_module.AUTHORIZER_HANDLER)[0])
    assert authorizer["Properties"]["AuthorizerType"] == "REQUEST"
    assert {"Ref": authorizer_alias} in authorizer["Properties"]["AuthorizerUri"]["Fn::Join"][1]
    # No identity source: API Gateway would answer 401 unless all of them were present, and a
    # client sends its token as the Authorization header, a bearer.<token> subprotocol or ?token=.
    assert "IdentitySource" not in authorizer["Properties"]
    for key, route in routes(template).items():
        if key == "$connect":
            assert route["AuthorizationType"] == "CUSTOM" and route["AuthorizerId"] == {"Ref": authorizer_id}
        else:
            assert route["AuthorizationType"] == "NONE" and "AuthorizerId" not in route, key


@pytest.mark.parametrize("where", ["header", "query"])
def test_the_authorizer_allows_a_connect_with_the_token_in_either_place(where):
    arn = "arn:aws:execute-api:eu-west-1:123456789012:abc123/prod/$connect"
    credential = token()
    event = {"type": "REQUEST", "methodArn": arn, "requestContext": {"routeKey": "$connect", "eventType": "CONNECT"},
             "headers": {"Authorization": f"Bearer {credential}"} if where == "header" else {},
             "queryStringParameters": {"token": credential} if where == "query" else {}}
    decision = authorizer_code.decide(event)
    assert decision["policyDocument"]["Statement"] == [
        {"Action": "execute-api:Invoke", "Effect": "Allow", "Resource": [arn]}]
    with pytest.raises(authorizer_code.Unauthorized):  # neither: the authorizer refuses (401)
        authorizer_code.decide({**event, "headers": {}, "queryStringParameters": {}})


def test_the_stage_is_prod_auto_deployed_throttled_and_logged():
    _, stack = synth_stack({"throttleRateLimit": 42, "throttleBurstLimit": 84})
    template = Template.from_stack(stack)
    _, stage = under(template, "AWS::ApiGatewayV2::Stage", "Push")
    props = stage["Properties"]
    assert props["StageName"] == push.STAGE_NAME == "prod" and props["AutoDeploy"] is True
    assert props["DefaultRouteSettings"] == {"ThrottlingRateLimit": 42, "ThrottlingBurstLimit": 84}
    access = props["AccessLogSettings"]
    assert json.loads(access["Format"])["requestId"] == "$context.requestId"
    log_group_id, _ = under(template, "AWS::Logs::LogGroup", "PushAccessLogs")
    assert access["DestinationArn"] == {"Fn::GetAtt": [log_group_id, "Arn"]}
    account_id, _ = only(template, "AWS::ApiGateway::Account")  # the account's CloudWatch role for logs
    assert account_id in stage["DependsOn"]


def test_the_websocket_url_is_an_output(template):
    api_id, _ = under(template, "AWS::ApiGatewayV2::Api", "Push")
    value = template.find_outputs("*")[push.URL_OUTPUT]["Value"]["Fn::Join"][1]
    assert push.URL_OUTPUT == "WebSocketUrl"
    assert value[0] == "wss://" and value[1] == {"Ref": api_id} and value[-1] == "/prod"


# ------------------------------------------------------------------- the functions


@pytest.mark.parametrize("handler", PUSH_HANDLERS)
def test_the_push_functions_share_the_api_asset_and_layer_and_log_apart(template, handler):
    _, api = api_function(template)
    _, function = function_of(template, handler)
    props = function["Properties"]
    assert props["Runtime"] == "python3.13" and props["Architectures"] == ["arm64"]
    assert props["Code"] == api["Properties"]["Code"] and props["Layers"] == api["Properties"]["Layers"]
    groups = [f["Properties"]["LoggingConfig"]["LogGroup"]
              for f in template.find_resources("AWS::Lambda::Function").values() if "LoggingConfig" in f["Properties"]]
    assert groups.count(props["LoggingConfig"]["LogGroup"]) == 1


@pytest.mark.parametrize("handler", PUSH_HANDLERS)
def test_the_push_functions_environment(template, handler):
    api_id, _ = under(template, "AWS::ApiGatewayV2::Api", "Push")
    table_id = next(iter(template.find_resources("AWS::DynamoDB::Table")))
    _, function = function_of(template, handler)
    environment = function["Properties"]["Environment"]["Variables"]
    assert set(environment) == (set(config.PUSH_VARIABLES) - {config.DYNAMODB_ENDPOINT, config.FLEET_INDEX}
                                | {CONNECTIONS_ENDPOINT, *credentials.VARIABLES, *credentials.DEVICE_TOKEN_VARIABLES})
    assert environment[config.TABLE_NAME] == {"Ref": table_id}
    assert environment[config.CHANGE_RETENTION_SECONDS] == str(CONTEXT_DEFAULTS["changeRetentionSeconds"])
    assert environment[CONNECTIONS_ENDPOINT] == {"Fn::Join": ["", [
        "https://", {"Ref": api_id}, ".execute-api.", {"Ref": "AWS::Region"}, ".", {"Ref": "AWS::URLSuffix"},
        "/prod"]]}
    trusted = credentials.VARIABLES + credentials.DEVICE_TOKEN_VARIABLES  # both issuers, as the API trusts them
    assert {name: environment[name] for name in trusted} == {
        name: api_function(template)[1]["Properties"]["Environment"]["Variables"][name] for name in trusted}


@pytest.mark.parametrize("handler", PUSH_HANDLERS)
def test_the_push_functions_may_use_the_table_their_logs_and_this_apis_connections_only(template, handler):
    api_id, _ = under(template, "AWS::ApiGatewayV2::Api", "Push")
    table_id = next(iter(template.find_resources("AWS::DynamoDB::Table")))
    _, function = function_of(template, handler)
    statements = statements_of(template, function)
    table = [s for s in statements if s["Resource"] == {"Fn::GetAtt": [table_id, "Arn"]}]
    assert len(table) == 1 and sorted(actions(table[0])) == sorted(push.DYNAMODB_ACTIONS)
    assert set(push.DYNAMODB_ACTIONS) == {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
                                          "dynamodb:DeleteItem", "dynamodb:Query", "dynamodb:BatchGetItem"}
    [connections] = [s for s in statements if any(a.startswith("execute-api:") for a in actions(s))]
    assert actions(connections) == ["execute-api:ManageConnections"] and connections["Effect"] == "Allow"
    arns = [resource["Fn::Join"][1] for resource in connections["Resource"]]
    # what the function's code does with connections: connections.post, .close, .known_gone
    module = REPO_ROOT / Path(*handler.split(".")[:-1]).with_suffix(".py")
    source = module.read_text() + (REPO_ROOT / "functions" / "push" / "services.py").read_text()
    used = set(re.findall(r"connections\.(post|close|known_gone)\b", source))
    methods = [method for method, call in (("POST", "post"), ("DELETE", "close"), ("GET", "known_gone"))
               if call in used]
    assert [arn[-2:] for arn in arns] == [[{"Ref": api_id}, f"/prod/{method}/@connections/*"] for method in methods]
    assert all(arn[:-2] == ["arn:", {"Ref": "AWS::Partition"}, ":execute-api:", {"Ref": "AWS::Region"}, ":",
                            {"Ref": "AWS::AccountId"}, ":"] for arn in arns)
    services = {a.split(":")[0] for s in statements for a in actions(s)}
    assert services <= {"dynamodb", "logs", "execute-api", "sqs"}  # sqs: the fan-out's on-failure queue


def test_only_the_push_functions_may_manage_connections_and_no_policy_grants_a_dynamodb_wildcard(template):
    roles = {function_of(template, handler)[1]["Properties"]["Role"]["Fn::GetAtt"][0] for handler in PUSH_HANDLERS}
    for policy in template.find_resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            assert not [a for a in actions(statement) if a.startswith("dynamodb:") and "*" in a], statement
            if any(a.startswith("execute-api:") for a in actions(statement)):
                assert {role["Ref"] for role in policy["Properties"]["Roles"]} <= roles


def test_the_push_code_calls_only_the_dynamodb_actions_granted():
    source = "\n".join(path.read_text() for path in (REPO_ROOT / "functions" / "push").glob("*.py"))
    called = set(re.findall(r'send\(\s*"([a-z_]+)"', source)) | {"get_item"}  # Store.get; the log's reads: query
    called |= {"batch_get_item"} if re.search(r"\.batch_get\(", source) else set()  # Store.batch_get
    granted = {"".join(part.capitalize() for part in name.split("_")) for name in called | {"query"}}
    assert {f"dynamodb:{name}" for name in granted} == set(push.DYNAMODB_ACTIONS)


# ------------------------------------------------------------------------ the fan-out


def test_the_fanout_has_its_own_mapping_filtered_retried_with_partial_batch_responses(template):
    table_id = next(iter(template.find_resources("AWS::DynamoDB::Table")))
    fanout_alias, _ = alias_of(template, function_of(template, push.FANOUT_HANDLER)[0])
    _, mapping = under(template, "AWS::Lambda::EventSourceMapping", "PushFanOut")
    props = mapping["Properties"]
    assert fanout_alias in json.dumps(props["FunctionName"])
    assert props["EventSourceArn"] == {"Fn::GetAtt": [table_id, "StreamArn"]}
    assert [json.loads(f["Pattern"]) for f in props["FilterCriteria"]["Filters"]] == list(FILTER_PATTERNS)
    assert props["BatchSize"] == BATCH_SIZE and props["MaximumRetryAttempts"] == MAX_RETRY_ATTEMPTS
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert props["BisectBatchOnFunctionError"] is True and props["StartingPosition"] == "TRIM_HORIZON"
    _, feed_mapping = under(template, "AWS::Lambda::EventSourceMapping", "ChangeFeed")
    assert feed_mapping["Properties"]["FunctionName"] != props["FunctionName"]


def test_the_fanout_filter_takes_new_change_items_under_todays_key_and_the_legacy_one():
    """A change item an older release's processor wrote just before an upgrade is still in the
    stream: the filter (and the local poller's ``matches_filter``) takes it too."""
    from functions.device_state.feed.items import LEGACY_CHANGE_SK_PREFIX, change_sk
    from functions.push.fanout import FILTER_PATTERN, matches_filter

    def record(event, sk):
        return {"eventName": event, "dynamodb": {"Keys": {"deviceId": {"S": "lamp"}, "sk": {"S": sk}}}}

    prefixes = [entry["prefix"] for entry in FILTER_PATTERN["dynamodb"]["Keys"]["sk"]["S"]]
    for sk in (change_sk(7), change_sk(7, LEGACY_CHANGE_SK_PREFIX)):
        assert matches_filter(record("INSERT", sk)) and any(sk.startswith(prefix) for prefix in prefixes), sk
        assert not matches_filter(record("REMOVE", sk)), sk
    for sk in ("state", "change-tries#00000000000000000007", "lease#1", "subscription#c1"):
        assert not matches_filter(record("INSERT", sk)) and not any(sk.startswith(p) for p in prefixes), sk


def test_the_fanout_gives_up_to_an_encrypted_queue_of_its_own(template):
    _, mapping = under(template, "AWS::Lambda::EventSourceMapping", "PushFanOut")
    queue_id, queue = under(template, "AWS::SQS::Queue", "PushFanOutFailures")
    feed_queue_id, _ = under(template, "AWS::SQS::Queue", "ChangeFeed")
    assert queue_id != feed_queue_id
    assert mapping["Properties"]["DestinationConfig"]["OnFailure"]["Destination"] == {"Fn::GetAtt": [queue_id, "Arn"]}
    assert queue["Properties"]["SqsManagedSseEnabled"] is True
    assert queue["Properties"]["MessageRetentionPeriod"] == push.FAILURE_RETENTION.to_seconds() == 7 * 24 * 3600
    _, policy = under(template, "AWS::SQS::QueuePolicy", "PushFanOutFailures")
    [deny] = policy["Properties"]["PolicyDocument"]["Statement"]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    _, fanout = function_of(template, push.FANOUT_HANDLER)
    sends = [s for s in statements_of(template, fanout) if any(a.startswith("sqs:") for a in actions(s))]
    assert sends and all(s["Resource"] == {"Fn::GetAtt": [queue_id, "Arn"]} for s in sends)


@pytest.mark.parametrize("name, metric, statistic, threshold, construct", [
    ("FanOutErrors", "Errors", "Sum", monitoring.FANOUT_ERRORS_PER_PERIOD, push.FANOUT_HANDLER),
    ("FanOutIteratorAge", "IteratorAge", "Maximum", monitoring.FANOUT_ITERATOR_AGE_MS, push.FANOUT_HANDLER),
    ("PushErrors", "Errors", "Sum", monitoring.PUSH_ERRORS_PER_PERIOD, push.HANDLER),
    ("FanOutFailures", "ApproximateNumberOfMessagesVisible", "Maximum", monitoring.FANOUT_FAILURES_VISIBLE,
     "PushFanOutFailures"),
])
def test_push_alarms_watch_the_fanout_and_have_runbook_entries(template, name, metric, statistic, threshold,
                                                               construct):
    props = alarm_named(template, name)
    assert props["MetricName"] == metric and props["Statistic"] == statistic and props["Threshold"] == threshold
    if construct.startswith("functions."):
        assert props["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": function_of(template, construct)[0]}}]
    else:
        queue_id, _ = under(template, "AWS::SQS::Queue", construct)
        assert props["Dimensions"] == [{"Name": "QueueName", "Value": {"Fn::GetAtt": [queue_id, "QueueName"]}}]
    assert f"`{name}`" in (REPO_ROOT / "docs" / "operations.md").read_text(), f"no runbook entry for {name}"
