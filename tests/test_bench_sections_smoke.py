"""`make bench`'s sections part in miniature: its figures have their shape and sane values."""

from __future__ import annotations

import json

import pytest

from bench import sections

pytestmark = [pytest.mark.dynamodb_local]


def test_sections_bench_smoke(tmp_path, dynamodb_local):  # the suite's DynamoDB Local, not one of its own
    sections.main(["--endpoint", dynamodb_local.endpoint,
                   "--writers", "3", "--updates", "3", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "sections.json").read_text())
    assert result["acknowledged"] == 9 and result["successRate"] == 1.0 and result["lostReports"] == 0
    assert result["versionIsOnePlusAcknowledged"] is True
    assert 1 <= result["callsPerUpdate"] <= 1.5 and result["failedConditionalWritesPerUpdate"] == 0
    assert result["metadataBytesPerLeaf"] > 0
