"""`make bench`'s jobs figures in miniature, on the suite's DynamoDB Local: every device of the job
written exactly once and confirmed (no double write, no lost execution), the units per execution
and the dollars per 100,000 stated beside the direct writes', a paced job near its rate."""

from __future__ import annotations

import json

import pytest

from bench import jobs

pytestmark = pytest.mark.dynamodb_local


def test_jobs_bench_smoke(tmp_path, dynamodb_local):
    result = jobs.main(["--devices", "200", "--rate", "600", "--rate-seconds", "6", "--out", str(tmp_path),
                        "--endpoint", dynamodb_local.endpoint])
    assert json.loads((tmp_path / "jobs.json").read_text()) == json.loads(json.dumps(result))
    assert result["double_writes"] == 0 and result["lost_executions"] == 0
    assert result["counts"]["SUCCEEDED"] == 200
    assert result["units_by_hand"]["write_units"] == 2
    assert 2 < result["units_per_execution"]["write_units"] < 6
    assert result["dollars_per_100k_executions"] < 3
    assert 0.8 < result["rollout"]["ratio"] < 1.1
    assert "| writes per second" in (tmp_path / "jobs.md").read_text()
