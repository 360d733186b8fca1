"""How long one device's failing stream record holds another device's change back.

Run: .venv/bin/python -m bench.poison_delay [repeats]

On DynamoDB Local's real stream, with the local poller (localdev/stream.py) and the
processor's own ``process`` (functions/changes/handler.py): device "poison" gets a change
whose every write attempt fails; 0.3 s later device "healthy" gets one. Printed: seconds
from the healthy write until its change is in the feed, per run, with median and spread.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time
import uuid

for _name, _value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}.items():
    os.environ.setdefault(_name, _value)

import boto3  # noqa: E402

from functions.changes.events import LogPublisher  # noqa: E402
from functions.changes.handler import process  # noqa: E402
from functions.device_state import DeviceStateManager  # noqa: E402
from functions.device_state.feed.items import change_of  # noqa: E402
from functions.device_state.feed.log import ChangeLog  # noqa: E402
from functions.device_state.client import dynamodb_client  # noqa: E402
from functions.device_state.table import create_table  # noqa: E402
from localdev.dynamodb_local import DynamoDBLocal  # noqa: E402
from localdev.stream import StreamPoller  # noqa: E402


class PoisonLog(ChangeLog):
    def record(self, old_image, new_image, **options):
        change = change_of(old_image, new_image)
        if change is not None and change.device_id == "poison":
            raise RuntimeError("injected failure")
        return super().record(old_image, new_image, **options)


def one_run(endpoint: str) -> float:
    client = dynamodb_client(endpoint, "us-east-1")
    name = f"poison-{uuid.uuid4().hex[:8]}"
    create_table(client, name)
    manager, log = DeviceStateManager(client, name), ChangeLog(client, name)
    streams = boto3.client("dynamodbstreams", endpoint_url=endpoint, region_name="us-east-1")
    poller = StreamPoller(streams, client, name,
                          functools.partial(process, log=PoisonLog(client, name), events=LogPublisher())).start()
    try:
        manager.create("poison", {"n": 0})
        time.sleep(0.3)
        manager.create("healthy", {"n": 0})
        started = time.monotonic()
        while not log.read("healthy", 0, 1):
            time.sleep(0.02)
        return time.monotonic() - started
    finally:
        poller.stop()
        client.delete_table(TableName=name)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    server = DynamoDBLocal().start()
    try:
        delays = [one_run(server.endpoint) for _ in range(repeats)]
    finally:
        server.stop()
    for delay in delays:
        print(f"healthy device's change reached the feed after {delay:.2f} s")
    print(f"median {statistics.median(delays):.2f} s, min {min(delays):.2f} s, max {max(delays):.2f} s "
          f"over {repeats} runs")


if __name__ == "__main__":
    main()
