"""`make bench`'s feed part in miniature: its outputs have their shape and sane values."""

from __future__ import annotations

import json

import pytest

from bench import feed

pytestmark = [pytest.mark.dynamodb_local]


def test_feed_bench_smoke(tmp_path, dynamodb_local):  # the suite's DynamoDB Local, not one of its own
    feed.main(["--endpoint", dynamodb_local.endpoint, "--writes", "5", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "feed.json").read_text())
    assert 0 < result["feed_lag_ms_p50"] <= result["feed_lag_ms_p95"] <= result["feed_lag_ms_max"]
    assert [row["state"] for row in result["write_capacity"]] == list(feed.STATE_SIZES)
    for row in result["write_capacity"]:
        assert row["change_write_wcu"] >= 1 and row["change_item_bytes"] > 0
    assert (tmp_path / "feed.md").read_text().startswith("Feed lag")
