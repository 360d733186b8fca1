"""`make bench`'s push part in miniature: its outputs have their shape and sane values."""

from __future__ import annotations

import json

import pytest

from bench import push

pytestmark = [pytest.mark.dynamodb_local]


def test_push_bench_smoke(tmp_path, dynamodb_local, monkeypatch):  # the suite's DynamoDB Local, not one of its own
    # As an earlier test in the same worker may leave it: the push functions' configuration
    # cached for a table since dropped. The bench measures its own table all the same.
    from functions.push import services
    monkeypatch.setenv("TABLE_NAME", "a-table-dropped-since")
    services.push_config.cache_clear()
    services.push_config()
    monkeypatch.undo()
    try:
        push.main(["--endpoint", dynamodb_local.endpoint,
                   "--subscribers", "6", "--devices", "2", "--seconds", "2", "--rate", "5", "--out", str(tmp_path)])
    finally:
        services.push_config.cache_clear()
    result = json.loads((tmp_path / "push.json").read_text())
    assert result["lost"] == 0 and result["messages"] == 3 * result["writes"]
    assert 0 < result["latency_ms_p50"] <= result["latency_ms_p95"] <= result["latency_ms_max"]
    assert 0 < result["websocket_concurrency_per_subscriber"] < result["long_poll_concurrency_per_client"] <= 1.0
    assert (tmp_path / "push.md").read_text().startswith("Push over WebSocket")
