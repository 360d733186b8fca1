"""`make bench`'s metadata part in miniature: its figures have their shape and sane values."""

from __future__ import annotations

import json

import pytest

from bench import metadata

pytestmark = [pytest.mark.dynamodb_local]


def test_metadata_bench_smoke(tmp_path, dynamodb_local):  # the suite's DynamoDB Local, not one of its own
    figures = metadata.main(["--endpoint", dynamodb_local.endpoint,
                             "--leaves", "20,200", "--repeats", "1", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "metadata.json").read_text()) == figures
    assert [row["leaves"] for row in figures["rows"]] == [20, 200]
    for row in figures["rows"]:
        for operation in ("conditionalReport", "getWithMetadata"):
            cell = row[operation]
            assert 0 < cell["perLeafMinUs"] <= cell["perLeafUs"] <= cell["perLeafMaxUs"], row
    assert figures["perLeafRatio"]["sizes"] == [200, 20]
    assert figures["perLeafRatio"]["conditionalReport"] > 0 and figures["perLeafRatio"]["getWithMetadata"] > 0
