"""The devices table, from the library's one definition of keys and TTL."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from functions.device_state import table as model


class DevicesTable(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, throwaway: bool = False):
        super().__init__(scope, construct_id)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name=model.PARTITION_KEY, type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name=model.SORT_KEY, type=dynamodb.AttributeType.STRING),
            time_to_live_attribute=model.TTL_ATTRIBUTE,
            stream=dynamodb.StreamViewType(model.STREAM_VIEW_TYPE),  # the change feed's processor reads it
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            deletion_protection=not throwaway,
            removal_policy=RemovalPolicy.DESTROY if throwaway else RemovalPolicy.RETAIN,
        )
