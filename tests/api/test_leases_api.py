"""Lease routes and Lease-Token fencing through lambda_handler (moto and DynamoDB Local)."""

from __future__ import annotations

import time
from decimal import Decimal
from datetime import datetime

import pytest

from tests.auth import bearer

MERGE = "application/merge-patch+json"


@pytest.fixture
def lamp(api):
    assert api("POST", "/devices", {"deviceId": "lamp-1", "state": {"power": "on"}}).status == 201
    return api


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_acquire_status_heartbeat_release(lamp):
    acquired = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": 30, "owner": "firmware-job"})
    assert acquired.status == 201, acquired.text
    lease = acquired.json
    assert set(lease) == {"deviceId", "leaseId", "leaseToken", "fencingToken", "expiresAt", "ttlSeconds"}
    assert lease["ttlSeconds"] == 30 and epoch(lease["expiresAt"]) == pytest.approx(time.time() + 30, abs=5)
    assert acquired.header("Location") == f"/devices/lamp-1/leases/{lease['leaseId']}"
    status = lamp("GET", "/devices/lamp-1/leases")
    assert status.json == {"deviceId": "lamp-1", "queueLength": 0, "queue": [], "holder": {
        "fencingToken": lease["fencingToken"], "expiresAt": lease["expiresAt"], "owner": "firmware-job"}}
    beat = lamp("PUT", f"/devices/lamp-1/leases/{lease['leaseId']}", {"ttlSeconds": 120})
    assert beat.status == 200 and epoch(beat.json["expiresAt"]) == pytest.approx(time.time() + 120, abs=5)
    assert lamp("PUT", f"/devices/lamp-1/leases/{lease['leaseId']}").status == 200  # no body: its own ttl
    assert lamp("DELETE", f"/devices/lamp-1/leases/{lease['leaseId']}").status == 204
    assert lamp("DELETE", f"/devices/lamp-1/leases/{lease['leaseId']}").status == 204  # already gone: still 204
    gone = lamp("PUT", f"/devices/lamp-1/leases/{lease['leaseId']}")
    assert gone.status == 410 and gone.json["type"].endswith("lease-gone")
    assert lamp("GET", "/devices/lamp-1/leases").json["holder"] is None
    again = lamp("POST", "/devices/lamp-1/leases")  # no body: defaults
    assert again.status == 201 and again.json["ttlSeconds"] == 60
    assert again.json["fencingToken"] > lease["fencingToken"]


def test_a_busy_lease_is_409_with_retry_after_and_the_holders_expiry(lamp):
    holder = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": 40}).json
    busy = lamp("POST", "/devices/lamp-1/leases", {"waitSeconds": 0})
    assert busy.status == 409 and busy.json["type"].endswith("lease-busy")
    assert busy.json["holderExpiresAt"] == holder["expiresAt"]
    assert 30 <= int(busy.header("Retry-After")) <= 41
    assert lamp("GET", "/devices/lamp-1/leases").json["queueLength"] == 0  # the ticket was withdrawn
    started = time.monotonic()
    assert lamp("POST", "/devices/lamp-1/leases", {"waitSeconds": Decimal("0.3")}).status == 409
    assert time.monotonic() - started >= 0.3


