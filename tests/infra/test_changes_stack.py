"""The change feed in the CDK stack: stream, processor, mapping, queue, bus, IAM, alarms."""

from __future__ import annotations

import json

import pytest

from functions import config as processor_config
from functions.changes.handler import BATCH_SIZE, FILTER_PATTERN, MAX_RECORD_AGE_SECONDS, MAX_RETRY_ATTEMPTS
from functions import config as api_config
from infra import changes as changes_module
from functions.device_state import metrics as names
from tests.infra.test_stack import REPO_ROOT, alarm_named, api_function, only, under


def _statements(template, role_id):
    found = []
    for policy in template.find_resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            found.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return found


def _actions(statement):
    return statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]


def test_the_table_streams_new_and_old_images(template):
    _, table = only(template, "AWS::DynamoDB::Table")
    assert table["Properties"]["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}


def test_the_processor_shares_the_api_asset_and_layer_on_arm64(template):
    _, api = api_function(template)
    _, processor = only(template, "AWS::Lambda::Function", {"Handler": changes_module.HANDLER})
    assert processor["Properties"]["Architectures"] == ["arm64"]
    assert processor["Properties"]["Code"] == api["Properties"]["Code"]
    assert processor["Properties"]["Layers"] == api["Properties"]["Layers"]
    environment = processor["Properties"]["Environment"]["Variables"]
    ours = {name for name in environment if not name.startswith("POWERTOOLS_")}
    assert ours == set(processor_config.PROCESSOR_VARIABLES) - {processor_config.DYNAMODB_ENDPOINT,
                                                                processor_config.CHANGE_EVENTS_FILE,
                                                                processor_config.EVENT_BUS_NAME}  # opt-in
    retention = api["Properties"]["Environment"]["Variables"][api_config.CHANGE_RETENTION_SECONDS]
    assert environment[processor_config.CHANGE_RETENTION_SECONDS] == retention == "604800"


@pytest.mark.parametrize("seconds", ["60", "7200", str(367 * 24 * 3600), "a week", "\u00b2"])
def test_a_retention_the_functions_would_refuse_fails_the_synth(seconds):
    """Each function refuses a retention outside its bounds at its first request: every request
    of the deployed service would fail. The feed outlives a WebSocket connection's 2 hours."""
    from tests.infra.conftest import synth_stack

    with pytest.raises(ValueError, match="changeRetentionSeconds"):
        synth_stack({"changeRetentionSeconds": seconds})


@pytest.mark.parametrize("context", [{"tombstoneSeconds": 60}, {"tombstoneSeconds": "a month"},
                                     {"changeRetentionSeconds": 90 * 24 * 3600}])
def test_a_tombstone_shorter_than_the_changes_it_outlives_fails_the_synth(context):
    """A device created again after its tombstone expired would find its former changes in its
    feed (the functions refuse it too, at every request)."""
    from functions.config import ConfigError
    from tests.infra.conftest import synth_stack

    with pytest.raises(ConfigError, match="context tombstoneSeconds"):
        synth_stack(context)


def test_the_mapping_filters_bisects_bounds_retries_and_sends_failures_to_an_encrypted_queue(template):
    _, mapping = under(template, "AWS::Lambda::EventSourceMapping", "ChangeFeed")
    props = mapping["Properties"]
    assert [json.loads(f["Pattern"]) for f in props["FilterCriteria"]["Filters"]] == [FILTER_PATTERN]
    assert props["BatchSize"] == BATCH_SIZE
    assert props["BisectBatchOnFunctionError"] is True
    assert props["MaximumRetryAttempts"] == MAX_RETRY_ATTEMPTS
    assert props["MaximumRecordAgeInSeconds"] == MAX_RECORD_AGE_SECONDS
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert props["ParallelizationFactor"] == 1 and props["StartingPosition"] == "TRIM_HORIZON"
    queue_id, queue = under(template, "AWS::SQS::Queue", "ChangeFeed")
    assert queue["Properties"]["SqsManagedSseEnabled"] is True
    assert props["DestinationConfig"]["OnFailure"]["Destination"] == {"Fn::GetAtt": [queue_id, "Arn"]}


@pytest.fixture(scope="module")
def publishing():
    """The stack deployed with ``-c publishEvents=true``."""
    from aws_cdk.assertions import Template

    from tests.infra.conftest import synth_stack

    return Template.from_stack(synth_stack({"publishEvents": "true"})[1])


def test_no_bus_and_no_event_is_paid_for_unless_asked(template):
    assert template.find_resources("AWS::Events::EventBus") == {}
    _, processor = only(template, "AWS::Lambda::Function", {"Handler": changes_module.HANDLER})
    assert processor_config.EVENT_BUS_NAME not in processor["Properties"]["Environment"]["Variables"]
    statements = _statements(template, processor["Properties"]["Role"]["Fn::GetAtt"][0])
    assert not [s for s in statements if any(a.startswith("events:") for a in _actions(s))]


def test_the_processor_may_put_items_and_events_and_read_its_stream_nothing_else(publishing):
    template = publishing
    table_id = next(iter(template.find_resources("AWS::DynamoDB::Table")))
    bus_id, _ = only(template, "AWS::Events::EventBus")
    _, processor = only(template, "AWS::Lambda::Function", {"Handler": changes_module.HANDLER})
    assert processor["Properties"]["Environment"]["Variables"][processor_config.EVENT_BUS_NAME] == {"Ref": bus_id}
    statements = _statements(template, processor["Properties"]["Role"]["Fn::GetAtt"][0])
    table_actions = [s for s in statements if any(a.startswith("dynamodb:") and "Stream" not in a
                                                  and a != "dynamodb:GetRecords" and a != "dynamodb:GetShardIterator"
                                                  for a in _actions(s))]
    # change items; a job's executions and counts (puts and an update in a transaction), its spec read once
    assert table_actions == [{"Action": ["dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:GetItem"],
                              "Effect": "Allow", "Resource": {"Fn::GetAtt": [table_id, "Arn"]}}]
    events = [s for s in statements if any(a.startswith("events:") for a in _actions(s))]
    assert events == [{"Action": "events:PutEvents", "Effect": "Allow",
                       "Resource": {"Fn::GetAtt": [bus_id, "Arn"]}}]
    stream_reads = {a for s in statements for a in _actions(s) if a.startswith("dynamodb:")} - {
        "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:GetItem"}
    assert stream_reads <= {"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator",
                            "dynamodb:ListStreams"}
    every = {a for s in statements for a in _actions(s)}
    assert not {a for a in every if a.startswith(("dynamodb:Delete", "dynamodb:Scan", "dynamodb:Query",
                                                  "dynamodb:BatchGet"))}


def test_feed_alarms_exist_and_each_has_a_runbook_entry(template):
    alarms = template.find_resources("AWS::CloudWatch::Alarm")
    metrics = {alarm["Properties"].get("MetricName") for alarm in alarms.values()}
    assert {"IteratorAge", "ApproximateNumberOfMessagesVisible"} <= metrics
    runbook = (REPO_ROOT / "docs" / "operations.md").read_text()
    lost = alarm_named(template, "ChangesLost")
    assert lost["MetricName"] == names.CHANGES_LOST and lost["Threshold"] == 0
    for name in ("ChangeFeedIteratorAge", "ChangeFeedFailures", "ChangeProcessorErrors", "ChangesLost"):
        assert any(name in logical_id for logical_id in alarms), name
        assert f"`{name}`" in runbook, f"docs/operations.md has no runbook entry for {name}"
