"""The state item has one schema (``functions/device_state/item/schema.py``): every attribute
name is declared there, and nothing else in the service spells one."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from functions.device_state import Ack, DesireOptions, DeviceStateManager, FleetIndex, MergePatch
from functions.device_state.item import schema
from functions.device_state.table import create_table

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA = REPO_ROOT / "functions" / "device_state" / "item" / "schema.py"
# Attribute names that are also members of the service's JSON documents (a device, a change, a
# lease grant, an event) or sections: those documents spell them as such. As item attributes
# they are still read through the schema, which check (b) holds.
SHARED_WORDS = {"deviceId", "state", "desired", "reported", "version", "createdAt", "updatedAt", "expiresAt",
                "lastSeen", "leaseToken", "sk",
                "jobs"}  # also the resource of jobs (/jobs, the rights' "jobs") and a listing's name
DYNAMODB_TYPES = {"S", "N", "B", "SS", "NS", "BS", "M", "L", "NULL", "BOOL"}


def _declared() -> dict[str, str]:
    """Every name the schema declares: attribute names and prefixes, by value."""
    return {node.value.value: node.targets[0].id for node in ast.parse(SCHEMA.read_text()).body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)}


def _sources() -> list[Path]:
    return [path for folder in ("functions", "localdev", "infra", "bench") for path in (REPO_ROOT / folder).rglob("*.py")
            if path != SCHEMA]


def _spelled(tree: ast.AST, names) -> list[tuple[int, str]]:
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def _typed_reads(tree: ast.AST, names) -> list[tuple[int, str]]:
    """``x["name"]["N"]`` and ``x.get("name")...["N"]``-like reads of a raw item's typed value."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                and node.slice.value in DYNAMODB_TYPES):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in DYNAMODB_TYPES):
                continue
        inner = node.value if isinstance(node, ast.Subscript) else node.func.value
        if isinstance(inner, ast.Subscript) and isinstance(inner.slice, ast.Constant) and inner.slice.value in names:
            found.append((node.lineno, inner.slice.value))
        elif (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "get"
              and inner.args and isinstance(inner.args[0], ast.Constant) and inner.args[0].value in names):
            found.append((node.lineno, inner.args[0].value))
    return found


def test_no_module_but_the_schema_spells_an_attribute_of_the_state_item():
    distinctive = set(_declared()) - SHARED_WORDS
    spelled = [f"{path.relative_to(REPO_ROOT)}:{line} {name!r}" for path in _sources()
               for line, name in _spelled(ast.parse(path.read_text()), distinctive)]
    assert spelled == [], "use the schema's names (functions/device_state/item/schema.py):\n" + "\n".join(spelled)


def test_no_module_but_the_schema_reads_a_raw_attribute_by_its_spelled_name():
    names = set(_declared())
    reads = [f"{path.relative_to(REPO_ROOT)}:{line} {name!r}" for path in _sources()
             for line, name in _typed_reads(ast.parse(path.read_text()), names)]
    assert reads == [], "read items through the schema's names:\n" + "\n".join(reads)


def test_the_checks_see_a_spelled_name_and_a_raw_read():
    probe = ast.parse('item["metaDesired"] = 1\nversion = item["version"]["N"]\nseen = item.get("lastSeen", {}).get("N")\n'
                      'shown = {"version": 3}\n')
    assert _spelled(probe, set(_declared()) - SHARED_WORDS) == [(1, "metaDesired")]
    assert _typed_reads(probe, set(_declared())) == [(2, "version"), (3, "lastSeen")]