def test_writes_to_a_leased_device_need_its_lease_token(lamp):
    lease = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": 30}).json
    token = lease["leaseToken"]
    for method, body, content_type in (("PATCH", {"power": "off"}, MERGE),
                                       ("PUT", {"state": {"power": "off"}}, "application/json"),
                                       ("DELETE", None, "application/json")):
        locked = lamp(method, "/devices/lamp-1", body, content_type=content_type)
        assert locked.status == 423, locked.text
        assert locked.json["leaseExpiresAt"] == lease["expiresAt"] and int(locked.header("Retry-After")) >= 1
        wrong = lamp(method, "/devices/lamp-1", body, content_type=content_type,
                     headers={"Lease-Token": "0" * 32})
        assert wrong.status == 423
    assert lamp("GET", "/devices/lamp-1").json["version"] == 1
    patched = lamp("PATCH", "/devices/lamp-1", {"power": "off"}, content_type=MERGE, headers={"Lease-Token": token})
    assert patched.status == 200 and patched.json["state"] == {"power": "off"}
    put = lamp("PUT", "/devices/lamp-1", {"state": {"power": "dim"}}, headers={"Lease-Token": token,
                                                                                "If-Match": '"2"'})
    assert put.status == 200 and put.json["version"] == 3
    assert lamp("DELETE", f"/devices/lamp-1/leases/{lease['leaseId']}").status == 204
    stale = lamp("PATCH", "/devices/lamp-1", {"power": "x"}, content_type=MERGE, headers={"Lease-Token": token})
    assert stale.status == 409 and stale.json["type"].endswith("lease-not-held")
    assert lamp("PATCH", "/devices/lamp-1", {"power": "on"}, content_type=MERGE).status == 200


def test_a_transaction_operation_carries_its_lease_token(lamp):
    assert lamp("POST", "/devices", {"deviceId": "lamp-2", "state": {}}).status == 201
    lease = lamp("POST", "/devices/lamp-1/leases").json
    operations = [{"deviceId": "lamp-1", "mergePatch": {"scene": "movie"}},
                  {"deviceId": "lamp-2", "mergePatch": {"scene": "movie"}}]
    locked = lamp("POST", "/transactions", {"operations": operations})
    assert locked.status == 423
    assert [(o["index"], o["reason"]) for o in locked.json["operations"]] == [(0, "locked")]
    # as a PATCH locked out answers: when the lease in the way runs out, and Retry-After
    alone = lamp("PATCH", "/devices/lamp-1", {"scene": "movie"}, content_type=MERGE)
    assert alone.status == 423
    assert locked.json["operations"][0]["leaseExpiresAt"] == alone.json["leaseExpiresAt"]
    assert 1 <= int(locked.header("Retry-After")) <= int(alone.header("Retry-After")) + 1
    operations[0]["leaseToken"] = lease["leaseToken"]
    assert lamp("POST", "/transactions", {"operations": operations}).status == 200
    operations[0]["leaseToken"] = "seven"
    assert lamp("POST", "/transactions", {"operations": operations}).status == 400


def test_a_keyed_transaction_sent_again_under_a_later_lease_replays_as_a_keyed_patch_does(lamp):
    """A lease's token is no part of what a write asks: the same keyed transaction sent again
    (device-state tx re-run with its key, under a new lease) replays its answer, as a keyed PATCH
    does with its Lease-Token header, where it was 422 idempotency-key-reused; another body is."""
    def operations(lease, power="off"):
        return {"operations": [{"deviceId": "lamp-1", "mergePatch": {"power": power}, "leaseToken": lease["leaseToken"]}]}

    first = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": 30}).json
    applied = lamp("POST", "/transactions", operations(first), headers={"Idempotency-Key": "k-tx"})
    assert applied.status == 200, applied.text
    assert lamp("DELETE", f"/devices/lamp-1/leases/{first['leaseId']}").status == 204
    second = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": 30}).json
    replay = lamp("POST", "/transactions", operations(second), headers={"Idempotency-Key": "k-tx"})
    assert (replay.status, replay.header("Idempotent-Replayed"), replay.json) == (200, "true", applied.json)
    other = lamp("POST", "/transactions", operations(second, "on"), headers={"Idempotency-Key": "k-tx"})
    assert other.status == 422 and other.json["type"].endswith("idempotency-key-reused")
    assert lamp("GET", "/devices/lamp-1").json["version"] == applied.json["devices"][0]["version"]

