"""`make bench` (fourth part): push over WebSocket through the real dev server (its WebSocket
process, stream processor and fan-out consumer) on DynamoDB Local.

- Delivery: --subscribers WebSocket clients spread over --devices devices, each subscribed
  from its device's current version, while one writer PATCHes the devices in turn at
  --rate writes a second for --seconds. Latency = the time a change is received minus the
  time its write was acknowledged (p50/p95/max over every subscriber and change); lost =
  changes a subscriber never received (must be 0).
- Cost of a waiting client, in Lambda concurrency: a long-polling client is inside a handler
  all the time it waits (1.0 by construction: measured here as the share of wall time its
  polls spent in the server); a WebSocket subscriber costs the fan-out's time per delivered
  message (measured from the fan-out handler's own timing over the same devices) times the
  messages it gets a second.

Writes bench/out/push.{json,md} (untracked; `make bench UPDATE_RESULTS=1`: bench/results/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
for _name, _value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                      "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
    os.environ.setdefault(_name, _value)

from bench import credentials  # noqa: E402
from bench.feed import percentile, request, wait_for  # noqa: E402
from localdev.dynamodb_local import dynamodb_local, free_port  # noqa: E402

OUT = REPO_ROOT / "bench" / "out"


async def _subscriber(port: int, device: str, since: int, received: dict, ready: asyncio.Event, stop: asyncio.Event):
    from websockets.asyncio.client import connect

    async with connect(f"ws://127.0.0.1:{port}/ws", additional_headers=credentials.HEADERS, open_timeout=60,
                       max_queue=None) as client:
        await client.send(json.dumps({"action": "subscribe", "deviceId": device, "since": since}))
        assert json.loads(await client.recv())["type"] == "subscribed"
        ready.set()
        while not stop.is_set():
            try:
                message = json.loads(await asyncio.wait_for(client.recv(), 0.5))
            except asyncio.TimeoutError:
                continue
            if message.get("type") == "change":
                received.setdefault(message["version"], time.monotonic())  # the first copy counts


def delivery(port: int, devices: list[str], subscribers: int, rate: float, seconds: float) -> dict:
    current = {device: 1 for device in devices}
    acknowledged: dict[tuple[str, int], float] = {}
    receipts: list[tuple[str, dict]] = []

    async def run():
        stop = asyncio.Event()
        tasks, readiness = [], []
        for number in range(subscribers):
            device = devices[number % len(devices)]
            received: dict[int, float] = {}
            receipts.append((device, received))
            ready = asyncio.Event()
            readiness.append(ready)
            tasks.append(asyncio.create_task(_subscriber(port, device, current[device], received, ready, stop)))
            if number % 20 == 19:
                await asyncio.sleep(0.05)  # connect in waves, as a fleet would
        await asyncio.wait_for(asyncio.gather(*(ready.wait() for ready in readiness)), 120)
        writer = threading.Thread(target=write)
        writer.start()
        await asyncio.get_running_loop().run_in_executor(None, writer.join)
        deadline = time.monotonic() + 15  # the last changes through the stream, the processor and the fan-out
        while time.monotonic() < deadline and not all(
                all(version in received for (written, version) in acknowledged if written == device)
                for device, received in receipts):
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*tasks)

    def write():
        started, count = time.monotonic(), 0
        while time.monotonic() - started < seconds:
            device = devices[count % len(devices)]
            status, body = request(port, "PATCH", f"/devices/{device}", {"n": count},
                                   {"Content-Type": "application/merge-patch+json"})
            assert status == 200, status
            acknowledged[(device, json.loads(body)["version"])] = time.monotonic()
            count += 1
            time.sleep(max(0.0, started + count / rate - time.monotonic()))

    asyncio.run(run())
    latencies, lost = [], 0
    for device, received in receipts:
        for (written_device, version), at in acknowledged.items():
            if written_device != device:
                continue
            if version in received:
                latencies.append((received[version] - at) * 1000)
            else:
                lost += 1
    return {"subscribers": subscribers, "devices": len(devices), "writes": len(acknowledged),
            "messages": len(latencies), "lost": lost, "latency_ms_p50": percentile(latencies, 0.5),
            "latency_ms_p95": percentile(latencies, 0.95), "latency_ms_max": round(max(latencies), 1),
            "messages_per_subscriber_second": round(len(latencies) / subscribers / seconds, 3)}


def fan_out_seconds_per_message(endpoint: str, table_name: str, device: str) -> float:
    """The fan-out's own time per message delivered, from its handler over one device's
    subscribers, posting to a connections API that answers at once (what the post itself
    costs is API Gateway's, not the function's)."""
    from functions.device_state import ChangeLog, dynamodb_client
    from functions.push.delivery import Delivery
    from functions.push.subscriptions import Subscriptions

    # Wired as functions.push.services wires them, but on this table: its process-wide cache
    # and the environment may hold another table's (the smoke test runs beside other tests).
    client = dynamodb_client(endpoint)
    subscriptions = Subscriptions(client, table_name)
    count = {"posts": 0}

    def post(_connection, _message):
        count["posts"] += 1

    delivery = Delivery(subscriptions, ChangeLog(client, table_name), post)
    # Fresh subscriptions of the device (on connections that do not exist) from version 0: the
    # handler's work for every version of the device, to each of them.
    for number in range(10):
        subscriptions.open(f"bench-{number}", "bench")
        subscriptions.subscribe(f"bench-{number}", device, 0, ("state", "desired", "reported"))
    subscribers = [subscription for subscription in subscriptions.of_device(device)
                   if subscription.connection_id.startswith("bench-")]
    started = time.perf_counter()
    for subscription in subscribers:
        delivery.advance(subscription)
    elapsed = time.perf_counter() - started
    if not count["posts"]:
        raise RuntimeError(f"the fan-out delivered nothing to {len(subscribers)} subscriptions of {device}")
    return elapsed / count["posts"]


def long_poll_share(port: int, device: str, polls: int, wait: int) -> float:
    """The share of a long-polling client's time spent inside a poll (the Lambda it holds)."""
    since = json.loads(request(port, "GET", f"/devices/{device}")[1])["version"]
    inside, started = 0.0, time.monotonic()
    for _ in range(polls):
        began = time.monotonic()
        request(port, "GET", f"/devices/{device}/changes?since={since}&waitSeconds={wait}")
        inside += time.monotonic() - began
    return round(inside / (time.monotonic() - started), 3)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--devices", type=int, default=20)
    parser.add_argument("--rate", type=float, default=10.0, help="writes a second, over all devices")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--endpoint", help="a running DynamoDB Local (default: one started for the run)")
    args = parser.parse_args(argv)
    table_name = f"push-{uuid.uuid4().hex[:8]}"
    with dynamodb_local(args.endpoint) as dynamodb:
        port = free_port()
        env = dict(os.environ, **credentials.server_environment(), DYNAMODB_ENDPOINT=dynamodb.endpoint,
                   TABLE_NAME=table_name, PORT=str(port), WORKERS="4", POWERTOOLS_LOG_LEVEL="ERROR",
                   CHANGE_EVENTS_FILE=os.devnull)
        server = subprocess.Popen([sys.executable, "-m", "localdev.server"], env=env, cwd=REPO_ROOT,
                                  stdout=subprocess.DEVNULL, stderr=open(os.environ.get("PUSH_BENCH_LOG", os.devnull), "w"))
        try:
            wait_for(port)
            devices = [f"bench-{number}" for number in range(args.devices)]
            for device in devices:
                assert request(port, "POST", "/devices", {"deviceId": device, "state": {"n": 0}})[0] == 201
            result = delivery(port, devices, args.subscribers, args.rate, args.seconds)
            per_message = fan_out_seconds_per_message(dynamodb.endpoint, table_name, devices[0])
            result["fan_out_ms_per_message"] = round(per_message * 1000, 3)
            result["websocket_concurrency_per_subscriber"] = round(
                per_message * result["messages_per_subscriber_second"], 6)
            result["long_poll_concurrency_per_client"] = long_poll_share(port, devices[0], polls=2, wait=2)
        finally:
            server.terminate()
            server.wait(timeout=30)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "push.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"Push over WebSocket ({result['subscribers']} subscribers on {result['devices']} devices, "
        f"{result['writes']} writes at {args.rate}/s, DynamoDB Local): write acknowledged -> message received "
        f"p50 {result['latency_ms_p50']} ms, p95 {result['latency_ms_p95']} ms, max {result['latency_ms_max']} ms; "
        f"{result['messages']} messages, {result['lost']} lost",
        f"Lambda concurrency a waiting client costs: long-poll {result['long_poll_concurrency_per_client']} "
        f"(inside a handler all the time it waits); WebSocket {result['websocket_concurrency_per_subscriber']} "
        f"({result['fan_out_ms_per_message']} ms of fan-out per message x "
        f"{result['messages_per_subscriber_second']} messages/s)",
    ]
    (out / "push.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
