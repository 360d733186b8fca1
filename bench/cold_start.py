"""The Lambda handler's cold start against a bare boto3 process (``contention.cold_start``, the
figure `make bench` reports), alone or beside another revision of this repository in the same run:

    .venv/bin/python bench/cold_start.py                       # this checkout, 6 rounds
    .venv/bin/python bench/cold_start.py --against d2b89b9     # and that commit, rounds alternating
    .venv/bin/python bench/cold_start.py --no-bytecode         # the asset bundled without bytecode

Each round runs ``--runs`` baseline/handler pairs per checkout; rounds alternate between the
checkouts so that the machine's drift falls on both alike. Prints each checkout's median ratio
and its spread (min–max over rounds). ``--against`` checks the revision out into a temporary git
worktree (removed at the end) and measures its handler with this checkout's harness.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "bench"))

from functions.device_state import dynamodb_client, table  # noqa: E402
from localdev.dynamodb_local import dynamodb_local  # noqa: E402


def _harness(root: Path, name: str):
    """``bench/contention.py`` with its REPO_ROOT set to ``root``: the handler measured is root's."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "bench" / "contention.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    module.REPO_ROOT = root
    return module


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3, help="baseline/handler pairs per round and checkout")
    parser.add_argument("--against", metavar="REVISION", help="also measure this git revision, alternating")
    parser.add_argument("--no-bytecode", action="store_true",
                        help="the asset as bundled where no Python of the function's version is: no bytecode")
    args = parser.parse_args(argv)
    checkouts = {"this checkout": REPO_ROOT}
    other = None
    if args.against:
        other = Path(tempfile.mkdtemp(prefix="cold-against-")) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(other), args.against], cwd=REPO_ROOT,
                       check=True)
        checkouts[args.against] = other
    try:
        harnesses = {label: _harness(root, f"cold_{index}") for index, (label, root) in enumerate(checkouts.items())}
        results: dict[str, list[dict]] = {label: [] for label in checkouts}
        with dynamodb_local(None) as dynamodb:
            name = "cold-start"
            table.create_table(dynamodb_client(dynamodb.endpoint, "us-east-1"), name)
            for _ in range(args.rounds):
                for label, harness in harnesses.items():
                    results[label].append(harness.cold_start(dynamodb.endpoint, name, args.runs,
                                                                bytecode=not args.no_bytecode))
    finally:
        if other is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=REPO_ROOT, check=False)
    summary = {}
    for label, rounds in results.items():
        ratios = [result["ratio"] for result in rounds]
        summary[label] = {"ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                          "handler_ms": statistics.median(result["handler"] for result in rounds),
                          "baseline_ms": statistics.median(result["baseline"] for result in rounds)}
        print(f"{label}: cold start {summary[label]['ratio']:.2f}x a bare boto3 process "
              f"(median of {len(ratios)} rounds, {min(ratios):.2f}-{max(ratios):.2f}); handler "
              f"{summary[label]['handler_ms']:.0f} ms, baseline {summary[label]['baseline_ms']:.0f} ms", flush=True)
    return summary


if __name__ == "__main__":
    main()
