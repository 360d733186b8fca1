"""DeviceStateChanged events against moto's EventBridge (single-threaded: moto is fine here)."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from functions.changes.events import (DETAIL_TYPE, MAX_EVENT_BYTES, SOURCE, EventBridgePublisher, PublishFailed,
                                      detail)
from functions.device_state.feed.items import Change, change_sk
from functions.device_state.model.values import loads


def change(state, version=2):
    return Change("lamp-1", version, version - 1, "updated", [{"op": "replace", "path": "/on", "value": True}],
                  state, "2026-11-22T00:00:00.000Z", "2026-11-22T00:00:01.000Z")


def test_a_change_reaches_a_rule_on_the_bus_with_its_patch_and_state():
    with mock_aws():
        events = boto3.client("events", region_name="us-east-1")
        sqs = boto3.client("sqs", region_name="us-east-1")
        events.create_event_bus(Name="device-state")
        queue = sqs.create_queue(QueueName="automation")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.put_rule(Name="lamps", EventBusName="device-state",
                        EventPattern=json.dumps({"source": [SOURCE], "detail-type": [DETAIL_TYPE]}))
        events.put_targets(Rule="lamps", EventBusName="device-state", Targets=[{"Id": "q", "Arn": arn}])

        EventBridgePublisher(events, "device-state").publish(change({"on": True, "level": loads("1.25")}))

        messages = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)["Messages"]
        event = loads(messages[0]["Body"])
        assert event["source"] == SOURCE and event["detail-type"] == DETAIL_TYPE
        assert event["detail"] == {"deviceId": "lamp-1", "version": 2, "previousVersion": 1, "kind": "updated",
                                   "updatedAt": "2026-11-22T00:00:01.000Z",
                                   "sections": ["state", "desired", "reported"], "delta": {},
                                   "patch": [{"op": "replace", "path": "/on", "value": True}],
                                   "state": {"on": True, "level": loads("1.25")}}  # exact decimals


def test_a_state_too_large_for_an_event_is_left_out_and_flagged():
    body = detail(change({"blob": "x" * MAX_EVENT_BYTES}))
    assert "state" not in body and body["stateOmitted"] is True
    assert body["patch"] == [{"op": "replace", "path": "/on", "value": True}]
    assert "stateOmitted" not in detail(change({"small": 1}))


def test_a_refused_entry_fails_the_record_so_it_is_retried():
    class Refusing:
        def put_events(self, Entries):
            return {"FailedEntryCount": 1, "Entries": [{"ErrorCode": "InternalFailure", "ErrorMessage": "no"}]}

    with pytest.raises(PublishFailed):
        EventBridgePublisher(Refusing(), "device-state").publish(change({}))


def test_the_deployed_handler_writes_the_change_and_puts_the_event_on_the_configured_bus(monkeypatch):
    """lambda_handler as Lambda runs it: config from the environment, EventBridge chosen by
    EVENT_BUS_NAME, a stream batch in, a partial batch response out."""
    from functions import config
    from functions.changes import handler
    from functions.device_state.client import dynamodb_client
    from functions.device_state.table import create_table
    from localdev.apigw import LambdaContext

    def clear():
        for cache in (handler.change_log, handler.publisher, config.processor_config, dynamodb_client):
            cache.cache_clear()

    with mock_aws():
        monkeypatch.setenv("TABLE_NAME", "devices-events")
        monkeypatch.setenv("EVENT_BUS_NAME", "device-state")
        monkeypatch.delenv("DYNAMODB_ENDPOINT", raising=False)
        monkeypatch.delenv("CHANGE_EVENTS_FILE", raising=False)
        clear()
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_table(dynamodb, "devices-events")
        events = boto3.client("events", region_name="us-east-1")
        sqs = boto3.client("sqs", region_name="us-east-1")
        events.create_event_bus(Name="device-state")
        queue = sqs.create_queue(QueueName="all")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        events.put_rule(Name="all", EventBusName="device-state", EventPattern=json.dumps({"source": [SOURCE]}))
        events.put_targets(Rule="all", EventBusName="device-state", Targets=[{"Id": "q", "Arn": arn}])
        image = {"deviceId": {"S": "lamp-9"}, "sk": {"S": "state"}, "version": {"N": "1"},
                 "state": {"M": {"on": {"BOOL": True}}}, "createdAt": {"S": "2026-11-22T00:00:00.000Z"},
                 "updatedAt": {"S": "2026-11-22T00:00:00.000Z"}}
        lease_only = {**image, "leaseToken": {"N": "3"}}
        batch = {"Records": [
            {"eventID": "1", "eventName": "INSERT", "eventSource": "aws:dynamodb", "eventSourceARN": "arn",
             "dynamodb": {"Keys": {"deviceId": image["deviceId"], "sk": image["sk"]}, "NewImage": image,
                          "SequenceNumber": "100", "ApproximateCreationDateTime": 1795000000}},
            {"eventID": "2", "eventName": "MODIFY", "eventSource": "aws:dynamodb", "eventSourceARN": "arn",
             "dynamodb": {"Keys": {"deviceId": image["deviceId"], "sk": image["sk"]}, "NewImage": lease_only,
                          "OldImage": image, "SequenceNumber": "101", "ApproximateCreationDateTime": 1795000001}},
        ]}
        try:
            assert handler.lambda_handler(batch, LambdaContext()) == {"batchItemFailures": []}
            items = dynamodb.scan(TableName="devices-events")["Items"]
            assert sorted(item["sk"]["S"] for item in items) == [change_sk(1)]
            messages = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1, MaxNumberOfMessages=10)["Messages"]
            assert [(m["detail"]["version"], m["detail"]["kind"]) for m in map(lambda m: loads(m["Body"]), messages)
                    ] == [(1, "created")]  # one event: the lease bookkeeping made none
        finally:
            clear()


def test_an_event_carries_the_sections_it_changed_and_the_delta_after_it():
    body = detail(Change("lamp-1", 3, 2, "updated", [{"op": "add", "path": "/desired/power", "value": "on"}],
                         {}, "t", "t", sections=("desired",), desired={"power": "on"}, reported={}))
    assert body["sections"] == ["desired"] and body["delta"] == {"power": "on"}
    deleted = detail(Change("lamp-1", 4, 3, "deleted", None, None, "t", "t"))
    assert deleted["delta"] is None
