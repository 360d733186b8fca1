"""`make bench` → fleet: find and count devices by their state on the fleet index, at scale, on
DynamoDB Local, beside listing the fleet and filtering it in the client.

Loads ``--devices`` (100,000) devices shaped like the reference fleet's, with four declared
fields (``FLEET``), then times, each ``--runs`` times (median and spread): a filter matching
0.1 % (first page, and all pages), a count, a group-by count, and the same answers from
listing the whole fleet (``GET /devices`` pages) and filtering in the client. It measures the
request units of each (``ReturnConsumedCapacity``), the write units an indexed report adds,
and ``--pairs`` write-then-query pairs (a device's indexed field written, then queried at
once) counting the stale answers.

Writes bench/out/fleet.{json,md} (``--out``; ``make bench UPDATE_RESULTS=1``: bench/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
for _name, _value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                      "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}.items():
    os.environ.setdefault(_name, _value)

from bench.contention import CountingClient  # noqa: E402
from functions.device_state import DeviceStateManager, FleetIndex, MergePatch, dynamodb_client, table  # noqa: E402
from functions.device_state.fleet.reindex import mark_ready  # noqa: E402
from functions.device_state.item import schema  # noqa: E402
from functions.device_state.write.store import Store  # noqa: E402
from localdev.dynamodb_local import dynamodb_local  # noqa: E402
from bench.fleet_load import clone_devices  # noqa: E402

OUT = REPO_ROOT / "bench" / "out"
FLEET = FleetIndex.parse("reported/firmware:string,reported/online:boolean,reported/battery:number,state/site:string")
RARE_FIRMWARE = "0.9-beta"  # on 0.1 % of the devices
SELECTIVE = f'eq(reported/firmware,"{RARE_FIRMWARE}")'
COUNTED = "eq(reported/online,false)"
GROUPED = ("exists(reported/firmware)", "reported/firmware")


def reference_documents(number: int, rng: random.Random, rare: bool) -> dict:
    """About 600 bytes of JSON in 15 leaves, as the reference fleet's devices."""
    firmware = RARE_FIRMWARE if rare else f"2.{min(int(rng.expovariate(0.4)), 19)}"
    return {
        "state": {"site": f"site-{number % 100:03d}", "name": f"device {number}", "room": "kitchen",
                  "owner": f"user-{number % 977:04d}", "notes": "x" * 120},
        "desired": {"brightness": rng.randint(0, 100), "color": "warm", "schedule": "evening"},
        "reported": {"firmware": firmware, "online": rng.random() < 0.7, "battery": rng.randint(0, 100),
                     "brightness": rng.randint(0, 100), "color": "warm", "rssi": -rng.randint(30, 90),
                     "temperature": rng.randint(150, 300)},
    }


