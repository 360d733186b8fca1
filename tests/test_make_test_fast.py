"""`make test-fast` really leaves out the DynamoDB Local tier: no selected test is marked for it
or reaches its fixture, and its setup does not check for Java (so it needs no Java and starts
no jar)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# Runs pytest's collection once and prints each item's id, marks, the fixtures it names and its
# parameters (the `engine` fixture picks its table by parameter at run time, so "dynamodb_local"
# shows there, not among the fixtures), then for each argument (a `-m` expression) the ids it
# selects, matched as `pytest -m` matches them (one collection: each costs about 7 s).
PROBE = """
import json, sys, pytest
from _pytest.mark import MarkMatcher
from _pytest.mark.expression import Expression

class Report:
    def pytest_collection_finish(self, session):
        self.items = list(session.items)

report = Report()
pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[report])
print("ITEMS=" + json.dumps([{"id": item.nodeid, "marks": sorted({m.name for m in item.iter_markers()}),
                              "fixtures": sorted(getattr(item, "fixturenames", ())),
                              "params": sorted(str(value) for value in getattr(getattr(item, "callspec", None),
                                                                               "params", {}).values())}
                             for item in report.items]))
for expression in sys.argv[1:]:
    selects = Expression.compile(expression).evaluate
    print("SELECTED=" + json.dumps([item.nodeid for item in report.items
                                    if selects(MarkMatcher.from_markers(item.iter_markers()))]))
"""


def make_recipe_marks(target: str, makefile: Path = REPO_ROOT / "Makefile") -> str:
    """The `-m` expression of the Makefile's recipe for ``target`` (checked, and reused below)."""
    recipe = re.search(rf"^{target}:.*\n(?:#.*\n)*(?:\t.*\n)*?\t(.*-m pytest .*)$", makefile.read_text(),
                       re.MULTILINE).group(1)
    arguments = re.search(r"-m pytest (.*)$", recipe).group(1)
    marks = re.search(r'-m "([^"]+)"', arguments)
    assert marks, recipe
    # The selection is the -m expression alone: no -k, --deselect, --ignore or path narrows it.
    assert not re.search(r"(^|\s)(-k|--deselect|--ignore|tests)\b", arguments), recipe
    return marks.group(1)


def collected(*expressions: str) -> tuple[list[dict], list[set[str]]]:
    """Every item pytest collects, and the ids each `-m` expression selects of them."""
    result = subprocess.run([sys.executable, "-c", PROBE, *expressions], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    items = [line[len("ITEMS="):] for line in result.stdout.splitlines() if line.startswith("ITEMS=")]
    selected = [line[len("SELECTED="):] for line in result.stdout.splitlines() if line.startswith("SELECTED=")]
    assert len(items) == 1 and len(selected) == len(expressions), result.stdout[-2000:] + result.stderr[-2000:]
    return json.loads(items[0]), [set(json.loads(ids)) for ids in selected]


@pytest.mark.toolchain
def test_make_test_fast_selects_no_dynamodb_local_test_and_make_test_leaves_out_only_moto_twins():
    every, (fast_ids, full_ids) = collected(make_recipe_marks("test-fast"), make_recipe_marks("test"))
    fast = [item for item in every if item["id"] in fast_ids]
    # The check can fail: the full run has engine-parametrized items that reach DynamoDB Local.
    assert any("dynamodb_local" in item["params"] for item in every)
    assert fast and len(fast) < len(every)
    for item in fast:
        assert "dynamodb_local" not in item["marks"], item["id"]
        assert "dynamodb_local" not in item["fixtures"], item["id"]
        assert "dynamodb_local" not in item["params"], item["id"]
        assert "concurrency" not in item["marks"], item["id"]
    # Every item left out needs DynamoDB Local (or threads on it) or runs a whole toolchain: the
    # fast tier loses nothing else.
    for item in every:
        if item["id"] not in fast_ids:
            assert {"dynamodb_local", "concurrency", "toolchain"} & set(item["marks"]), item["id"]
    # make test leaves out only the moto runs of tests it runs on DynamoDB Local: each one's
    # twin (the same id, the engine's parameter the other) is selected. It can fail: the
    # selection does leave some out, and a moto-only test (a parametrize naming only "moto")
    # carries no moto_twin mark, so it stays.
    left_out = [item for item in every if item["id"] not in full_ids]
    assert left_out and all("moto_twin" in item["marks"] for item in left_out)
    for item in left_out:
        twin = re.sub(r"(?<=[\[-])moto(?=[\]-])", "dynamodb_local", item["id"], count=1)
        assert twin != item["id"] and twin in full_ids, item["id"]


def first_time_recipes(target: str) -> str:
    """What `make <target>` would run on a fresh clone: -B (every stamp out of date), -n (run nothing)."""
    dry_run = subprocess.run(["make", "-n", "-B", target], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=60)
    assert dry_run.returncode == 0, dry_run.stderr
    return dry_run.stdout


def test_make_test_fast_sets_up_python_and_npm_but_never_checks_for_java():
    fast = first_time_recipes("test-fast")
    assert "pip install" in fast and "npm ci" in fast  # the venv, and Node 22 for the CDK's jsii
    assert "-m pytest" in fast
    assert "java" not in fast.lower(), fast
    # The check can fail: the whole suite's setup does look for Java (DynamoDB Local runs on it).
    assert "command -v java" in first_time_recipes("test")


def test_make_test_hands_out_the_slow_files_first_and_each_of_them_exists():
    """make test keeps the collected order, which tests/conftest.py starts with SLOW_FILES: a
    renamed file would silently go back to the end."""
    from tests.conftest import SLOW_FILES

    recipe = re.search(r"^test:.*\n(?:#.*\n)*\t(.*)$", (REPO_ROOT / "Makefile").read_text(), re.MULTILINE).group(1)
    assert "--dist loadfile" in recipe and "--no-loadscope-reorder" in recipe, recipe
    assert len(set(SLOW_FILES)) == len(SLOW_FILES)
    for path in SLOW_FILES:
        assert (REPO_ROOT / path).is_file(), path


def test_tests_infra_goes_to_one_worker_as_one_unit_and_every_other_file_alone():
    """Work units under --dist loadfile (both make targets): a file each, tests/infra all one."""
    from tests.conftest import pytest_xdist_make_scheduler

    settings = {"dist": "loadfile", "tx": ["2*popen"]}
    scheduler = pytest_xdist_make_scheduler(SimpleNamespace(getvalue=settings.get), log=None)
    units = {nodeid: scheduler._split_scope(nodeid) for nodeid in (
        "tests/infra/test_stack.py::test_a", "tests/infra/test_auth_stack.py::test_b[x]",
        "tests/api/test_http.py::test_c", "tests/api/test_http.py::test_d", "tests/api/test_push.py::test_e")}
    assert len(set(units.values())) == 3
    assert units["tests/infra/test_stack.py::test_a"] == units["tests/infra/test_auth_stack.py::test_b[x]"]
    assert units["tests/api/test_http.py::test_c"] == units["tests/api/test_http.py::test_d"] != units[
        "tests/api/test_push.py::test_e"]
    assert pytest_xdist_make_scheduler(SimpleNamespace(getvalue={"dist": "load"}.get), log=None) is None
