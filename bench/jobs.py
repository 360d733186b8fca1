"""`make bench` → jobs: a job of ``--devices`` (10,000) devices on DynamoDB Local, beside the same
desired write sent directly to as many other devices with the same concurrency, in one run:

- executions per second against direct writes per second (the goal: at least 0.8x), and the
  seconds from creating the job to every execution IN_PROGRESS;
- request units per execution, from QUEUED to SUCCEEDED (the job's write, the device's confirming
  report, the stream processor's finals with the counts, the runner's pages), against one plain
  desired write plus its confirming report (the goal: at most 1.5x), transactions billed at 2 write
  units per item as DynamoDB bills them (DynamoDB Local under-reports them); dollars per 100,000
  executions against AWS IoT Jobs' $300;
- a paced job's rate (``--rate`` per minute over ``--rate-seconds``) against its ``maxPerMinute``;
- double writes and lost executions: each targeted device's version moved exactly once.

Writes bench/out/jobs.{json,md} (``--out``; ``make bench UPDATE_RESULTS=1``: bench/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from datetime import datetime
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
for _name, _value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                      "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
    os.environ.setdefault(_name, _value)

import boto3  # noqa: E402

from functions.device_state import DeviceStateManager, FleetIndex, MergePatch, dynamodb_client, table  # noqa: E402
from functions.device_state.runtime import UpdateObserver  # noqa: E402
from functions.device_state.write.store import Store  # noqa: E402
from localdev.dynamodb_local import dynamodb_local  # noqa: E402
from bench.fleet_load import clone_devices  # noqa: E402
from localdev.stream import StreamPoller, lambda_record  # noqa: E402

OUT = REPO_ROOT / "bench" / "out"
FLEET = FleetIndex.parse("state/site:string")
WRITE_PRICE, READ_PRICE = 1.25e-6, 0.25e-6  # on demand, us-east-1, per request unit
IOT_JOBS_PER_100K = 300.0


class Meter(UpdateObserver):
    """Request units as DynamoDB bills them: what DynamoDB Local reports, but a transaction's
    items at 2 write units each (see ``Billed``)."""

    def __init__(self):
        self.read = self.write = 0.0

    def consumed(self, operation, read_units, write_units):
        if operation != "transact_write_items":
            self.read += read_units
            self.write += write_units


class Billed:
    """A client that bills each transaction 2 write units per item (items under 1 KB)."""

    def __init__(self, client, meter: Meter):
        self._client, self._meter = client, meter

    def __getattr__(self, name):
        call = getattr(self._client, name)
        if name != "transact_write_items":
            return call

        def billed(**request):
            answer = call(**request)
            self._meter.write += 2 * len(request["TransactItems"])
            return answer
        return billed


def load(manager: DeviceStateManager, client, name: str, site: str, count: int) -> list[str]:
    """``count`` devices at ``site``: one created through the library, the rest cloned from it."""
    ids = [f"{site}-{number:06d}" for number in range(count)]
    manager.create(ids[0], {"site": site}, sections={"desired": {}, "reported": {"battery": 50}})
    clone_devices(client, name, FLEET, ids[0], ids[1:], lambda _: {"state": {"site": site}})
    return ids


def versions(store, ids) -> dict:
    found = {}
    for start in range(0, len(ids), 100):
        found.update(store.batch_get_states(ids[start:start + 100]))
    return {device_id: int(found[device_id][table.VERSION]["N"]) for device_id in ids}


def stream_finals(endpoint, client, name, tracker) -> None:
    """What the stream processor does with the job's devices' changes: every record so far."""
    streams = boto3.session.Session().client("dynamodbstreams", endpoint_url=endpoint, region_name="us-east-1")
    poller = StreamPoller(streams, client, name, lambda event, context: {"batchItemFailures": []})
    batch = []
    for shard in streams.describe_stream(StreamArn=poller.stream_arn)["StreamDescription"]["Shards"]:
        iterator = streams.get_shard_iterator(StreamArn=poller.stream_arn, ShardId=shard["ShardId"],
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            page = streams.get_records(ShardIterator=iterator, Limit=1000)
            for record in page["Records"]:
                batch.append(lambda_record(record, poller.stream_arn)["dynamodb"])
                if len(batch) == 100:
                    for one in batch:
                        tracker.see(one.get("OldImage"), one.get("NewImage"))
                    tracker.flush()
                    batch = []
            iterator = page.get("NextShardIterator") if page["Records"] else None
    for one in batch:
        tracker.see(one.get("OldImage"), one.get("NewImage"))
    tracker.flush()


def run(endpoint: str, devices: int, concurrency: int, rate: int, rate_seconds: float) -> dict:
    raw = dynamodb_client(endpoint, "us-east-1")
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    table.create_table(raw, name, FLEET)
    try:
        setup = DeviceStateManager(raw, name, fleet_index=FLEET)
        setup.reindex()  # no device yet: the field is ready at once
        direct_ids = load(setup, raw, name, "direct", devices)
        job_ids = load(setup, raw, name, "job", devices)
        paced = max(2, int(rate * rate_seconds / 60) + 1)
        paced_ids = load(setup, raw, name, "paced", paced)
        # the same desired write, sent directly with the same concurrency
        plain = Meter()
        direct = DeviceStateManager(Billed(raw, plain), name, fleet_index=FLEET, observer=plain)
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            list(pool.map(lambda device_id: direct.update_with_retry(device_id, MergePatch({"mode": "eco"}),
                                                                     section="desired"), direct_ids))
        direct_seconds = time.perf_counter() - started
        for device_id in direct_ids:
            direct.as_device(device_id).update_with_retry(device_id, MergePatch({"mode": "eco"}), section="reported")
        # the job: created, run until every execution is IN_PROGRESS, confirmed, tracked, completed
        job_meter = Meter()
        jobs_manager = DeviceStateManager(Billed(raw, job_meter), name, fleet_index=FLEET, observer=job_meter)
        store = Store(raw, name)
        before = versions(store, job_ids)
        started = time.perf_counter()
        jobs_manager.jobs().create({"jobId": "bench", "filter": 'eq(state/site,"job")', "desired": {"mode": "eco"}})
        runner = jobs_manager.job_runner(concurrency=concurrency)
        deadline = time.monotonic() + 600
        while jobs_manager.jobs().head("bench").counts_by_state["IN_PROGRESS"] < devices:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the job did not write its {devices} devices in 10 minutes")
            runner.run("bench", 30)
        job_seconds = time.perf_counter() - started
        for device_id in job_ids:
            jobs_manager.as_device(device_id).update_with_retry(device_id, MergePatch({"mode": "eco"}),
                                                                section="reported")
        stream_finals(endpoint, raw, name, jobs_manager.job_tracker())
        runner.run("bench", 30)
        head = jobs_manager.jobs().head("bench")
        after = versions(store, job_ids)
        moved = [after[device_id] - before[device_id] for device_id in job_ids]
        # a paced job: its rate over the run against maxPerMinute
        pace = DeviceStateManager(raw, name, fleet_index=FLEET)
        pace.jobs().create({"jobId": "paced", "deviceIds": paced_ids[:1000], "desired": {"mode": "eco"},
                            "rollout": {"maxPerMinute": rate}})
        pace_runner = pace.job_runner()
        deadline = time.monotonic() + rate_seconds + 60
        while pace.jobs().head("paced").counts_by_state["QUEUED"] and time.monotonic() < deadline:
            pace_runner.run("paced", 5)
        listed, cursor = pace.jobs().executions("paced", "IN_PROGRESS", 100)
        while cursor:
            page, cursor = pace.jobs().executions("paced", "IN_PROGRESS", 100, cursor)
            listed += page
        times = sorted(execution["updatedAt"] for execution in listed)
        written = pace.jobs().head("paced").counts_by_state["IN_PROGRESS"]
        stamps = [datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() for stamp in times]
        span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0
        measured_rate = (len(stamps) - 1) / span * 60 if span else None
    finally:
        raw.delete_table(TableName=name)
    per_execution = {"write_units": job_meter.write / devices, "read_units": job_meter.read / devices}
    by_hand = {"write_units": plain.write / devices, "read_units": plain.read / devices}
    dollars = 100_000 * (per_execution["write_units"] * WRITE_PRICE + per_execution["read_units"] * READ_PRICE)
    return {
        "devices": devices, "concurrency": concurrency,
        "direct_writes_per_s": devices / direct_seconds, "executions_per_s": devices / job_seconds,
        "throughput_ratio": direct_seconds / job_seconds, "seconds_to_all_in_progress": job_seconds,
        "units_per_execution": per_execution, "units_by_hand": by_hand,
        "units_ratio": (per_execution["write_units"] * WRITE_PRICE + per_execution["read_units"] * READ_PRICE)
        / (by_hand["write_units"] * WRITE_PRICE + by_hand["read_units"] * READ_PRICE),
        "dollars_per_100k_executions": dollars, "iot_jobs_dollars_per_100k": IOT_JOBS_PER_100K,
        "counts": head.counts_by_state, "double_writes": sum(1 for delta in moved if delta > 2),
        "lost_executions": sum(1 for delta in moved if delta < 2),
        "rollout": {"max_per_minute": rate, "written": written, "measured_per_minute": measured_rate,
                    "ratio": (measured_rate / rate) if measured_rate else None},
    }


def markdown(result: dict) -> str:
    units, by_hand = result["units_per_execution"], result["units_by_hand"]
    rollout = result["rollout"]
    return "\n".join([
        f"# Jobs: {result['devices']:,} devices on DynamoDB Local, {result['concurrency']} writes in flight", "",
        "| what | job | by hand | ratio |", "|---|---|---|---|",
        f"| writes per second | {result['executions_per_s']:.0f} | {result['direct_writes_per_s']:.0f} | "
        f"{result['throughput_ratio']:.2f}x |",
        f"| request units per execution (write, read), to SUCCEEDED | {units['write_units']:.2f}, "
        f"{units['read_units']:.2f} | {by_hand['write_units']:.2f}, {by_hand['read_units']:.2f} | "
        f"{result['units_ratio']:.2f}x in dollars |",
        f"| dollars per 100,000 executions | ${result['dollars_per_100k_executions']:.2f} | "
        f"AWS IoT Jobs ${result['iot_jobs_dollars_per_100k']:.0f} | |", "",
        f"Seconds from POST /jobs to every execution IN_PROGRESS: {result['seconds_to_all_in_progress']:.1f}. "
        f"Double writes: {result['double_writes']}; lost executions: {result['lost_executions']}.",
        f"A paced job at maxPerMinute {rollout['max_per_minute']}: {rollout['measured_per_minute'] or 0:.0f} a "
        f"minute over its first {rollout['written']} writes.", ""])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rate", type=int, default=600, help="the paced job's maxPerMinute")
    parser.add_argument("--rate-seconds", type=float, default=60.0, help="how long the paced job runs")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--endpoint", help="a running DynamoDB Local (default: one started for the run)")
    args = parser.parse_args(argv)
    with dynamodb_local(args.endpoint) as dynamodb:
        result = run(dynamodb.endpoint, args.devices, args.concurrency, args.rate, args.rate_seconds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "jobs.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "jobs.md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
