"""`make bench`'s cost model in miniature: request units measured for every operation kind,
the topology read from the synthesized template (as deployed, and with capacity=provisioned),
and the bills add up from their parts."""

from __future__ import annotations

import json

import pytest

from bench import costs

pytestmark = [pytest.mark.dynamodb_local, pytest.mark.toolchain]


def test_cost_bench_smoke(tmp_path, dynamodb_local):  # the suite's DynamoDB Local, not one of its own
    result = costs.main(["--endpoint", dynamodb_local.endpoint,
                         "--devices", "2", "--timing-runs", "2", "--reports-per-desire", "12",
                         "--out", str(tmp_path)])
    assert json.loads((tmp_path / "costs.json").read_text()) == result
    assert (tmp_path / "costs.md").read_text().count("**total**") == 2 and (tmp_path / "costs.png").stat().st_size
    operations = result["operations"]
    assert {"create", "report", "desired write", "get", "lease (acquire + release)",
            "transaction (2 devices)", "feed read (page)"} <= set(operations)
    report = operations["report"]
    assert report["service_write"] >= 1 and report["changes_write"] >= 1 and report["changes"] == 1
    assert operations["desired write"]["pushes"] == 1 and report["pushes"] == 0  # the device follows desired
    assert operations["get"]["service_write"] == 0 and operations["get"]["service_read"] >= 0.5
    assert result["topology"]["api"] in ("REST", "HTTP") and result["topology"]["api_memory_mb"] > 0
    for who in ("this service", "Device Shadow"):
        assert all(dollars >= 0 for dollars in result["bill"][who].values())
    # Shadow's bill from the reference fleet's counts and the published prices, independently.
    fleet = result["bill"]["fleet"]
    operations_count = fleet["reports"] + fleet["desires"] + fleet["applied reports"]
    expected = operations_count * (1.00 + 1.25) / 1e6 + fleet["devices"] * 43_200 * 0.08 / 1e6
    assert sum(result["bill"]["Device Shadow"].values()) == pytest.approx(expected, rel=1e-3)
    # The same stack deployed with capacity=provisioned: only DynamoDB's request lines change, and go down.
    provisioned = result["provisioned capacity"]
    assert result["topology"]["billing_mode"] == "PAY_PER_REQUEST"
    assert provisioned["topology"]["billing_mode"] == "PROVISIONED"
    assert provisioned["topology"]["target_utilization_percent"] == 70
    ours, ours_provisioned = result["bill"]["this service"], provisioned["bill"]["this service"]
    dynamodb = {"DynamoDB writes", "DynamoDB reads", "device connectivity (DynamoDB)"}
    assert all(ours_provisioned[line] < ours[line] for line in dynamodb)
    assert {k: v for k, v in ours_provisioned.items() if k not in dynamodb} == {
        k: v for k, v in ours.items() if k not in dynamodb}
    assert provisioned["bill"]["Device Shadow"] == result["bill"]["Device Shadow"]


def test_the_reference_device_is_the_fleets_shape():
    from functions.device_state.model.values import dumps

    state, sections = costs.reference_device(7)
    sizes = [len(dumps(document)) for document in (state, sections["desired"], sections["reported"])]
    assert 550 <= sum(sizes) <= 650, sizes  # about 600 bytes of JSON
    leaves = [len(state), len(sections["desired"]), len(sections["reported"])]
    assert leaves == [5, 3, 7], leaves  # 15 leaves
