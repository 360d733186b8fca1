"""The local stream processor (``localdev/stream.py``) keeps reading a shard whose GetRecords
answers TrimmedDataAccessException: DynamoDB Local sometimes does so for an iterator taken on a
young shard (aws/aws-sdk-java#2923), and a poller that only logged it stopped the feed and
push for good. Driven by botocore's Stubber on real clients, since DynamoDB Local does it
only now and then."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from localdev.stream import StreamPoller

ARN = "arn:aws:dynamodb:ddblocal:000000000000:table/devices/stream/2026-11-25T00:00:00.000"
SHARD = "shardId-00000001764028800000-aaaaaaaa"
FIRST, SECOND = "000000000000000000100", "000000000000000000200"  # 21 digits at least, as DynamoDB's


def record(sequence: str) -> dict:
    return {"eventID": sequence, "eventName": "MODIFY", "dynamodb": {
        "Keys": {"deviceId": {"S": "d"}}, "SequenceNumber": sequence, "SizeBytes": 10,
        "StreamViewType": "NEW_AND_OLD_IMAGES"}}


def client(service: str):
    return boto3.session.Session().client(service, region_name="us-east-1", endpoint_url="http://localhost:1",
                                          aws_access_key_id="x", aws_secret_access_key="x")


@pytest.fixture
def poller_and_stubs():
    streams, dynamodb = client("dynamodbstreams"), client("dynamodb")
    with Stubber(streams) as stream_stub, Stubber(dynamodb) as table_stub:
        table_stub.add_response("describe_table", {"Table": {"LatestStreamArn": ARN}}, {"TableName": "devices"})
        handled = []

        def process(event, _context):
            handled.extend(item["dynamodb"]["SequenceNumber"] for item in event["Records"])
            return {"batchItemFailures": []}

        poller = StreamPoller(streams, dynamodb, "devices", process, record_filter=lambda _: True)
        yield poller, stream_stub, handled


def test_a_trimmed_data_answer_resumes_after_the_last_record_handled(poller_and_stubs):
    poller, stub, handled = poller_and_stubs
    stub.add_response("describe_stream", {"StreamDescription": {"Shards": [{"ShardId": SHARD}]}}, {"StreamArn": ARN})
    stub.add_response("get_shard_iterator", {"ShardIterator": "at-start"},
                      {"StreamArn": ARN, "ShardId": SHARD, "ShardIteratorType": "TRIM_HORIZON"})
    stub.add_response("get_records", {"Records": [record(FIRST)], "NextShardIterator": "next"},
                      {"ShardIterator": "at-start", "Limit": poller.batch_size})
    stub.add_client_error("get_records", "TrimmedDataAccessException", http_status_code=400,
                          expected_params={"ShardIterator": "next", "Limit": poller.batch_size})
    stub.add_response("get_shard_iterator", {"ShardIterator": "after-first"},
                      {"StreamArn": ARN, "ShardId": SHARD, "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                       "SequenceNumber": FIRST})
    stub.add_response("get_records", {"Records": [record(SECOND)], "NextShardIterator": "later"},
                      {"ShardIterator": "after-first", "Limit": poller.batch_size})
    for _ in range(3):
        poller.poll_once()
    assert handled == [FIRST, SECOND]  # each record once, in order, nothing lost
    stub.assert_no_pending_responses()
