"""`make bench` in miniature: its outputs have their shape, the naive control loses
updates and the library loses none. (Targets are reported by `make bench`, not asserted.)"""

from __future__ import annotations

import json

import pytest

from bench import contention

pytestmark = [pytest.mark.dynamodb_local, pytest.mark.concurrency]


def test_bench_smoke(tmp_path, dynamodb_local):  # the suite's DynamoDB Local, not one of its own
    contention.main(["--endpoint", dynamodb_local.endpoint,
                     "--writers", "1,8", "--updates", "96", "--strategies", "naive,library,apart,racing",
                     "--workloads", "increment", "--cold-runs", "1", "--warm-updates", "0", "--journal-writes", "40",
                     "--fault-updates", "6", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "latest.json").read_text())
    cells = {(c["strategy"], c["writers"]): c for c in result["cells"]}
    assert set(cells) == {(s, n) for s in ("naive", "library", "apart", "racing") for n in (1, 8)}
    for cell in cells.values():
        assert cell["goodput"] > 0 and 0 < cell["success_rate"] <= 1
        assert cell["latency_ms_p50"] <= cell["latency_ms_p95"] <= cell["latency_ms_p99"]
        assert cell["request_units_per_update"] >= 1  # every update writes at least one unit
    assert cells[("naive", 8)]["lost_updates"] > 0
    assert all(cells[(s, n)]["lost_updates"] == 0 for s in ("library", "apart", "racing") for n in (1, 8))
    assert cells[("library", 8)]["succeeded"] == 96
    assert result["cold_start"]["handler"] > 0 and result["cold_start"]["baseline"] > 0
    assert result["headline"] and "lost updates" in result["headline"][-4]
    faults = result["outcomes"]["lost_answers"]
    assert faults["duplicated_tokens"] == 0 and faults["acknowledged_tokens_missing"] == 0
    assert 0 <= faults["increments_beyond_acknowledged"] <= faults["unknown_increments"]
    assert faults["version_matches_changes"] and faults["answers_lost"] > 0
    assert result["outcomes"]["journal"]["rmw"]["item_bytes_max"] > 0
    table = (tmp_path / "latest.md").read_text()
    assert table.startswith("| workload | strategy | writers |") and table.count("\n| increment") == 8
    assert (tmp_path / "latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
