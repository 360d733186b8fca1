"""`make bench`'s fleet query figures in miniature, on the suite's DynamoDB Local: the filter,
the count and the group-by agree with listing the fleet in the client (the bench checks it),
an indexed report costs its index's write units, and no write-then-query pair is stale; a
loaded table is reused only when its load completed."""

from __future__ import annotations

import json
import uuid

import pytest

from bench import fleet
from functions.device_state import DeviceStateManager, dynamodb_client
from functions.device_state.item import schema
from functions.device_state.table import create_table

pytestmark = pytest.mark.dynamodb_local


def test_fleet_bench_smoke(tmp_path, dynamodb_local):
    result = fleet.main(["--devices", "1000", "--runs", "1", "--pairs", "10", "--report-writes", "2",
                         "--out", str(tmp_path),
                         "--endpoint", dynamodb_local.endpoint])
    assert json.loads((tmp_path / "fleet.json").read_text()) == json.loads(json.dumps(result))
    assert result["filter_all_pages"]["answer"] == 1  # 0.1 % of 1,000
    assert result["client_side_list_and_filter"]["answer"]["matched"] == 1
    assert result["filter_first_page"]["read_units"] < result["client_side_list_and_filter"]["read_units"] / 10
    units = result["report_write_units"]
    assert units["with index"]["report_changing_battery"] == units["without index"]["report_changing_battery"] + 2
    assert units["with index"]["report_changing_no_indexed_field"] == \
        units["without index"]["report_changing_no_indexed_field"]
    assert result["freshness"] == {"pairs": 10, "stale": 0}
    assert "| a filter matching 0.1 %" in (tmp_path / "fleet.md").read_text()


def test_a_loaded_table_is_reused_only_when_its_load_completed(dynamodb_local, capsys):
    """``--table``/``--data-dir`` reuse a table across runs: one whose load was cut short, or that
    holds another count, is loaded again, and a table the bench did not make is left alone."""
    client = dynamodb_client(dynamodb_local.endpoint, "us-east-1")
    name = f"fleet-reuse-{uuid.uuid4().hex[:8]}"
    manager = DeviceStateManager(client, name, fleet_index=fleet.FLEET)

    def devices() -> int:
        return len(fleet.all_pages(manager, "exists(reported/firmware)"))

    fleet.loaded(manager, client, name, 30, "test")
    assert devices() == 30 and "30 devices loaded" in capsys.readouterr().out
    fleet.loaded(manager, client, name, 30, "test")
    assert "holds 30 devices from an earlier run" in capsys.readouterr().out
    client.put_item(TableName=name, Item={**fleet.LOAD_KEY, "devices": {"S": "loading"}})  # a load cut short
    client.delete_item(TableName=name, Key={schema.PARTITION_KEY: {"S": "dev-000029"}, schema.SORT_KEY: {"S": "state"}})
    fleet.loaded(manager, client, name, 30, "test")
    assert devices() == 30 and "30 devices loaded" in capsys.readouterr().out
    fleet.loaded(manager, client, name, 40, "test")
    assert devices() == 40 and "40 devices loaded" in capsys.readouterr().out
    # The stream is on again after the load, as the table is deployed.
    assert client.describe_table(TableName=name)["Table"]["StreamSpecification"]["StreamEnabled"]

    foreign = f"fleet-foreign-{uuid.uuid4().hex[:8]}"
    create_table(client, foreign)
    with pytest.raises(SystemExit, match="not one this bench loaded"):
        fleet.loaded(DeviceStateManager(client, foreign, fleet_index=fleet.FLEET), client, foreign, 30, "test")
    assert client.describe_table(TableName=foreign)["Table"]["TableStatus"] == "ACTIVE"