def load(manager: DeviceStateManager, client, name: str, devices: int) -> None:
    """One device created through the library, then cloned (``bench.fleet_load``): its
    values and index attributes of its own, drawn in order so every load is the same."""
    rng = random.Random(29)
    rare = set(rng.sample(range(devices), max(1, devices // 1000)))
    ids = [f"dev-{number:06d}" for number in range(devices)]
    documents = {device_id: reference_documents(number, rng, number in rare) for number, device_id in enumerate(ids)}
    first = documents[ids[0]]
    manager.create(ids[0], first["state"], sections={k: first[k] for k in ("desired", "reported")})
    clone_devices(client, name, FLEET, ids[0], ids[1:], documents.__getitem__)


# The load's own record, in a partition no device can take (device ids hold no "~"): "loading",
# then how many devices the table holds. DynamoDB Local does not tag tables.
LOAD_KEY = {schema.PARTITION_KEY: {"S": "~bench-load"}, schema.SORT_KEY: {"S": "load"}}


def loaded(manager: DeviceStateManager, client, name: str, devices: int, bench: str) -> None:
    """The table ``name`` holding ``devices`` reference devices, their fields indexed. A table of an
    earlier run is reused when its load completed (its load record says how many devices it
    holds); one this bench made that holds another count, or whose load was cut short, is made
    again; a table the bench did not make (no load record) is never touched."""
    try:
        record = client.get_item(TableName=name, Key=LOAD_KEY, ConsistentRead=True).get("Item")
    except client.exceptions.ResourceNotFoundException:
        record = None
    else:
        if record is None:
            raise SystemExit(f"{bench}: table {name} exists and is not one this bench loaded: name another")
        if record["devices"]["S"] == str(devices):
            print(f"{bench}: table {name} holds {devices} devices from an earlier run", flush=True)
            return
        client.delete_table(TableName=name)
        client.get_waiter("table_not_exists").wait(TableName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 300})
    table.create_table(client, name, FLEET)
    client.put_item(TableName=name, Item={**LOAD_KEY, "devices": {"S": "loading"}})
    # No stream while loading (a quarter of DynamoDB Local's time, for records no one reads); a new one after.
    client.update_table(TableName=name, StreamSpecification={"StreamEnabled": False})
    mark_ready(Store(manager.client, manager.table_name), FLEET.fields)
    started = time.perf_counter()
    load(manager, client, name, devices)
    client.update_table(TableName=name, StreamSpecification={"StreamEnabled": True,
                                                             "StreamViewType": table.STREAM_VIEW_TYPE})
    client.put_item(TableName=name, Item={**LOAD_KEY, "devices": {"S": str(devices)}})
    print(f"{bench}: {devices} devices loaded in {time.perf_counter() - started:.1f} s", flush=True)


def timed(runs: int, work) -> dict:
    """``work()`` ``runs`` times: median and spread of seconds, and what the last run answered."""
    seconds, answer = [], None
    for _ in range(runs):
        started = time.perf_counter()
        answer = work()
        seconds.append(time.perf_counter() - started)
    return {"median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds),
            "answer": answer}


def metered(counting: CountingClient, work) -> tuple[object, float]:
    before = counting.read_units
    answer = work()
    return answer, counting.read_units - before


def all_pages(manager, text: str, limit: int = 100) -> list[str]:
    ids, cursor = [], None
    while True:
        devices, cursor = manager.query_devices(text, limit, cursor)
        ids += [device.device_id for device in devices]
        if cursor is None:
            return ids


def client_side(manager) -> dict:
    """Every device listed (GET /devices pages of 100), filtered and counted in the client."""
    matched, offline, groups, cursor = [], 0, {}, None
    while True:
        devices, cursor = manager.list_devices(limit=100, cursor=cursor)
        for device in devices:
            if device.reported.get("firmware") == RARE_FIRMWARE:
                matched.append(device.device_id)
            offline += device.reported.get("online") is False
            groups[device.reported.get("firmware")] = groups.get(device.reported.get("firmware"), 0) + 1
        if cursor is None:
            return {"matched": len(matched), "offline": offline, "groups": len(groups)}


def report_units(endpoint: str, warm: int = 20, measured: int = 20) -> dict:
    """Write units of a 2-leaf report (one of them an indexed field) with the fleet index
    declared and without it, each on a device of the reference shape."""
    figures = {}
    for label, declared in (("without index", FleetIndex()), ("with index", FLEET)):
        counting = CountingClient(dynamodb_client(endpoint, "us-east-1"))
        name = f"fleet-units-{uuid.uuid4().hex[:8]}"
        table.create_table(counting, name, declared)
        manager = DeviceStateManager(counting, name, fleet_index=declared)
        documents = reference_documents(1, random.Random(1), False)
        manager.create("u1", documents["state"], sections={k: documents[k] for k in ("desired", "reported")})
        changing, unchanging = [], []
        for value in range(warm + measured):  # the first fill the write journal as a device written often has it
            before = counting.written_units
            manager.update_with_retry("u1", MergePatch({"battery": value, "rssi": -40 - value}), section="reported")
            changing.append(counting.written_units - before)
            before = counting.written_units
            manager.update_with_retry("u1", MergePatch({"rssi": -value}), section="reported")  # no indexed field
            unchanging.append(counting.written_units - before)
        figures[label] = {"report_changing_battery": statistics.median(changing[warm:]),
                          "report_changing_no_indexed_field": statistics.median(unchanging[warm:])}
    return figures


def freshness(manager, pairs: int, devices: int) -> dict:
    rng, stale = random.Random(7), 0
    for pair in range(pairs):
        device_id = f"dev-{rng.randrange(1, devices):06d}"
        value = f"fresh-{pair}"
        manager.update_with_retry(device_id, MergePatch({"firmware": value}), section="reported")
        found, _ = manager.query_devices(f'eq(reported/firmware,"{value}")')
        count = manager.count_devices(f'eq(reported/firmware,"{value}")')["count"]
        stale += [device.device_id for device in found] != [device_id] or count != 1
    return {"pairs": pairs, "stale": stale}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--endpoint", help="a running DynamoDB Local (default: one started for the run)")
    parser.add_argument("--table", help="with --endpoint: this table, loaded once and reused by later runs")
    parser.add_argument("--data-dir", help="without --endpoint: DynamoDB Local on disk here, its table "
                                           "(fleet-DEVICES) loaded once and reused by later runs (a tmpfs, "
                                           "e.g. /dev/shm/..., loads as fast as memory)")
    parser.add_argument("--report-writes", type=int, default=20, help="reports measured, after 20 that fill the journal")
    args = parser.parse_args(argv)
    with dynamodb_local(args.endpoint, args.data_dir) as dynamodb:
        endpoint = dynamodb.endpoint
        counting = CountingClient(dynamodb_client(endpoint, "us-east-1"))
        name = args.table or (f"fleet-{args.devices}" if args.data_dir else f"fleet-{uuid.uuid4().hex[:8]}")
        manager = DeviceStateManager(counting, name, fleet_index=FLEET)
        loaded(manager, counting, name, args.devices, "fleet")

        results = {"devices": args.devices, "declared": FLEET.declaration, "runs": args.runs}
        _, units = metered(counting, lambda: manager.query_devices(SELECTIVE, 50))
        results["filter_first_page"] = {**timed(args.runs, lambda: len(manager.query_devices(SELECTIVE, 50)[0])),
                                        "read_units": units}
        _, units = metered(counting, lambda: all_pages(manager, SELECTIVE))
        results["filter_all_pages"] = {**timed(args.runs, lambda: len(all_pages(manager, SELECTIVE))),
                                       "read_units": units}
        _, units = metered(counting, lambda: manager.count_devices(COUNTED))
        results["count"] = {**timed(args.runs, lambda: manager.count_devices(COUNTED)["count"]), "read_units": units}
        _, units = metered(counting, lambda: manager.count_devices(*GROUPED))
        results["group_by_count"] = {**timed(args.runs, lambda: len(manager.count_devices(*GROUPED)["groups"])),
                                     "read_units": units}
        _, units = metered(counting, lambda: client_side(manager))
        results["client_side_list_and_filter"] = {**timed(max(1, args.runs // 3), lambda: client_side(manager)),
                                                  "read_units": units}
        expected = results["client_side_list_and_filter"]["answer"]
        assert results["filter_all_pages"]["answer"] == expected["matched"], "the filter and the client disagree"
        assert results["count"]["answer"] == expected["offline"], "the count and the client disagree"
        assert results["group_by_count"]["answer"] == expected["groups"], "the group-by and the client disagree"
        listing = results["client_side_list_and_filter"]["median_s"]
        results["speedup"] = {kind: listing / results[kind]["median_s"]
                              for kind in ("filter_first_page", "filter_all_pages", "count", "group_by_count")}
        results["report_write_units"] = report_units(endpoint, measured=args.report_writes)
        results["freshness"] = freshness(manager, args.pairs, args.devices)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fleet.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "fleet.md").write_text(markdown(results))
    print(markdown(results), flush=True)
    return results


def markdown(results: dict) -> str:
    rows = [("a filter matching 0.1 %, first page (50)", "filter_first_page"),
            ("the same filter, all pages", "filter_all_pages"),
            (f"count ({COUNTED})", "count"),
            (f"group-by count ({GROUPED[0]} by {GROUPED[1]})", "group_by_count"),
            ("listing the fleet and filtering, counting, grouping in the client", "client_side_list_and_filter")]
    lines = [f"# Fleet query at {results['devices']:,} devices (DynamoDB Local)", "",
             f"From `bench/fleet.py` (`make bench`); declared: `{results['declared']}`. Seconds are the median "
             f"[min–max] of {results['runs']} runs on this machine (the client-side listing: "
             f"{max(1, results['runs'] // 3)}); read units from `ReturnConsumedCapacity`.", "",
             "| what | seconds | read units | faster than the client-side listing |", "|---|---|---|---|"]
    for label, key in rows:
        figure = results[key]
        speedup = results["speedup"].get(key)
        lines.append(f"| {label} | {figure['median_s']:.3f} [{figure['min_s']:.3f}–{figure['max_s']:.3f}] | "
                     f"{figure['read_units']:.1f} | {f'{speedup:,.0f}x' if speedup else '–'} |")
    units = results["report_write_units"]
    lines += ["", "| a 2-leaf report | write units, changing an indexed field | changing none |", "|---|---|---|"]
    lines += [f"| {label} | {figure['report_changing_battery']:.1f} | {figure['report_changing_no_indexed_field']:.1f} |"
              for label, figure in units.items()]
    fresh = results["freshness"]
    lines += ["", f"Write-then-query pairs: {fresh['pairs']}, stale answers: {fresh['stale']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