@pytest.mark.parametrize("leased_first", [False, True], ids=["token-added", "token-dropped"])
def test_a_keyed_transaction_sent_again_with_a_lease_token_added_or_dropped_replays(lamp, leased_first):
    """A client that retries a keyed transaction after taking a lease (adding its token), or
    after its lease ended (dropping it), asks the same thing: it replays, where it was 422 because
    a body without tokens was fingerprinted as sent and one with tokens without them."""
    def body(lease=None):
        operation = {"deviceId": "lamp-1", "mergePatch": {"power": "off"}}
        return {"operations": [{**operation, "leaseToken": lease["leaseToken"]} if lease else operation]}

    lease = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": 30}).json if leased_first else None
    applied = lamp("POST", "/transactions", body(lease), headers={"Idempotency-Key": "k-tx2"})
    assert applied.status == 200, applied.text
    if lease:
        assert lamp("DELETE", f"/devices/lamp-1/leases/{lease['leaseId']}").status == 204
    else:
        lease = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": 30}).json
    replay = lamp("POST", "/transactions", body(None if leased_first else lease), headers={"Idempotency-Key": "k-tx2"})
    assert (replay.status, replay.header("Idempotent-Replayed"), replay.json) == (200, "true", applied.json)
    assert lamp("GET", "/devices/lamp-1").json["version"] == applied.json["devices"][0]["version"]


@pytest.mark.parametrize("method, path, body", [
    ("POST", "/devices/lamp-1/leases", {"ttlSeconds": 0}),
    ("POST", "/devices/lamp-1/leases", {"ttlSeconds": 901}),
    ("POST", "/devices/lamp-1/leases", {"ttlSeconds": "60"}),
    ("POST", "/devices/lamp-1/leases", {"ttlSeconds": True}),
    ("POST", "/devices/lamp-1/leases", {"waitSeconds": 26}),
    ("POST", "/devices/lamp-1/leases", {"waitSeconds": -1}),
    ("POST", "/devices/lamp-1/leases", {"owner": ""}),
    ("POST", "/devices/lamp-1/leases", {"colour": "red"}),
    ("POST", "/devices/lamp-1/leases", [1]),
    ("PUT", "/devices/lamp-1/leases/1.0123456789abcdef0123", {"ttlSeconds": 1000}),
])
def test_bad_lease_requests_are_400_and_change_nothing(lamp, method, path, body):
    result = lamp(method, path, body)
    assert result.status == 400, result.text
    assert lamp("GET", "/devices/lamp-1/leases").json == {"deviceId": "lamp-1", "holder": None, "queueLength": 0,
                                                          "queue": []}


def test_unknown_devices_and_lease_ids(lamp):
    assert lamp("POST", "/devices/nope/leases").status == 404
    assert lamp("GET", "/devices/nope/leases").status == 404
    assert lamp("PUT", "/devices/lamp-1/leases/garbage").status == 404
    assert lamp("DELETE", "/devices/lamp-1/leases/garbage").status == 404
    assert lamp("PUT", "/devices/lamp-1/leases/7.0123456789abcdef0123456789abcdef").status == 404  # never issued
    assert lamp("PATCH", "/devices/lamp-1", {"a": 1}, content_type=MERGE, headers={"Lease-Token": "x"}).status == 400


def test_only_the_holder_learns_the_lease_token_and_the_fencing_token_opens_nothing(lamp):
    lease = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": 30}).json
    status = lamp("GET", "/devices/lamp-1/leases").text
    assert lease["leaseToken"] not in status and lease["leaseId"] not in status
    for token in (str(lease["fencingToken"]), "0" * 32):
        assert lamp("PATCH", "/devices/lamp-1", {"a": 1}, content_type=MERGE,
                    headers={"Lease-Token": token}).status in (400, 423)
    beat = lamp("PUT", f"/devices/lamp-1/leases/{lease['leaseId']}", {"ttlSeconds": 60}).json
    assert beat["leaseToken"] == lease["leaseToken"]


def test_another_devices_lease_token_opens_nothing(lamp):
    assert lamp("POST", "/devices", {"deviceId": "lamp-2", "state": {}}).status == 201
    mine = lamp("POST", "/devices/lamp-1/leases").json
    lamp("POST", "/devices/lamp-2/leases")
    assert lamp("PATCH", "/devices/lamp-2", {"a": 1}, content_type=MERGE,
                headers={"Lease-Token": mine["leaseToken"]}).status == 423


