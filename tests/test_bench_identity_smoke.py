"""`make bench`'s identity part in miniature: assertions exchanged for tokens with a secret and a
key, and devices provisioning themselves one and four at a time, each once and counted once."""

from __future__ import annotations

import json

import pytest

from bench import identity

pytestmark = [pytest.mark.dynamodb_local]


def test_identity_bench_smoke(tmp_path, dynamodb_local):  # the suite's DynamoDB Local, not one of its own
    result = identity.main(["--endpoint", dynamodb_local.endpoint, "--exchanges", "10", "--devices", "12",
                            "--provisioners", "1,4", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "identity.json").read_text()) == result
    assert set(result["assertion_to_token"]) == {"HS256 secret", "ES256 key"}
    for figures in result["assertion_to_token"].values():
        assert figures["exchanges"] == 10 and 0 < figures["p50_ms"] <= figures["p95_ms"] <= figures["max_ms"]
    assert [run["provisioners"] for run in result["provisioning"]] == [1, 4]
    for run in result["provisioning"]:
        assert run["statuses"] == {"201": 12} and run["provisioned"] == run["credentials"] == 12
        assert run["per_second"] > 0 and 0 < run["p50_ms"] <= run["p95_ms"]
    assert "| assertion → token, HS256 secret" in (tmp_path / "identity.md").read_text()
