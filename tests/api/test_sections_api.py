"""Desired, reported and delta through the real handler: section routes, the lean delta
document with its ETag and long-poll, include=metadata, and every precondition a state
write has."""

from __future__ import annotations

import threading
import time

import pytest

from tests.unit.test_sections import DELTA_CASES

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def lamp(api, **sections):
    assert api("POST", "/devices", {"deviceId": "lamp-1", "state": {"room": "kitchen"}, **sections}).status == 201


def test_a_device_carries_desired_reported_and_delta(api):
    created = api("POST", "/devices", {"deviceId": "lamp-1", "state": {}, "desired": {"power": "on"}})
    assert created.status == 201
    assert {key: created.json[key] for key in ("desired", "reported", "delta")} == {
        "desired": {"power": "on"}, "reported": {}, "delta": {"power": "on"}}
    assert "metadata" not in created.json
    reported = api("PATCH", "/devices/lamp-1/reported", {"power": "on", "firmware": "1.4.2"}, content_type=MERGE)
    assert reported.status == 200 and reported.header("ETag") == '"2"'
    assert reported.json["delta"] == {} and reported.json["reported"] == {"power": "on", "firmware": "1.4.2"}


@pytest.mark.parametrize("desired, reported, expected", DELTA_CASES[:8] + DELTA_CASES[-6:])
def test_the_delta_rules_through_http(api, desired, reported, expected):
    lamp(api, desired=desired, reported=reported)
    answer = api("GET", "/devices/lamp-1/delta")
    assert answer.status == 200 and answer.json == {"deviceId": "lamp-1", "version": 1, "delta": expected}
    assert answer.header("ETag") == '"1"'


def test_section_writes_patch_and_replace_one_section_under_the_one_version(api):
    lamp(api, desired={"a": 1, "b": 2})
    patched = api("PATCH", "/devices/lamp-1/desired", [{"op": "replace", "path": "/a", "value": 10}],
                  content_type=JSON_PATCH)
    assert patched.status == 200 and patched.json["desired"] == {"a": 10, "b": 2} and patched.json["version"] == 2
    removed = api("PATCH", "/devices/lamp-1/desired", {"b": None}, content_type=MERGE)
    assert removed.json["desired"] == {"a": 10}
    replaced = api("PUT", "/devices/lamp-1/reported", {"reported": {"a": 10}})
    assert replaced.status == 200 and replaced.json["version"] == 4 and replaced.json["delta"] == {}
    assert replaced.json["state"] == {"room": "kitchen"}
    assert api("GET", "/devices/lamp-1").json["reported"] == {"a": 10}


def test_metadata_only_when_asked_and_confirmation(api):
    lamp(api)
    desired = api("PATCH", "/devices/lamp-1/desired?include=metadata", {"brightness": 80}, content_type=MERGE)
    assert desired.json["metadata"]["desired"]["brightness"]["version"] == 2
    assert "confirmedVersion" not in desired.json["metadata"]["desired"]["brightness"]
    api("PATCH", "/devices/lamp-1/reported", {"brightness": 80}, content_type=MERGE)
    shown = api("GET", "/devices/lamp-1?include=metadata").json["metadata"]
    assert shown["desired"]["brightness"]["confirmedVersion"] == 3
    assert shown["reported"]["brightness"]["version"] == 3
    assert "metadata" not in api("GET", "/devices/lamp-1").json
    api("PATCH", "/devices/lamp-1/desired", {"brightness": 80}, content_type=MERGE)  # desired again: unconfirmed
    again = api("GET", "/devices/lamp-1?include=metadata").json["metadata"]["desired"]["brightness"]
    assert again["version"] == 4 and "confirmedVersion" not in again
    listed = api("GET", "/devices?include=metadata").json["items"][0]
    assert listed["metadata"]["desired"]["brightness"]["version"] == 4
    assert api("GET", "/devices/lamp-1?include=everything").status == 400


@pytest.mark.parametrize("patch", [{"a": {}}, {"a": {"x": {}}}, {"gone": None}, {"a": {"gone": None}}])
def test_a_merge_patch_that_changes_nothing_keeps_the_metadata_and_the_confirmation(api, patch):
    lamp(api, desired={"a": {"x": {"y": 1}, "z": 2}})
    api("PATCH", "/devices/lamp-1/reported", {"a": {"x": {"y": 1}, "z": 2}}, content_type=MERGE)
    before = api("GET", "/devices/lamp-1?include=metadata").json["metadata"]
    assert before["desired"]["a"]["x"]["y"]["confirmedVersion"] == 2
    same = api("PATCH", "/devices/lamp-1/reported?include=metadata", patch, content_type=MERGE)
    assert same.status == 200 and same.json["version"] == 3 and same.json["delta"] == {}
    assert same.json["metadata"] == before


