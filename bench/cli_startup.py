"""How long `device-state --help` takes to start beside a minimal one-command app on the same
command-line library (Click), in the same Python and the same run: each a whole process, the two
alternating so that other load falls on both alike. Prints each one's median and spread (min-max)
and the ratio, the median of the pairs' ratios (the goal: at most 1.5x).

    .venv/bin/python bench/cli_startup.py [--runs 41]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MINIMAL = '''import click


@click.command()
@click.option("--name", default="world", help="Who to greet.")
def main(name):
    """Greets someone."""
    click.echo(f"hello {name}")


main()
'''
COMMAND_LINE = "from device_state_client.cli import main\nmain(prog_name='device-state')\n"


def timed(script: Path, env: dict) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(script), "--help"], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{script.name} --help failed: {done.stderr.decode()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=41)
    runs = parser.parse_args().runs
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "clients" / "python"), "PYTHONDONTWRITEBYTECODE": "1"}
    with tempfile.TemporaryDirectory() as folder:
        minimal, command_line = Path(folder) / "minimal.py", Path(folder) / "device_state.py"
        minimal.write_text(MINIMAL)
        command_line.write_text(COMMAND_LINE)
        for script in (minimal, command_line):  # warm the file cache and the bytecode of both
            timed(script, {**env, "PYTHONDONTWRITEBYTECODE": ""})
        times = {"minimal": [], "device-state": []}
        for _ in range(runs):
            times["minimal"].append(timed(minimal, env))
            times["device-state"].append(timed(command_line, env))
    result = {name: {"median_ms": round(statistics.median(values) * 1000, 1),
                     "min_ms": round(min(values) * 1000, 1), "max_ms": round(max(values) * 1000, 1)}
              for name, values in times.items()}
    result["ratio"] = round(statistics.median(d / m for m, d in zip(times["minimal"], times["device-state"])), 3)
    result["runs"] = runs
    for name in ("minimal", "device-state"):
        figures = result[name]
        print(f"{name:>13} --help: median {figures['median_ms']} ms ({figures['min_ms']}-{figures['max_ms']} ms)")
    print(f"ratio (median of {runs} pairs): {result['ratio']}x (goal: at most 1.5x)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
