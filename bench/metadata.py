"""`make bench` (metadata part): what per-leaf metadata costs as a device's leaves grow.

For devices whose ``reported`` holds 100, 1,000 and 10,000 small leaves (each with its own
metadata entry), times through the library on DynamoDB Local, each ``--repeats`` times:
- a conditional report: ``update(..., expected_version, section="reported")`` of one leaf
  (the ``If-Match`` PATCH …/reported: read, plan with the metadata, write at the version);
- a read with metadata: ``get()`` and the resource with ``include_metadata`` as JSON (the
  ``GET ?include=metadata`` answer).
Prints and writes (metadata.json) the median time per leaf with its spread (min-max), and
the ratio of the per-leaf medians at the largest and the next size: metadata work that is
linear in the leaves keeps it near 1 (the build asks for <= 1.5).

Writes into bench/out/ (untracked; ``--out bench/results`` updates the committed reference)."""

from __future__ import annotations

import argparse
import json
import os
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

from functions.device_state import DeviceStateManager, MergePatch, table  # noqa: E402
from functions.device_state.client import dynamodb_client  # noqa: E402
from functions.device_state.model.values import dumps  # noqa: E402
from localdev.dynamodb_local import dynamodb_local  # noqa: E402

OUT = REPO_ROOT / "bench" / "out"  # untracked; --out bench/results updates the reference results
DESIRED_LEAVES = 10  # a few desired leaves, so confirmation is computed too


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def measure(manager: DeviceStateManager, leaves: int, repeats: int) -> dict:
    device_id = f"meta-{leaves}-{uuid.uuid4().hex[:6]}"
    reported = {f"s{index}": index for index in range(leaves)}
    desired = {f"s{index}": index for index in range(min(DESIRED_LEAVES, leaves))}
    version = manager.create(device_id, {}, sections={"desired": desired, "reported": reported}).version
    report, read = [], []
    for repeat in range(repeats):
        def conditional_report():
            nonlocal version
            version = manager.update(device_id, MergePatch({"s0": repeat + 1}), version,
                                     section="reported").version
        report.append(timed(conditional_report))
        read.append(timed(lambda: dumps(manager.get(device_id).as_dict(include_metadata=True))))
    return {"leaves": leaves, "conditionalReport": per_leaf(report, leaves), "getWithMetadata": per_leaf(read, leaves)}


def per_leaf(seconds: list[float], leaves: int) -> dict:
    """Median, min and max time per leaf in microseconds, and the median in ms."""
    return {"medianMs": round(statistics.median(seconds) * 1000, 2),
            "perLeafUs": round(statistics.median(seconds) / leaves * 1e6, 2),
            "perLeafMinUs": round(min(seconds) / leaves * 1e6, 2),
            "perLeafMaxUs": round(max(seconds) / leaves * 1e6, 2)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--leaves", default="100,1000,10000", help="comma-separated leaf counts, smallest first")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT, help="where metadata.json goes")
    parser.add_argument("--endpoint", help="a running DynamoDB Local (default: one started for the run)")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.leaves.split(",")]
    with dynamodb_local(args.endpoint) as dynamodb:
        client = dynamodb_client(dynamodb.endpoint, "us-east-1")
        name = f"bench-metadata-{uuid.uuid4().hex[:6]}"
        table.create_table(client, name)
        manager = DeviceStateManager(client, name)
        measure(manager, sizes[0], 1)  # warm-up: DynamoDB Local and the imports
        rows = [measure(manager, size, args.repeats) for size in sizes]
    figures = {"repeats": args.repeats, "rows": rows}
    if len(rows) >= 2:
        figures["perLeafRatio"] = {
            "sizes": [rows[-1]["leaves"], rows[-2]["leaves"]],
            **{operation: round(rows[-1][operation]["perLeafUs"] / rows[-2][operation]["perLeafUs"], 2)
               for operation in ("conditionalReport", "getWithMetadata")}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metadata.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"per-leaf metadata, median of {args.repeats} (min-max), microseconds per leaf")
    print(f"{'leaves':>8} {'conditional report':>28} {'GET ?include=metadata':>28}")
    for row in rows:
        cells = [f"{row[op]['perLeafUs']:.1f} ({row[op]['perLeafMinUs']:.1f}-{row[op]['perLeafMaxUs']:.1f})"
                 for op in ("conditionalReport", "getWithMetadata")]
        print(f"{row['leaves']:>8} {cells[0]:>28} {cells[1]:>28}")
    if "perLeafRatio" in figures:
        ratio = figures["perLeafRatio"]
        print(f"per-leaf ratio {ratio['sizes'][0]} vs {ratio['sizes'][1]} leaves: conditional report "
              f"{ratio['conditionalReport']}x, GET with metadata {ratio['getWithMetadata']}x")
    return figures


if __name__ == "__main__":
    main()
