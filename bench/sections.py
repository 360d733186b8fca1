"""`make bench` (sections part): 16 writers each reporting its own member of one device's
``reported`` through the library on DynamoDB Local. Reports compile to one UpdateItem that
sets the member and its metadata, with no read and no version condition, so there is
nothing to conflict: calls per update, failed conditional writes, lost reports and
success rate are printed, and the bytes per-leaf metadata adds to the item.

Writes sections.json into bench/out/ (untracked; ``--out bench/results`` updates the
committed reference result) and prints the figures."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.contention import CountingClient  # noqa: E402  (also sets dummy AWS credentials)
from functions.device_state import DeviceStateManager, MergePatch, table  # noqa: E402
from functions.device_state.client import dynamodb_client  # noqa: E402
from functions.device_state.model.values import item_size  # noqa: E402
from localdev.dynamodb_local import dynamodb_local  # noqa: E402

OUT = REPO_ROOT / "bench" / "out"  # untracked; --out bench/results updates the reference results


def reporters(manager: DeviceStateManager, device_id: str, writers: int, updates: int) -> dict:
    barrier = threading.Barrier(writers)
    acknowledged, errors, lock = [], [], threading.Lock()

    def writer(index):
        barrier.wait()
        for step in range(updates):
            try:
                manager.update_with_retry(device_id, MergePatch({f"sensor{index}": step}), section="reported")
                with lock:
                    acknowledged.append((index, step))
            except Exception as error:  # noqa: BLE001 - counted as a failure
                with lock:
                    errors.append(repr(error))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"acknowledged": acknowledged, "errors": errors, "seconds": time.monotonic() - started}


def metadata_bytes_per_leaf(manager: DeviceStateManager, client, name: str, leaves: int) -> float:
    """Item bytes with per-leaf metadata minus the same item without it, per leaf."""
    device_id = f"meta-{uuid.uuid4().hex[:6]}"
    manager.create(device_id, {}, sections={"reported": {f"sensor{i}": i for i in range(leaves)}})
    item = client.get_item(TableName=name, Key=table.state_key(device_id), ConsistentRead=True)["Item"]
    without = {key: value for key, value in item.items() if key != table.META_REPORTED}
    return (item_size(item) - item_size(without)) / leaves


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writers", type=int, default=16)
    parser.add_argument("--updates", type=int, default=20, help="reports per writer")
    parser.add_argument("--out", type=Path, default=OUT, help="where sections.json goes")
    parser.add_argument("--endpoint", help="a running DynamoDB Local (default: one started for the run)")
    args = parser.parse_args(argv)
    with dynamodb_local(args.endpoint) as dynamodb:
        client = dynamodb_client(dynamodb.endpoint, "us-east-1")
        name = f"bench-sections-{uuid.uuid4().hex[:6]}"
        table.create_table(client, name)
        counting = CountingClient(client)
        manager = DeviceStateManager(counting, name)
        manager.create("hot", {})
        counting.calls, counting.failed_conditions = 0, 0
        run = reporters(manager, "hot", args.writers, args.updates)
        calls, failed = counting.calls, counting.failed_conditions
        final = DeviceStateManager(client, name).get("hot")
        ok = len(run["acknowledged"])
        lost = [f"sensor{i}" for i in range(args.writers)
                if final.reported.get(f"sensor{i}") != args.updates - 1]
        figures = {
            "writers": args.writers, "updatesPerWriter": args.updates, "acknowledged": ok,
            "successRate": round(ok / (args.writers * args.updates), 4),
            "callsPerUpdate": round(calls / ok, 3) if ok else None,
            "failedConditionalWritesPerUpdate": round(failed / ok, 3) if ok else None,
            "lostReports": len(lost), "versionIsOnePlusAcknowledged": final.version == 1 + ok,
            "updatesPerSecond": round(ok / run["seconds"], 1),
            "metadataBytesPerLeaf": round(metadata_bytes_per_leaf(manager, client, name, 100), 1),
            "errors": run["errors"][:5],
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sections.json").write_text(json.dumps(figures, indent=2) + "\n")
    for key, value in figures.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