@pytest.mark.parametrize("ttl", [Decimal("1.9"), Decimal("866.48"), Decimal("30.001")])
def test_fractional_seconds_are_granted_and_heartbeated(lamp, ttl):
    lease = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": ttl, "waitSeconds": Decimal("0.5")})
    assert lease.status == 201, lease.text
    beat = lamp("PUT", f"/devices/lamp-1/leases/{lease.json['leaseId']}", {"ttlSeconds": ttl})
    assert beat.status == 200, beat.text
    assert lamp("DELETE", f"/devices/lamp-1/leases/{lease.json['leaseId']}").status == 204


def test_a_deleted_device_ends_its_lease_queue(lamp):
    lease = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": 600}).json
    assert lamp("DELETE", "/devices/lamp-1", headers={"Lease-Token": lease["leaseToken"]}).status == 204
    assert lamp("POST", "/devices", {"deviceId": "lamp-1", "state": {}}).status == 201
    again = lamp("POST", "/devices/lamp-1/leases")
    assert again.status == 201, again.text
    assert lamp("GET", "/devices/lamp-1/leases").json["queueLength"] == 0


def test_a_lease_id_never_issued_is_404_and_an_ended_one_410(lamp):
    lease = lamp("POST", "/devices/lamp-1/leases").json
    forged_secret = f"{lease['leaseId'].split('.')[0]}.{'0' * 32}"
    never_drawn = f"{lease['fencingToken'] + 50}.{'0' * 32}"
    ticket_zero = f"0.{'0' * 32}"  # tickets start at 1: never one drawn, though below the counter
    for lease_id in (forged_secret, never_drawn, ticket_zero):
        assert lamp("PUT", f"/devices/lamp-1/leases/{lease_id}").status == 404
        assert lamp("DELETE", f"/devices/lamp-1/leases/{lease_id}").status == 404
    assert lamp("DELETE", f"/devices/lamp-1/leases/{lease['leaseId']}").status == 204
    assert lamp("PUT", f"/devices/lamp-1/leases/{lease['leaseId']}").status == 410


def test_every_write_verb_refuses_a_lease_token_of_no_lease_alike(lamp):
    token = {"Lease-Token": "0" * 32}
    assert lamp("PATCH", "/devices/lamp-1", {"a": 1}, content_type=MERGE, headers=token).status == 409
    assert lamp("PUT", "/devices/lamp-1", {"state": {}}, headers=token).status == 409
    created = lamp("PUT", "/devices/new-one", {"state": {}}, headers=token)
    assert created.status == 409 and created.json["type"].endswith("lease-not-held")
    assert lamp("GET", "/devices/new-one").status == 404
    assert lamp("DELETE", "/devices/lamp-1", headers=token).status == 409


# ---- Issue 27 row 4: devices cannot lock out their owners.

def _device_lease(lamp, ttl=60):
    grant = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": ttl, "owner": "lamp"},
                 headers=bearer(device="lamp-1"))
    assert grant.status == 201, grant.text
    return grant.json


WRITES = (("PATCH", "/devices/lamp-1", {"power": "off"}, MERGE),
          ("PATCH", "/devices/lamp-1/desired", {"power": "off"}, MERGE),
          ("PUT", "/devices/lamp-1/desired", {"desired": {"power": "off"}}, "application/json"),
          ("PUT", "/devices/lamp-1", {"state": {"power": "off"}}, "application/json"),
          ("DELETE", "/devices/lamp-1", None, "application/json"))


def test_a_back_end_ends_a_devices_lease_and_then_every_write_of_its_goes_through(lamp):
    lease = _device_lease(lamp)
    for method, path, body, content_type in WRITES:
        assert lamp(method, path, body, content_type=content_type).status == 423
    status = lamp("GET", "/devices/lamp-1/leases").json
    assert status["holder"]["fencingToken"] == lease["fencingToken"] and status["holder"]["owner"] == "lamp"
    assert lamp("DELETE", f"/devices/lamp-1/leases/{status['holder']['fencingToken']}").status == 204
    assert lamp("GET", "/devices/lamp-1/leases").json["holder"] is None
    for method, path, body, content_type in WRITES:
        assert lamp(method, path, body, content_type=content_type).status in (200, 204), (method, path)


