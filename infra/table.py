"""The devices table, from the library's one definition of keys, TTL and fleet index."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from functions.device_state import FleetIndex
from functions.device_state import table as model

# DynamoDB's attribute types as the CDK names them.
ATTRIBUTE_TYPES = {"S": dynamodb.AttributeType.STRING, "N": dynamodb.AttributeType.NUMBER,
                   "B": dynamodb.AttributeType.BINARY}
PROJECTIONS = {"KEYS_ONLY": dynamodb.ProjectionType.KEYS_ONLY, "ALL": dynamodb.ProjectionType.ALL}
# Provisioned capacity: Application Auto Scaling keeps the consumed share of what is provisioned
# near this, on the table and on each index: the rest (room for a rise of 43 %) is what a
# rising load meets while auto scaling takes its minutes to follow.
TARGET_UTILIZATION_PERCENT = 70


@dataclass(frozen=True)
class ProvisionedCapacity:
    """Capacity units the table and each of its indexes start at (the minimum) and auto scaling
    keeps them between."""

    min_read: int
    max_read: int
    min_write: int
    max_write: int


class DevicesTable(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, throwaway: bool = False,
                 fleet_index: FleetIndex = FleetIndex(), capacity: ProvisionedCapacity | None = None):
        """``capacity`` None: on demand; else provisioned, auto scaled within its bounds."""
        super().__init__(scope, construct_id)
        self.fleet_index = fleet_index
        initial_capacity = ({"read_capacity": capacity.min_read, "write_capacity": capacity.min_write}
                            if capacity else {})
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name=model.PARTITION_KEY, type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name=model.SORT_KEY, type=dynamodb.AttributeType.STRING),
            time_to_live_attribute=model.TTL_ATTRIBUTE,
            stream=dynamodb.StreamViewType(model.STREAM_VIEW_TYPE),  # the change feed's processor reads it
            billing_mode=(dynamodb.BillingMode.PROVISIONED if capacity
                          else dynamodb.BillingMode.PAY_PER_REQUEST),
            **initial_capacity,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            deletion_protection=not throwaway,
            removal_policy=RemovalPolicy.DESTROY if throwaway else RemovalPolicy.RETAIN,
        )
        # One sparse index per declared field, exactly as the library defines it (and
        # table.create_table makes it locally): the same names, keys and KEYS_ONLY projection.
        # CloudFormation creates or deletes at most one global secondary index per table in one
        # stack update (DynamoDB builds one at a time): declare one new field per deploy (and
        # remove one per deploy), then run the reindex function (infra/reindex.py) to backfill it.
        types = {definition["AttributeName"]: definition["AttributeType"]
                 for definition in fleet_index.attribute_definitions()}
        self.index_names: list[str] = []
        for index in fleet_index.global_secondary_indexes():
            keys = {key["KeyType"]: key["AttributeName"] for key in index["KeySchema"]}
            self.table.add_global_secondary_index(
                index_name=index["IndexName"],
                partition_key=dynamodb.Attribute(name=keys["HASH"], type=ATTRIBUTE_TYPES[types[keys["HASH"]]]),
                sort_key=dynamodb.Attribute(name=keys["RANGE"], type=ATTRIBUTE_TYPES[types[keys["RANGE"]]]),
                projection_type=PROJECTIONS[index["Projection"]["ProjectionType"]],
                **initial_capacity)
            self.index_names.append(index["IndexName"])
        if capacity:
            self._auto_scale(capacity)

    def _auto_scale(self, capacity: ProvisionedCapacity) -> None:
        """Target tracking on the read and write capacity of the table and of every index: an
        index short of write capacity throttles the table's writes too."""
        reads = {"min_capacity": capacity.min_read, "max_capacity": capacity.max_read}
        writes = {"min_capacity": capacity.min_write, "max_capacity": capacity.max_write}
        scaled = [self.table.auto_scale_read_capacity(**reads),
                  self.table.auto_scale_write_capacity(**writes)]
        for name in self.index_names:
            scaled += [self.table.auto_scale_global_secondary_index_read_capacity(name, **reads),
                       self.table.auto_scale_global_secondary_index_write_capacity(name, **writes)]
        for attribute in scaled:
            attribute.scale_on_utilization(target_utilization_percent=TARGET_UTILIZATION_PERCENT)
