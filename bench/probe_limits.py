"""Probe DynamoDB Local's breaking points for the limits this service states.

Run: .venv/bin/python -m bench.probe_limits

For member names it stores a state item holding one member of N bytes (the way a state
write does), then writes the change item the feed writes, reads the item back and reads
the table's stream; it reports the largest N for which all of that works, by bisection.
"""

from __future__ import annotations

import os

for _name, _value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}.items():
    os.environ.setdefault(_name, _value)

import boto3  # noqa: E402

from functions.device_state.client import dynamodb_client  # noqa: E402
from functions.device_state.table import create_table  # noqa: E402
from localdev.dynamodb_local import DynamoDBLocal  # noqa: E402


def member_name_works(client, streams, table: str, size: int) -> tuple[bool, str]:
    name = "n" * size
    device = f"probe-{size}"
    try:
        client.put_item(TableName=table, Item={"deviceId": {"S": device}, "sk": {"S": "state"},
                                               "version": {"N": "1"}, "state": {"M": {name: {"N": "1"}}}})
        client.get_item(TableName=table, Key={"deviceId": {"S": device}, "sk": {"S": "state"}}, ConsistentRead=True)
        client.update_item(TableName=table, Key={"deviceId": {"S": device}, "sk": {"S": "state"}},
                           UpdateExpression="SET #s.#n = :v", ExpressionAttributeNames={"#s": "state", "#n": name},
                           ExpressionAttributeValues={":v": {"N": "2"}})
        arn = client.describe_table(TableName=table)["Table"]["LatestStreamArn"]
        for shard in streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"]:
            iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard["ShardId"],
                                                  ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
            streams.get_records(ShardIterator=iterator, Limit=1000)
    except Exception as error:  # noqa: BLE001 - a probe reports whatever breaks
        return False, f"{type(error).__name__}: {str(error)[:120]}"
    return True, "ok"


def depth_works(client, streams, table: str, depth: int) -> tuple[bool, str]:
    """A state attribute of ``depth`` levels of maps in all (the state map is level 1)."""
    value = {"N": "1"}
    for _ in range(depth):
        value = {"M": {"a": value}}
    try:
        client.put_item(TableName=table, Item={"deviceId": {"S": "d"}, "sk": {"S": "state"}, "state": value})
    except Exception as error:  # noqa: BLE001
        return False, f"{type(error).__name__}: {str(error)[:120]}"
    return True, "ok"


def item_bytes_works(client, streams, table: str, size: int) -> tuple[bool, str]:
    """An item of ``size`` bytes by DynamoDB's rules: keys (deviceId "d", sk "state") and one string."""
    overhead = len("deviceId") + 1 + len("sk") + len("state") + len("blob")
    try:
        client.put_item(TableName=table, Item={"deviceId": {"S": "d"}, "sk": {"S": "state"},
                                               "blob": {"S": "x" * (size - overhead)}})
    except Exception as error:  # noqa: BLE001
        return False, f"{type(error).__name__}: {str(error)[:120]}"
    return True, "ok"


def largest(client, streams, what: str, works, low: int, high: int) -> int:
    why = ""
    while low < high:
        middle = (low + high + 1) // 2
        table = f"probe-{what.replace(' ', '-')}-{middle}"
        create_table(client, table)
        ok, reason = works(client, streams, table, middle)
        client.delete_table(TableName=table)
        if ok:
            low = middle
        else:
            high, why = middle - 1, reason
        print(f"{what} {middle}: {reason}", flush=True)
    print(f"largest {what} DynamoDB Local accepts: {low} ({why})", flush=True)
    return low


def main() -> None:
    server = DynamoDBLocal()
    server.start()
    try:
        client = dynamodb_client(server.endpoint, "us-east-1")
        streams = boto3.client("dynamodbstreams", endpoint_url=server.endpoint, region_name="us-east-1")
        results = {
            "member name bytes (stored, updated, streamed)": largest(client, streams, "member name bytes",
                                                                     member_name_works, 1, 70000),
            "state nesting levels": largest(client, streams, "state nesting levels", depth_works, 1, 64),
            "item bytes": largest(client, streams, "item bytes", item_bytes_works, 1000, 500 * 1024),
        }
        for what, value in results.items():
            print(f"SUMMARY {what}: {value}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
