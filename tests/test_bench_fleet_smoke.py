"""`make bench`'s fleet query figures in miniature, on the suite's DynamoDB Local: the filter,
the count and the group-by agree with listing the fleet in the client (the bench checks it),
an indexed report costs its index's write units, and no write-then-query pair is stale."""

from __future__ import annotations

import json

import pytest

from bench import fleet

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