@pytest.mark.parametrize("section", ["desired", "reported"])
def test_removing_an_absent_member_of_an_empty_object_keeps_the_metadata_and_the_confirmation(api, section):
    lamp(api, desired={"a": {}})
    api("PATCH", "/devices/lamp-1/reported", {"a": {}}, content_type=MERGE)
    before = api("GET", "/devices/lamp-1?include=metadata").json["metadata"]
    assert before["desired"]["a"]["confirmedVersion"] == 2
    same = api("PATCH", f"/devices/lamp-1/{section}?include=metadata", {"a": {"gone": None}}, content_type=MERGE)
    assert same.status == 200 and same.json["version"] == 3 and same.json["delta"] == {}
    assert same.json["metadata"] == before


def test_the_delta_etag_and_if_none_match(api):
    lamp(api, desired={"a": 1})
    first = api("GET", "/devices/lamp-1/delta")
    assert api("GET", "/devices/lamp-1/delta", headers={"If-None-Match": first.header("ETag")}).status == 304
    assert api("HEAD", "/devices/lamp-1/delta").status == 200
    api("PATCH", "/devices/lamp-1/reported", {"a": 1}, content_type=MERGE)
    assert api("GET", "/devices/lamp-1/delta", headers={"If-None-Match": first.header("ETag")}).json["delta"] == {}


def test_a_delta_long_poll_answers_at_once_when_a_section_changed_since(api):
    lamp(api, desired={"a": 1})
    started = time.monotonic()
    answer = api("GET", "/devices/lamp-1/delta?since=0&waitSeconds=5")
    assert answer.json["delta"] == {"a": 1} and time.monotonic() - started < 2


def test_a_delta_long_poll_waits_for_a_section_write_and_not_for_a_state_write(api):
    lamp(api)

    def later():
        time.sleep(0.3)
        api("PATCH", "/devices/lamp-1", {"other": 1}, content_type=MERGE)  # state only: no wake-up
        time.sleep(0.3)
        api("PATCH", "/devices/lamp-1/desired", {"power": "on"}, content_type=MERGE)

    writer = threading.Thread(target=later)
    started = time.monotonic()
    writer.start()
    answer = api("GET", "/devices/lamp-1/delta?since=1&waitSeconds=10")
    writer.join()
    assert answer.json == {"deviceId": "lamp-1", "version": 3, "delta": {"power": "on"}}
    assert 0.5 < time.monotonic() - started < 5


@pytest.mark.parametrize("query", ["since=1&waitSeconds=10", "waitSeconds=10"])
def test_a_delta_long_poll_whose_if_match_held_answers_the_change_it_waited_for(api, query):
    """If-Match is judged on the version the request found: the write it waits for moves the
    version on, which must not turn its answer into a 412 (found by a hostile review)."""
    lamp(api, desired={"a": 1})

    def later():
        time.sleep(0.3)
        api("PATCH", "/devices/lamp-1/desired", {"b": 2}, content_type=MERGE)

    writer = threading.Thread(target=later)
    writer.start()
    answer = api("GET", f"/devices/lamp-1/delta?{query}", headers={"If-Match": '"1"'})
    writer.join()
    assert (answer.status, answer.json) == (200, {"deviceId": "lamp-1", "version": 2, "delta": {"a": 1, "b": 2}})


def test_a_delta_long_poll_ends_at_its_deadline_with_the_current_delta(api):
    lamp(api, desired={"a": 1})
    started = time.monotonic()
    answer = api("GET", "/devices/lamp-1/delta?since=1&waitSeconds=1")
    assert answer.status == 200 and answer.json["delta"] == {"a": 1} and time.monotonic() - started >= 1


def test_a_delta_long_poll_without_since_waits_for_the_next_section_write(api):
    lamp(api, desired={"a": 1})  # a delta already there does not end the wait: no version was given

    def later():
        time.sleep(0.5)
        api("PATCH", "/devices/lamp-1/desired", {"b": 2}, content_type=MERGE)

    writer = threading.Thread(target=later)
    started = time.monotonic()
    writer.start()
    answer = api("GET", "/devices/lamp-1/delta?waitSeconds=10")
    writer.join()
    assert answer.json == {"deviceId": "lamp-1", "version": 2, "delta": {"a": 1, "b": 2}}
    assert 0.4 < time.monotonic() - started < 5


