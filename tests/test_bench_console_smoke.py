"""`make bench`'s console part in miniature, on the suite's DynamoDB Local: the dev server, headless
Chromium and the three measures, with their shape and sane values."""

from __future__ import annotations

import json

import pytest

from bench import console

pytestmark = pytest.mark.dynamodb_local


def test_console_bench_smoke(tmp_path, dynamodb_local):
    result = console.main(["--devices", "200", "--samples", "2", "--out", str(tmp_path),
                           "--endpoint", dynamodb_local.endpoint])
    assert json.loads((tmp_path / "console.json").read_text()) == json.loads(json.dumps(result))
    for measure in ("fleet_first_rows", "filtered_first_rows", "live_update"):
        figure = result[measure]
        assert figure["samples"] == 2 and 0 < figure["min_s"] <= figure["median_s"] <= figure["max_s"] < 30, figure
    transfer = result["transfer"]
    assert "/console/js/main.js" in transfer["names"] and "/console/config.json" in transfer["names"]
    assert 0 < transfer["gzip_bytes"] < transfer["bytes"] and transfer["gzip_bytes"] < console.GOAL_KB * 1024
    assert "gzip-compressed" in (tmp_path / "console.md").read_text()
