"""`make bench` leaves a checkout clean: it writes into the untracked bench/out/ unless asked
(UPDATE_RESULTS=1) to update the committed reference results in bench/results/."""

from __future__ import annotations

import subprocess

import pytest

from tests.make_serve import REPO_ROOT


def bench_commands(*variables: str) -> list[str]:
    """The benchmark commands `make bench` would run (make -n prints them, runs nothing)."""
    result = subprocess.run(["make", "-n", "bench", *variables], cwd=REPO_ROOT, capture_output=True, text=True,
                            check=True)
    return [line for line in result.stdout.splitlines() if any(f"bench/{name}.py" in line for name in ("contention", "feed", "sections", "push", "metadata", "costs",
                                                                         "identity_units", "fleet", "console", "jobs",
                                                                         "identity"))]


@pytest.mark.parametrize("variables, folder", [((), "bench/out"), (("UPDATE_RESULTS=1",), "bench/results")])
def test_make_bench_writes_where_asked(variables, folder):
    commands = bench_commands(*variables)
    assert len(commands) == 11, commands
    assert all(f"--out {folder} " in command + " " for command in commands), commands


def test_the_default_output_is_untracked_and_the_reference_results_are_tracked():
    from bench import (console, contention, costs, feed, fleet, identity, identity_units, jobs, metadata, push,
                       sections)

    for module in (contention, feed, sections, push, metadata, costs, identity_units, fleet, console, jobs,
                   identity):
        assert module.OUT == REPO_ROOT / "bench" / "out"
    ignored = subprocess.run(["git", "check-ignore", "-q", "bench/out/latest.json"], cwd=REPO_ROOT)
    assert ignored.returncode == 0, "bench/out/ is not ignored by git"
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", "bench/results/latest.json",
                              "bench/results/feed.json", "bench/results/sections.json"], cwd=REPO_ROOT, capture_output=True)
    assert tracked.returncode == 0, tracked.stderr