@pytest.mark.parametrize("query", ["since=-1", "since=x", "waitSeconds=21&since=1", "other=1",
                                   "since=1000000000000000000"])
def test_bad_delta_queries_are_400(api, query):
    lamp(api)
    assert api("GET", f"/devices/lamp-1/delta?{query}").status == 400


def test_section_writes_have_every_precondition(api, monkeypatch):
    lamp(api)
    assert api("PATCH", "/devices/lamp-1/desired", {"a": 1}, content_type=MERGE,
               headers={"If-Match": '"9"'}).status == 412
    assert api("PUT", "/devices/lamp-1/desired", {"desired": {"a": 1}}, headers={"If-Match": '"9"'}).status == 412
    assert api("PATCH", "/devices/lamp-1/reported", {"a": 1}, content_type=MERGE,
               headers={"If-None-Match": "*"}).status == 412
    ok = api("PUT", "/devices/lamp-1/reported", {"reported": {"a": 1}}, headers={"If-Match": '"1"'})
    assert ok.status == 200 and ok.json["version"] == 2
    assert api("GET", "/devices/lamp-1").json["version"] == 2
    monkeypatch.setenv("REQUIRE_IF_MATCH", "true")
    from functions.config import api_config as load_config
    load_config.cache_clear()
    assert api("PATCH", "/devices/lamp-1/reported", {"a": 2}, content_type=MERGE).status == 428
    assert api("PUT", "/devices/lamp-1/desired", {"desired": {}}).status == 428


@pytest.mark.parametrize("method, path, body, content_type, status", [
    ("PATCH", "/devices/lamp-1/desired", "[1]", MERGE, 400),
    ("PATCH", "/devices/lamp-1/desired", '{"a": 1}', "text/plain", 415),
    ("PATCH", "/devices/lamp-1/desired", '[{"op": "test", "path": "/x", "value": 1}]', JSON_PATCH, 409),
    ("PATCH", "/devices/lamp-1/reported", '[{"op": "move", "from": "/nope", "path": "/y"}]', JSON_PATCH, 422),
    ("PUT", "/devices/lamp-1/desired", '{"reported": {}}', "application/json", 400),
    ("PUT", "/devices/lamp-1/desired", '{"desired": []}', "application/json", 400),
    ("PUT", "/devices/lamp-1/desired", '{"desired": {"": 1}}', "application/json", 400),
    ("PUT", "/devices/lamp-1/desired", '{"desired": {"big": "' + "x" * 500_000 + '"}}', "application/json", 413),
    ("POST", "/devices", '{"deviceId": "lamp-2", "state": {}, "desired": 5}', "application/json", 400),
    ("PATCH", "/devices/nope/desired", '{"a": 1}', MERGE, 404),
    ("PUT", "/devices/nope/reported", '{"reported": {}}', "application/json", 404),
])
def test_bad_section_writes_are_refused_and_change_nothing(api, method, path, body, content_type, status):
    lamp(api)
    answer = api(method, path, raw=body, content_type=content_type)
    assert answer.status == status, answer.text
    assert answer.header("Content-Type") == "application/problem+json"
    assert api("GET", "/devices/lamp-1").json["version"] == 1


def test_put_device_replaces_only_the_sections_it_names(api):
    lamp(api, desired={"a": 1}, reported={"b": 1})
    replaced = api("PUT", "/devices/lamp-1", {"state": {"n": 1}, "reported": {"b": 2}})
    assert replaced.status == 200
    assert (replaced.json["state"], replaced.json["desired"], replaced.json["reported"]) == (
        {"n": 1}, {"a": 1}, {"b": 2})
    created = api("PUT", "/devices/lamp-2", {"state": {}, "desired": {"x": 1}})
    assert created.status == 201 and created.json["delta"] == {"x": 1}


def test_an_idempotent_section_write_replays_and_the_key_is_bound_to_its_route(api):
    lamp(api)
    headers = {"Idempotency-Key": "report-1"}
    first = api("PATCH", "/devices/lamp-1/reported", {"n": 1}, content_type=MERGE, headers=headers)
    again = api("PATCH", "/devices/lamp-1/reported?include=metadata", {"n": 1}, content_type=MERGE, headers=headers)
    assert again.status == 200 and again.header("Idempotent-Replayed") == "true"
    assert again.json["version"] == first.json["version"] == 2 and again.json["metadata"]["reported"]["n"]
    other_route = api("PATCH", "/devices/lamp-1/desired", {"n": 1}, content_type=MERGE, headers=headers)
    assert other_route.status == 422
    assert api("GET", "/devices/lamp-1").json["version"] == 2


