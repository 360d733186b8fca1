"""`make bench` (second part): the change feed on DynamoDB Local, through the real dev server
and its stream processor.

- Feed lag: a PATCH is acknowledged at t0 with version v; a long-poll
  GET /devices/{id}/changes?since=v-1&waitSeconds=10 sent right then returns change v at
  t1. Lag = t1 - t0 (p50/p95 over --writes sequential writes), including the long-poll's
  own backoff between queries.
- Write capacity: what one change item costs per device write, in WCU (1 per started KB of
  the item written, DynamoDB's rule for a standard put), beside what the state write itself
  costs, for small, medium and large states.

Writes bench/out/feed.{json,md} (untracked; `make bench UPDATE_RESULTS=1`: bench/results/) and
prints the figures.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
for _name, _value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                      "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
    os.environ.setdefault(_name, _value)

from functions.device_state.feed.items import change_sk  # noqa: E402
from functions.device_state.client import dynamodb_client  # noqa: E402
from functions.device_state.table import state_key  # noqa: E402
from functions.device_state.model.values import item_size  # noqa: E402
from bench import credentials  # noqa: E402
from localdev.dynamodb_local import dynamodb_local, free_port  # noqa: E402

OUT = REPO_ROOT / "bench" / "out"  # untracked; --out bench/results updates the reference results
STATE_SIZES = {"small (~100 B)": 100, "medium (~10 KB)": 10_000, "large (~100 KB)": 100_000}


def request(port: int, method: str, path: str, body=None, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=data, headers={"Content-Type": "application/json", **credentials.HEADERS,
                                                             **(headers or {})})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(math.ceil(fraction * len(ordered))) - 1)], 1)


def feed_lag(port: int, writes: int) -> list[float]:
    assert request(port, "PUT", "/devices/lag", {"state": {"n": 0}})[0] == 201
    lags = []
    for n in range(1, writes + 1):
        status, body = request(port, "PATCH", "/devices/lag", {"n": n},
                               {"Content-Type": "application/merge-patch+json"})
        acknowledged = time.perf_counter()
        assert status == 200, body
        version = json.loads(body)["version"]
        status, body = request(port, "GET", f"/devices/lag/changes?since={version - 1}&waitSeconds=10")
        seen = time.perf_counter()
        changes = json.loads(body)["changes"]
        assert status == 200 and changes and changes[0]["version"] == version, body
        lags.append((seen - acknowledged) * 1000)
    return lags


def write_capacity(port: int, endpoint: str, table_name: str) -> list[dict]:
    client = dynamodb_client(endpoint, "us-east-1")
    rows = []
    for label, size in STATE_SIZES.items():
        device = f"wcu-{size}"
        assert request(port, "PUT", f"/devices/{device}", {"state": {"blob": "x" * size, "n": 0}})[0] == 201
        assert request(port, "PATCH", f"/devices/{device}", {"n": 1},
                       {"Content-Type": "application/merge-patch+json"})[0] == 200
        assert json.loads(request(port, "GET", f"/devices/{device}/changes?since=1&waitSeconds=10")[1])["changes"]
        state = client.get_item(TableName=table_name, Key=state_key(device), ConsistentRead=True)["Item"]
        change = client.get_item(TableName=table_name, ConsistentRead=True, Key={
            "deviceId": {"S": device}, "sk": {"S": change_sk(2)}})["Item"]
        state_bytes, change_bytes = item_size(state), item_size(change)
        rows.append({"state": label, "state_item_bytes": state_bytes, "state_write_wcu": math.ceil(state_bytes / 1024),
                     "change_item_bytes": change_bytes, "change_write_wcu": math.ceil(change_bytes / 1024)})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=200, help="sequential writes for the lag figure")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--endpoint", help="a running DynamoDB Local (default: one started for the run)")
    args = parser.parse_args(argv)
    table_name = f"feed-{uuid.uuid4().hex[:8]}"
    with dynamodb_local(args.endpoint) as dynamodb:
        port = free_port()
        env = dict(os.environ, **credentials.server_environment(), DYNAMODB_ENDPOINT=dynamodb.endpoint,
                   TABLE_NAME=table_name, PORT=str(port),
                   WORKERS="2", POWERTOOLS_LOG_LEVEL="ERROR", CHANGE_EVENTS_FILE=os.devnull)
        server = subprocess.Popen([sys.executable, "-m", "localdev.server"], env=env, cwd=REPO_ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(port)
            lags = feed_lag(port, args.writes)
            capacity = write_capacity(port, dynamodb.endpoint, table_name)
        finally:
            server.terminate()
            server.wait(timeout=30)
    result = {"writes": args.writes, "feed_lag_ms_p50": percentile(lags, 0.5),
              "feed_lag_ms_p95": percentile(lags, 0.95), "feed_lag_ms_max": round(max(lags), 1),
              "write_capacity": capacity}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "feed.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [f"Feed lag (write acknowledged -> change on /changes, long-poll, {args.writes} writes, DynamoDB Local): "
             f"p50 {result['feed_lag_ms_p50']} ms, p95 {result['feed_lag_ms_p95']} ms, "
             f"max {result['feed_lag_ms_max']} ms", "",
             "| state | state item | state write WCU | change item | change write WCU |", "|---|---|---|---|---|"]
    lines += [f"| {r['state']} | {r['state_item_bytes']} B | {r['state_write_wcu']} | {r['change_item_bytes']} B | "
              f"{r['change_write_wcu']} |" for r in capacity]
    (out / "feed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def wait_for(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if request(port, "GET", "/openapi.json")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the local server did not start")


if __name__ == "__main__":
    main()
