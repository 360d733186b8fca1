"""The table's capacity in the CDK stack (context ``capacity``): on demand by default; with
``provisioned``, provisioned read and write capacity on the table and on each fleet index,
each auto scaled by a 70 % target-tracking policy between the context's bounds. One stack is
synthesized with two fields (and cdk-nag's checks) for the module."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template

from functions.device_state import FleetIndex
from infra.table import TARGET_UTILIZATION_PERCENT
from tests.infra.conftest import synth_stack
from tests.infra.test_stack import alarm_named, only

FLEET = "reported/firmware:string,reported/online:boolean"
INDEX_NAMES = [index["IndexName"] for index in FleetIndex.parse(FLEET).global_secondary_indexes()]
BOUNDS = {"minReadCapacity": "3", "maxReadCapacity": "300",
          "minWriteCapacity": "7", "maxWriteCapacity": "700"}


@pytest.fixture(scope="module")
def provisioned() -> Template:
    app, stack = synth_stack({"capacity": "provisioned", "fleetIndex": FLEET, **BOUNDS}, nag=True)
    app.synth()  # cdk-nag's checks run here: an unacknowledged finding raises
    return Template.from_stack(stack)


def scaled(template: Template) -> dict[tuple[str, str], dict]:
    """(resource id, scalable dimension) -> the scalable target's properties and its policies."""
    targets = template.find_resources("AWS::ApplicationAutoScaling::ScalableTarget")
    policies = template.find_resources("AWS::ApplicationAutoScaling::ScalingPolicy")
    found = {}
    for logical, target in targets.items():
        props = target["Properties"]
        parts = props["ResourceId"]["Fn::Join"][1]
        assert parts[:2] == ["table/", {"Ref": only(template, "AWS::DynamoDB::Table")[0]}]
        resource = "".join(parts[2:]) or "table"
        found[(resource, props["ScalableDimension"])] = {
            **props, "policies": [p["Properties"] for p in policies.values()
                                  if p["Properties"]["ScalingTargetId"] == {"Ref": logical}]}
    return found


def test_the_default_stays_on_demand_without_auto_scaling(template):
    from infra.stack import CONTEXT_DEFAULTS

    assert CONTEXT_DEFAULTS["capacity"] == "on-demand"
    _, table = only(template, "AWS::DynamoDB::Table")
    assert table["Properties"]["BillingMode"] == "PAY_PER_REQUEST"
    assert "ProvisionedThroughput" not in table["Properties"]
    assert not template.find_resources("AWS::ApplicationAutoScaling::ScalableTarget")
    assert not template.find_resources("AWS::ApplicationAutoScaling::ScalingPolicy")


def test_provisioned_starts_the_table_and_each_index_at_the_minimum(provisioned):
    _, table = only(provisioned, "AWS::DynamoDB::Table")
    props = table["Properties"]
    assert "BillingMode" not in props  # CloudFormation's default, PROVISIONED, which the CDK leaves out
    start = {"ReadCapacityUnits": 3, "WriteCapacityUnits": 7}
    assert props["ProvisionedThroughput"] == start
    assert sorted(index["IndexName"] for index in props["GlobalSecondaryIndexes"]) == sorted(INDEX_NAMES)
    assert all(index["ProvisionedThroughput"] == start for index in props["GlobalSecondaryIndexes"])


def test_reads_and_writes_of_the_table_and_each_index_scale_to_70_percent_within_the_bounds(provisioned):
    assert TARGET_UTILIZATION_PERCENT == 70
    found = scaled(provisioned)
    expected = [("table", "table")] + [(f"/index/{name}", "index") for name in INDEX_NAMES]
    assert sorted(found) == sorted((resource, f"dynamodb:{kind}:{units}CapacityUnits")
                                   for resource, kind in expected for units in ("Read", "Write"))
    for (_, dimension), target in found.items():
        units = "Read" if dimension.endswith("ReadCapacityUnits") else "Write"
        assert target["ServiceNamespace"] == "dynamodb"
        assert (target["MinCapacity"], target["MaxCapacity"]) == (
            int(BOUNDS[f"min{units}Capacity"]), int(BOUNDS[f"max{units}Capacity"]))
        [policy] = target["policies"]
        assert policy["PolicyType"] == "TargetTrackingScaling"
        assert policy["TargetTrackingScalingPolicyConfiguration"] == {
            "PredefinedMetricSpecification": {"PredefinedMetricType": f"DynamoDB{units}CapacityUtilization"},
            "TargetValue": 70}


def test_the_throttle_alarm_watches_the_provisioned_table_as_it_does_the_on_demand_one(provisioned):
    # ThrottledRequests counts a request throttled for any reason: on demand, a partition or
    # account limit; provisioned, the table's or an index's capacity exceeded as well.
    table_id, _ = only(provisioned, "AWS::DynamoDB::Table")
    props = alarm_named(provisioned, "DynamoDbThrottles")
    stats = [m["MetricStat"]["Metric"] for m in props["Metrics"] if "MetricStat" in m]
    assert stats and {s["MetricName"] for s in stats} == {"ThrottledRequests"}
    assert all({"Name": "TableName", "Value": {"Ref": table_id}} in s["Dimensions"] for s in stats)


def test_provisioned_without_a_fleet_index_scales_the_table_alone():
    _, stack = synth_stack({"capacity": "provisioned"})
    assert sorted(scaled(Template.from_stack(stack))) == [
        ("table", "dynamodb:table:ReadCapacityUnits"), ("table", "dynamodb:table:WriteCapacityUnits")]


@pytest.mark.parametrize("context, message", [
    ({"capacity": "PROVISIONED"}, r"^context capacity: 'PROVISIONED' is neither on-demand nor provisioned$"),
    ({"capacity": "provisioned", "minReadCapacity": "0"},
     r"^context minReadCapacity: '0' is not a whole number of capacity units of at least 1$"),
    ({"capacity": "provisioned", "maxWriteCapacity": "lots"},
     r"^context maxWriteCapacity: 'lots' is not a whole number of capacity units of at least 1$"),
    ({"capacity": "provisioned", "minWriteCapacity": "2.5"}, r"^context minWriteCapacity: '2.5' is not"),
    ({"capacity": "provisioned", "minReadCapacity": "50", "maxReadCapacity": "10"},
     r"^context maxReadCapacity \(10\) is below minReadCapacity \(50\)$"),
])
def test_a_bad_capacity_context_fails_synthesis(context, message):
    with pytest.raises(ValueError, match=message):
        synth_stack(context)