def test_a_lease_fences_section_writes(api):
    lamp(api)
    lease = api("POST", "/devices/lamp-1/leases", {"ttlSeconds": 30})
    assert lease.status in (200, 201), lease.text
    token = lease.json["leaseToken"]
    assert api("PATCH", "/devices/lamp-1/reported", {"n": 1}, content_type=MERGE).status == 423
    assert api("PUT", "/devices/lamp-1/desired", {"desired": {"n": 1}}).status == 423
    held = api("PATCH", "/devices/lamp-1/reported", {"n": 1}, content_type=MERGE, headers={"Lease-Token": token})
    assert held.status == 200 and held.json["reported"] == {"n": 1}


def test_a_section_route_allows_only_its_methods(api):
    lamp(api)
    answer = api("DELETE", "/devices/lamp-1/desired")
    assert answer.status == 405 and answer.header("Allow") == "PATCH, PUT"
    assert api("POST", "/devices/lamp-1/delta").header("Allow") == "GET, HEAD"


def test_the_feed_filters_by_section_and_next_since_moves_past_what_it_filtered(api):
    from functions.device_state.feed.log import ChangeLog
    from functions.device_state.write.store import Store

    store, log, previous = Store(api.client, api.table), ChangeLog(api.client, api.table), None

    def recorded(answer):  # the stream processor's step, on the item as each write left it
        nonlocal previous
        item = store.get_state("lamp-1")
        log.record(previous, item)
        previous = item
        return answer

    recorded(lamp(api))
    recorded(api("PATCH", "/devices/lamp-1", {"x": 1}, content_type=MERGE))
    recorded(api("PATCH", "/devices/lamp-1/desired", {"power": "on"}, content_type=MERGE))
    recorded(api("PATCH", "/devices/lamp-1/reported", {"power": "on"}, content_type=MERGE))
    recorded(api("PATCH", "/devices/lamp-1", {"x": 2}, content_type=MERGE))
    page = api("GET", "/devices/lamp-1/changes?since=1&sections=desired,reported").json
    assert [(c["version"], c["sections"]) for c in page["changes"]] == [(3, ["desired"]), (4, ["reported"])]
    assert page["changes"][0]["patch"] == [{"op": "add", "path": "/desired/power", "value": "on"}]
    assert page["nextSince"] == 5  # past the state change it left out: no version is skipped silently
    only_state = api("GET", "/devices/lamp-1/changes?since=2&sections=state&limit=2").json
    assert only_state == {"changes": [], "nextSince": 4}
    assert api("GET", "/devices/lamp-1/changes?sections=desired,bogus").status == 400
    assert api("GET", "/devices/lamp-1/changes?sections=").status == 400
    version = api("GET", "/devices/lamp-1/versions/3?include=metadata").json
    assert version["desired"] == {"power": "on"} and version["delta"] == {"power": "on"}
    assert version["metadata"]["desired"]["power"]["version"] == 3


def test_a_transaction_names_sections_on_patches_and_puts(api):
    lamp(api)
    answer = api("POST", "/transactions", {"operations": [
        {"deviceId": "lamp-1", "section": "desired", "mergePatch": {"power": "on"}},
        {"deviceId": "lamp-2", "put": {"state": {}, "desired": {"power": "on"}, "reported": {"power": "off"}}},
    ]})
    assert answer.status == 200, answer.text
    assert [(d["desired"], d["delta"]) for d in answer.json["devices"]] == [({"power": "on"}, {"power": "on"}),
                                                                          ({"power": "on"}, {"power": "on"})]
    assert api("GET", "/devices/lamp-1").json["state"] == {"room": "kitchen"}
    for bad in ({"deviceId": "lamp-1", "section": "delta", "mergePatch": {}},
                {"deviceId": "lamp-1", "section": "desired", "delete": True},
                {"deviceId": "lamp-1", "put": {"state": {}, "desired": []}}):
        assert api("POST", "/transactions", {"operations": [bad]}).status == 400
    assert api("GET", "/devices/lamp-1").json["version"] == 2
