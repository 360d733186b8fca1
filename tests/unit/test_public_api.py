"""Callers outside the library use its public API only: what ``functions.device_state``
exports and the modules it names as public, never its other modules."""

from __future__ import annotations

import ast
from pathlib import Path

import functions.device_state as library

REPO_ROOT = Path(__file__).resolve().parents[2]
# The modules callers may import besides the package itself: metric names, SnapStart hooks, the
# table's definition, and the one door to DynamoDB with its expressions, for the items other
# parts keep in the table (push subscriptions); the package's subpackages of leases and of jobs.
PUBLIC_MODULES = {"metrics", "restore", "table", "client", "write.store", "write.expressions", "leases",
                  "transactions", "jobs"}


def _callers() -> list[Path]:
    outside = [path for path in (REPO_ROOT / "functions").rglob("*.py") if "device_state" not in path.parts]
    return outside + sorted((REPO_ROOT / "localdev").rglob("*.py")) + sorted((REPO_ROOT / "infra").rglob("*.py"))


def _library_imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("functions.device_state"):
            yield node.lineno, node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name, []) for alias in node.names
                        if alias.name.startswith("functions.device_state."))


def test_nothing_outside_the_library_imports_its_internal_modules():
    reaching = []
    for path in _callers():
        for line, module, names in _library_imports(path):
            parts = module.split(".")
            if len(parts) > 2 and ".".join(parts[2:]) not in PUBLIC_MODULES:
                reaching.append(f"{path.relative_to(REPO_ROOT)}:{line} imports {module}")
            elif len(parts) == 2:
                unknown = [name for name in names if name not in library.__all__ and name not in PUBLIC_MODULES]
                if unknown:
                    reaching.append(f"{path.relative_to(REPO_ROOT)}:{line} imports {unknown} from the package")
    assert not reaching, "\n".join(reaching)


def test_the_check_sees_an_internal_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from functions.device_state.model.values import item_size\nfrom functions.device_state import x\n")
    assert [module for _, module, _ in _library_imports(probe)] == ["functions.device_state.model.values",
                                                                    "functions.device_state"]


def test_every_exported_name_exists():
    assert [name for name in library.__all__ if not hasattr(library, name)] == []


def _mentions(path: Path) -> dict[str, list[int]]:
    """Lines of ``path`` that name the state item's key or send a transaction."""
    found: dict[str, list[int]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "state_key":
            found.setdefault("state_key", []).append(node.lineno)
        elif isinstance(node, ast.Constant) and node.value == "transact_write_items":
            found.setdefault("transact_write_items", []).append(node.lineno)
    return found


# Where each may appear: the planner (its context and its three kinds of request) builds every
# request on the state item (the store reads it by key; the schema defines it); the pipeline
# sends every transaction (the store translates it).
PLANNER = {"write/plan.py", "write/versioned.py", "write/compiled.py", "write/bookkeeping.py"}
ALLOWED = {"state_key": PLANNER | {"item/schema.py", "write/store.py"},
           "transact_write_items": {"write/pipeline.py", "write/store.py"}}
LIBRARY = REPO_ROOT / "functions" / "device_state"


def _where(path: Path) -> str:
    return path.relative_to(LIBRARY).as_posix() if LIBRARY in path.parents else str(path.relative_to(REPO_ROOT))


def test_one_planner_builds_and_one_pipeline_sends_every_write_of_the_state_item():
    """The other modules' UpdateItems are on other items (the lease counter, change items,
    push subscriptions): none names the state item's key."""
    found = [f"{path.relative_to(REPO_ROOT)}:{lines} {name}"
             for path in sorted((REPO_ROOT / "functions").rglob("*.py"))
             for name, lines in _mentions(path).items() if _where(path) not in ALLOWED[name]]
    assert found == [], found


def test_the_state_item_check_sees_a_second_writer(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("store.send('transact_write_items', TransactItems=[{'Update': {'Key': table.state_key(d)}}])\n")
    assert _mentions(probe) == {"state_key": [1], "transact_write_items": [1]}
