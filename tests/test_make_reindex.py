"""`make reindex` as docs/operations.md shows it: on a running DynamoDB Local
(``DYNAMODB_ENDPOINT``), a field declared on a table that holds devices is filled with
progress, and queries answer from it; without an endpoint or a data dir it says what it needs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from functions.device_state import DeviceStateManager, FleetIndex, IndexBuilding, table
from tests.helpers import own_dynamodb_local  # noqa: F401  (the fixture dynamodb_local: this module's own)

REPO_ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.dynamodb_local, pytest.mark.toolchain]


def make_reindex(**variables: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("DYNAMODB_ENDPOINT", "DYNAMODB_DATA_DIR")}
    return subprocess.run(["make", "--no-print-directory", "reindex", *(f"{k}={v}" for k, v in variables.items())],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_make_reindex_fills_a_field_declared_on_a_table_with_devices(dynamodb_local, local_table):
    client, name = local_table
    declared = FleetIndex.parse("reported/battery:number")
    # the table has the field's index (as the stack makes it on deploy) and devices written
    # without the declaration; an index added by UpdateTable is ensure_table's own test's
    name += "-indexed"
    table.create_table(client, name, declared)
    plain = DeviceStateManager(client, name)
    for number in range(60):
        plain.create(f"m{number}", {}, sections={"reported": {"battery": number}})
    queried = DeviceStateManager(client, name, fleet_index=declared)
    done = make_reindex(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=name,
                        FLEET_INDEX="reported/battery:number")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reindex: 60 devices scanned, done" in done.stdout
    assert "fleet index ready: reported/battery:number" in done.stdout
    assert queried.count_devices("ge(reported/battery,40)") == {"count": 20}


def test_make_reindex_without_a_table_to_work_on_says_what_it_needs(dynamodb_local, local_table):
    client, name = local_table
    refused = make_reindex(TABLE_NAME=name)
    assert refused.returncode != 0
    assert "give DYNAMODB_ENDPOINT" in refused.stderr
    bad = make_reindex(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=name, FLEET_INDEX="reported/x:float")
    assert bad.returncode != 0 and "path:type" in bad.stderr
    DeviceStateManager(client, name).create("held", {})
    with pytest.raises(IndexBuilding):  # nothing ran on this table that holds a device, so nothing is ready
        DeviceStateManager(client, name, fleet_index=FleetIndex.parse("reported/x:string")).count_devices(
            "exists(reported/x)")