def test_an_ended_lease_is_gone_for_its_holder_and_its_token_writes_nothing(lamp):
    lamp_token = bearer(device="lamp-1")
    lease = _device_lease(lamp)
    assert lamp("DELETE", f"/devices/lamp-1/leases/{lease['fencingToken']}").status == 204
    gone = lamp("PUT", f"/devices/lamp-1/leases/{lease['leaseId']}", headers=lamp_token)
    assert gone.status == 410 and gone.json["type"].endswith("lease-gone"), gone.text
    version = lamp("GET", "/devices/lamp-1").json["version"]
    reported = lamp("PATCH", "/devices/lamp-1/reported", {"power": "x"}, content_type=MERGE,
                    headers={**lamp_token, "Lease-Token": lease["leaseToken"]})
    assert reported.status == 409 and reported.json["type"].endswith("lease-not-held")
    newer = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": 30}).json  # a back-end's, right after
    for method, path, body, content_type in WRITES:  # the old token opens nothing under the newer lease
        refused = lamp(method, path, body, content_type=content_type, headers={"Lease-Token": lease["leaseToken"]})
        assert refused.status == 423, (method, path, refused.text)
    assert lamp("GET", "/devices/lamp-1").json["version"] == version
    assert lamp("DELETE", f"/devices/lamp-1/leases/{lease['leaseId']}", headers=lamp_token).status == 204  # gone
    assert lamp("GET", "/devices/lamp-1/leases").json["holder"]["fencingToken"] == newer["fencingToken"]


@pytest.mark.parametrize("ttl", [Decimal("60.001"), 61, 900])
def test_a_devices_lease_is_capped_at_60_seconds_a_back_ends_is_not(lamp, ttl):
    device = bearer(device="lamp-1")
    refused = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": ttl}, headers=device)
    assert refused.status == 400 and "from 1 to 60 for a device" in refused.json["detail"], refused.text
    assert lamp("GET", "/devices/lamp-1/leases").json["holder"] is None
    lease = _device_lease(lamp, 60)
    assert lamp("PUT", f"/devices/lamp-1/leases/{lease['leaseId']}", {"ttlSeconds": ttl}, headers=device).status == 400
    assert lamp("GET", "/devices/lamp-1/leases").json["holder"]["expiresAt"] == lease["expiresAt"]
    assert lamp("PUT", f"/devices/lamp-1/leases/{lease['leaseId']}", headers=device).status == 200  # its own 60 s
    assert lamp("DELETE", f"/devices/lamp-1/leases/{lease['leaseId']}", headers=device).status == 204
    assert lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": ttl}).status == 201  # a back-end's


def test_ending_a_lease_by_its_fencing_token(lamp):
    lease = lamp("POST", "/devices/lamp-1/leases", {"ttlSeconds": 30}).json
    token = lease["fencingToken"]
    for unknown in (str(token + 50), "0", f"0{token}", "-1", "1" * 39):
        assert lamp("DELETE", f"/devices/lamp-1/leases/{unknown}").status == 404, unknown
    assert lamp("GET", "/devices/lamp-1/leases").json["holder"]["fencingToken"] == token
    assert lamp("DELETE", "/devices/nope/leases/1").status == 404
    assert lamp("PUT", f"/devices/lamp-1/leases/{token}").status == 404  # a fencing token heartbeats nothing
    assert lamp("DELETE", f"/devices/lamp-1/leases/{token}").status == 204
    assert lamp("DELETE", f"/devices/lamp-1/leases/{token}").status == 204  # ended already
    assert lamp("POST", "/devices/lamp-1/leases", {"waitSeconds": 0}).status == 201  # free at once
