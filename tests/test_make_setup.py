"""First-time setup says what it is doing: one `setup: ...` line per step (the steps run side by
side, so in any order), and its two apt-get runs take one lock, never apt's own at once."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_first_time_setup_prints_one_line_per_step():
    # -B: as on a fresh clone (every stamp out of date); -n: show the recipes, run nothing.
    dry_run = subprocess.run(["make", "-n", "-B", "setup"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=60)
    assert dry_run.returncode == 0, dry_run.stderr
    steps = [re.match(r"setup: ([^:(]+)", line).group(1).strip()
             for line in re.findall(r'echo "(setup: [^"]+)"', dry_run.stdout)]
    assert set(steps) == {"Python packages into .venv", "npm packages into node_modules",  # each found, or installed
                          "Java for DynamoDB Local", "Chromium for the console's browser tests"}
    installs = [line for line in dry_run.stdout.splitlines() if "apt-get install" in line and "echo" not in line]
    assert len(installs) == 2 and all("flock /tmp/device-state-setup-apt.lock" in line for line in installs), installs


def test_both_setups_run_their_steps_in_one_parallel_make():
    """`make setup` and `make test-fast` (its Python and npm steps only) each hand their steps to
    one sub-make with jobs, so a fresh clone downloads them side by side; under `make -jN` the
    sub-make shares that job count instead of taking its own."""
    # as typed at a shell: not inside the make that may be running this suite, whose jobserver it would join
    alone = {name: value for name, value in os.environ.items() if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}

    def dry_run(*arguments: str) -> str:
        run = subprocess.run(["make", "-n", "-B", *arguments], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=60, env=alone)
        assert run.returncode == 0, run.stderr
        return run.stdout

    for target, goal in (("setup", "setup-steps"), ("test-fast", "setup-fast-steps")):
        [sub_make] = [line for line in dry_run(target).splitlines() if line.endswith(f" {goal}")]
        assert " -j4 " in sub_make, sub_make
    [sub_make] = [line for line in dry_run("-j2", "test-fast").splitlines() if line.endswith(" setup-fast-steps")]
    assert "-j4" not in sub_make, sub_make
