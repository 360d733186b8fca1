"""`make bench`'s identity units in miniature: each request of a device's own measured with its
registered credential checked beside a device holding none, through the library and the API
handler, on the reference fleet's devices after their hour and on fresh ones."""

from __future__ import annotations

import json

import pytest

from bench import identity_units
from bench.identity_units import HELD, NONE, SNAPSHOT_EVERY

pytestmark = [pytest.mark.dynamodb_local]


@pytest.fixture(scope="module")
def result(tmp_path_factory, dynamodb_local):  # the suite's DynamoDB Local, not one of its own
    out = tmp_path_factory.mktemp("identity-units")
    measured = identity_units.main(["--endpoint", dynamodb_local.endpoint, "--devices", "2", "--out", str(out)])
    assert json.loads((out / "identity_units.json").read_text()) == measured
    assert (out / "identity_units.md").read_text().count("\n| ") == len(measured["operations"]) + 1
    return measured


def test_every_request_of_the_devices_own_is_measured_in_both_sets(result):
    operations = result["operations"]
    assert {"report (library, in the hour)", "report after the hour (PATCH .../reported)",
            "report on a fresh reference device (PATCH .../reported)",
            "the device reads itself (GET /devices/{id})", "lease status (GET .../leases)"} <= set(operations)
    for kind, arms in operations.items():
        if "admin" in kind or "assertion" in kind:  # what only a device holding a credential does
            assert arms[NONE] is None and arms[HELD]["calls"] >= 1, kind
        else:
            assert arms[NONE]["calls"] >= 1 and arms[HELD]["calls"] >= 1, kind
        assert all(units is None or not units.get("refused") for units in arms.values()), kind


def test_a_credential_checked_sends_no_request_more_where_the_device_reads_or_writes_its_item(result):
    """In the request's own condition (a write) or on the item it reads (the device's read of
    itself), at the same units."""
    operations = result["operations"]
    for kind in ("the device reads itself (GET /devices/{id})",
                 "report on a fresh reference device (PATCH .../reported)"):
        assert operations[kind][HELD] == operations[kind][NONE], kind
    hour = [kind for kind in operations if kind.endswith("(library, in the hour)")]
    assert len(hour) >= 10
    for kind in hour:
        assert operations[kind][HELD]["calls"] == operations[kind][NONE]["calls"], kind


def test_the_credential_costs_no_write_unit_on_the_reference_fleets_hour(result):
    """The reference device's item, as its reports write it, sits under a kilobyte with about 30
    bytes to spare: its credential's entry on the item fits there, so every write of the hour (the
    device's reports first) is billed what it is on a device holding none."""
    operations = result["operations"]
    for kind in (kind for kind in operations if kind.endswith("(library, in the hour)")):
        assert operations[kind][HELD] == operations[kind][NONE], kind
    # the room docs/costs.md quotes: the item as the reports wrote it, with and without the credential
    as_reported = result["state item bytes as the hour's reports wrote it"]
    assert max(as_reported[NONE]) < min(as_reported[HELD]) <= max(as_reported[HELD]) <= 1024, as_reported
    assert 25 <= 1024 - max(as_reported[NONE]) <= 35, as_reported  # "about 30 bytes of room"


def test_what_identity_itself_costs(result):
    operations = result["operations"]
    assert operations["token: an assertion exchanged (POST .../token)"][HELD]["write"] == 1  # its jti
    added = result["bytes of the identity attributes"]
    assert 0 < added["secret"] <= added["certificate"] and added["secret"] <= added["provisioned"]


def test_leases_and_transactions_carry_the_credential_in_their_writes_condition_at_the_same_units(result):
    """A lease taken, heartbeaten and released and a transaction write the state item: the
    credential goes in the write's condition (the take's read checks it too), no read more."""
    operations = result["operations"]
    for kind in ("a lease taken and released (POST, DELETE .../leases)", "a lease heartbeat (PUT .../leases/{id})",
                 "a transaction of its own (POST /transactions)"):
        assert operations[kind][HELD] == operations[kind][NONE], kind


def test_the_reads_of_the_state_item_check_the_credential_on_it_and_a_feed_page_reads_it_in_its_query(result):
    """A version, the lease status, the device's jobs and its feed caught up read the state item
    anyway: the credential is checked on it, at the units of a device holding none. A page of the
    feed reads the state item in the same Query as the changes (it sorts right after them): the
    same requests, and its bytes on top of theirs, about a quarter of a read unit a page, not a
    whole one (docs/costs.md)."""
    operations = result["operations"]
    for kind in ("an older version (GET .../versions/{v-1})", "lease status (GET .../leases)",
                 "its jobs (GET .../jobs)"):
        assert operations[kind][HELD] == operations[kind][NONE], kind
    caught_up = operations["feed caught up (GET .../changes, none newer)"]
    assert caught_up[HELD]["read"] == caught_up[NONE]["read"] and caught_up[HELD]["calls"] <= caught_up[NONE]["calls"]
    page = operations[f"feed page of {SNAPSHOT_EVERY} changes (GET .../changes)"]
    assert page[HELD]["calls"] == page[NONE]["calls"] == 1 and page[HELD]["read"] <= page[NONE]["read"] + 1
    pages = operations[f"feed pages of 1 to {SNAPSHOT_EVERY} changes, mean (GET .../changes)"]
    assert pages[HELD]["calls"] == pages[NONE]["calls"] == 1
    assert pages[NONE]["read"] <= pages[HELD]["read"] < pages[NONE]["read"] + 0.5