@mock_aws
def test_every_attribute_a_device_item_carries_in_its_life_is_declared():
    """A device created, desired with options, reported (confirming and clearing), acked,
    patched read-free, leased, connected, indexed and deleted carries only attributes the
    schema declares (journal entries and index attributes by their declared prefix)."""
    client = boto3.client("dynamodb", region_name="us-east-1")
    fleet = FleetIndex.parse("reported/firmware:string")
    create_table(client, "devices", fleet_index=fleet)
    manager = DeviceStateManager(client, "devices", fleet_index=fleet)
    seen: set[str] = set()

    def look():
        item = client.get_item(TableName="devices", Key=schema.state_key("lamp"), ConsistentRead=True).get("Item")
        seen.update(item or {})

    manager.create("lamp", {"room": "kitchen"}, sections={"desired": {"power": "on"}})
    look()
    desired = manager.update_with_retry("lamp", MergePatch({"brightness": 50, "mode": "eco"}), section="desired",
                                        desire=DesireOptions(expires_in=60, clear_on_confirm=True))
    manager.acknowledge("lamp", [Ack("/mode", desired.version, 400, "not supported")])
    manager.update_with_retry("lamp", MergePatch({"brightness": 50, "firmware": "1.2"}), section="reported")
    manager.update_with_retry("lamp", MergePatch({"name": "lamp one"}))  # read-free
    look()
    with manager.lease("lamp", ttl_seconds=30):
        look()
    assert manager.connected("lamp", "c1", time.time() + 60)
    look()
    manager.disconnected("lamp", "c1", time.time() + 60)
    manager.delete("lamp")
    look()
    undeclared = sorted(name for name in seen if name not in _declared()
                        and not schema.is_journal_entry(name) and not schema.is_index_attribute(name))
    assert undeclared == []
    assert {schema.META_DESIRED, schema.STATUS_DESIRED, schema.LEASE_TOKEN, schema.CONNECTIONS,
            schema.DELETED_AT} <= seen  # the life above reached every part of the schema it names


@pytest.mark.parametrize("name", sorted(SHARED_WORDS - {"sk", "deviceId"}))
def test_each_shared_word_is_an_attribute_of_the_item(name):
    """The exemption list names attributes only (a stale entry would hide a spelled name)."""
    assert name in _declared()


# The sort keys of items in a device's own partition (the state item, its change items and
# everything kept beside them), and those of items kept in partitions of their own, as
# ``name@module`` (the module's path under functions/).
DEVICE_PARTITION_SORT_KEYS = {
    "STATE_SK@device_state/item/schema.py", "CHANGE_SK_PREFIX@device_state/feed/items.py",
    "LEGACY_CHANGE_SK_PREFIX@device_state/feed/items.py", "TRIES_SK_PREFIX@device_state/feed/log.py",
    "CREDENTIAL_SK_PREFIX@device_state/identity/credentials.py", "SK_PREFIX@device_state/identity/assertions.py",
    "IDEMPOTENCY_SK_PREFIX@device_state/table.py", "IDEMPOTENCY_PART_SK_PREFIX@device_state/table.py",
    "LEASE_SK_PREFIX@device_state/table.py", "LEASE_COUNTER_SK@device_state/table.py",
    "SUBSCRIPTION_SK_PREFIX@push/subscriptions.py"}
OTHER_PARTITION_SORT_KEYS = {
    "JOB_SK@device_state/jobs/items.py", "RUN_SK@device_state/jobs/items.py", "JOB_SK@device_state/fleet/reindex.py",
    "SK_PREFIX@device_state/identity/enrollments.py", "CONNECTION_SK@push/subscriptions.py"}


def _sort_key_constants() -> dict[str, str]:
    """Every module-level ``*_SK`` or ``*SK_PREFIX`` string constant of the service, by
    ``name@module``."""
    found = {}
    functions = REPO_ROOT / "functions"
    for path in functions.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.Assign):
                continue
            targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else node.targets
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for target, value in zip(targets, values):
                if (isinstance(target, ast.Name) and target.id.endswith(("_SK", "SK_PREFIX"))
                        and isinstance(value, ast.Constant) and isinstance(value.value, str)):
                    found[f"{target.id}@{path.relative_to(functions).as_posix()}"] = value.value
    return found


def test_no_item_of_a_device_sorts_between_its_change_items_and_its_state_item():
    """``ChangeLog.read`` reads a page of changes and the state item after them in one Query:
    whatever else a device's partition holds must sort before the change items or after the
    state item, or that Query would read (and pay for) it too."""
    from functions.device_state.feed.items import CHANGE_SK_PREFIX, VERSION_WIDTH, change_sk
    constants = _sort_key_constants()
    assert set(constants) == DEVICE_PARTITION_SORT_KEYS | OTHER_PARTITION_SORT_KEYS, \
        "a sort key added or renamed: say which partition its items live in"
    assert change_sk(0) < change_sk(10 ** VERSION_WIDTH - 1) < schema.STATE_SK
    for name in DEVICE_PARTITION_SORT_KEYS:
        value = constants[name]
        if value in (CHANGE_SK_PREFIX, schema.STATE_SK):
            continue
        highest = value + "\U0010ffff" if name.split("@")[0].endswith("PREFIX") else value  # and anything after
        assert highest < CHANGE_SK_PREFIX or value > schema.STATE_SK, name
