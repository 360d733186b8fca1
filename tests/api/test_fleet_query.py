"""Fleet query over the real local server (``make serve`` with FLEET_INDEX) on DynamoDB Local:
filters, paging, sort, counts and group-by compared with a model of the same devices
written here in plain Python (not the service's evaluator), fresh reads after writes,
and every refusal."""

from __future__ import annotations

import json
import random
import urllib.parse
import uuid
from collections import Counter
from decimal import Decimal

import pytest

from tests.api.test_http import launch
from tests.auth import bearer

pytestmark = pytest.mark.dynamodb_local

DECLARED = ("reported/firmware:string,reported/online:boolean,reported/battery:number,state/site:string,"
            "desired/brightness:number")
DEVICES = 70
MISSING = object()


def _device(number: int, rng: random.Random) -> dict:
    def maybe(*choices):
        return rng.choice(choices)

    state, desired, reported = {"serial": number}, {}, {}
    site = maybe("berlin-1", "berlin-2", "berlin-3", "paris-1", "münchen", "", MISSING, 7)
    if site is not MISSING:
        state["site"] = site
    if rng.random() < 0.3:
        state["color"] = maybe("red", "blue")
    firmware = maybe("2.0", "2.1", "2.10", "1.9", "3.0", MISSING, 2.1, {"v": 1})
    if firmware is not MISSING:
        reported["firmware"] = firmware
    online = maybe(True, False, MISSING, "yes")
    if online is not MISSING:
        reported["online"] = online
    battery = maybe(rng.randint(0, 100), rng.randint(0, 100), "low", MISSING, 55.5, 0)
    if battery is not MISSING:
        reported["battery"] = battery
    if rng.random() < 0.6:
        desired["brightness"] = rng.choice((10, 50, 80))
        if rng.random() < 0.5:
            reported["brightness"] = desired["brightness"]
        elif rng.random() < 0.5:
            reported["brightness"] = 1
    return {"deviceId": f"fq-{number:03d}", "state": state, "desired": desired, "reported": reported}


def value(device: dict, path: str, kind):
    """The device's value at ``path`` when it is of Python type ``kind`` (as declared), else MISSING."""
    section, *parts = path.split("/")
    current = device[section]
    for part in parts:
        if not isinstance(current, dict) or part not in current:
            return MISSING
        current = current[part]
    if kind is bool:
        return current if isinstance(current, bool) else MISSING
    if kind is Decimal:
        return Decimal(str(current)) if isinstance(current, (int, float)) and not isinstance(current, bool) \
            else MISSING
    return current if isinstance(current, kind) else MISSING


def firmware(d):
    return value(d, "reported/firmware", str)


def battery(d):
    return value(d, "reported/battery", Decimal)


def online(d):
    return value(d, "reported/online", bool)


def site(d):
    return value(d, "state/site", str)


def has_delta(d, leaf=None):
    keys = [leaf] if leaf else list(d["desired"])
    return any(key in d["desired"] and (key not in d["reported"] or d["reported"][key] != d["desired"][key])
               for key in keys)


def present(x):
    return x is not MISSING


FILTERS = [
    ('eq(reported/firmware,"2.1")', lambda d: firmware(d) == "2.1"),
    ('ne(reported/firmware,"2.1")', lambda d: present(firmware(d)) and firmware(d) != "2.1"),
    ("gt(reported/battery,50)", lambda d: present(battery(d)) and battery(d) > 50),
    ("ge(reported/battery,50)", lambda d: present(battery(d)) and battery(d) >= 50),
    ("lt(reported/battery,20.5)", lambda d: present(battery(d)) and battery(d) < Decimal("20.5")),
    ("le(reported/battery,0)", lambda d: present(battery(d)) and battery(d) <= 0),
    ('in(reported/firmware,"2.0","3.0","9.9","2.0")', lambda d: firmware(d) in ("2.0", "3.0")),
    ('like(state/site,"berlin-*")', lambda d: present(site(d)) and site(d).startswith("berlin-")),
    ("exists(state/site)", lambda d: present(site(d))),
    ("eq(reported/online,true)", lambda d: online(d) is True),
    ("eq(reported/online,false)", lambda d: online(d) is False),
    ("and(eq(reported/online,true),gt(reported/battery,30))",
     lambda d: online(d) is True and present(battery(d)) and battery(d) > 30),
    ('or(eq(state/site,"paris-1"),lt(reported/battery,10))',
     lambda d: site(d) == "paris-1" or (present(battery(d)) and battery(d) < 10)),
    ('and(like(state/site,"berlin*"),not(eq(reported/online,true)))',
     lambda d: present(site(d)) and site(d).startswith("berlin") and online(d) is not True),
    ("and(exists(desired/brightness),exists(delta/brightness))",
     lambda d: present(value(d, "desired/brightness", Decimal)) and has_delta(d, "brightness")),
    ("and(exists(reported/battery),exists(delta))", lambda d: present(battery(d)) and has_delta(d)),
    ('and(eq(reported/online,true),eq(state/color,"red"))',
     lambda d: online(d) is True and d["state"].get("color") == "red"),
    ('or(in(reported/battery,1,2,3,55.5),eq(state/site,"münchen"))',
     lambda d: battery(d) in (1, 2, 3, Decimal("55.5")) or site(d) == "münchen"),
    ("and(ge(reported/battery,10),le(reported/battery,20))",
     lambda d: present(battery(d)) and 10 <= battery(d) <= 20),
    ('eq(state/site,"")', lambda d: site(d) == ""),
    ('and(exists(reported/firmware),not(like(reported/firmware,"2.*")))',
     lambda d: present(firmware(d)) and not firmware(d).startswith("2.")),
    ('like(reported/firmware,"*")', lambda d: present(firmware(d))),
    ("or(gt(reported/battery,30),gt(reported/battery,60),eq(reported/online,false))",
     lambda d: (present(battery(d)) and battery(d) > 30) or online(d) is False),
    ('and(gt(reported/battery,5),or(eq(state/site,"berlin-1"),eq(state/site,"berlin-2")))',
     lambda d: present(battery(d)) and battery(d) > 5 and site(d) in ("berlin-1", "berlin-2")),
]


@pytest.fixture(scope="module")
def fleet(dynamodb_local):
    process, server = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"fleet-{uuid.uuid4().hex[:8]}",
                             FLEET_INDEX=DECLARED, STREAM_PROCESSOR="off", WORKERS="4")
    rng = random.Random(30)
    devices = {}
    for number in range(DEVICES):
        device = _device(number, rng)
        status, _, body = server.request("POST", "/devices", device)
        assert status == 201, body
        devices[device["deviceId"]] = device
    yield server, devices
    process.terminate()
    process.wait(timeout=20)


def get(server, path, **query):
    status, headers, body = server.request("GET", f"{path}?{urllib.parse.urlencode(query)}")
    return status, json.loads(body) if body else None


def all_pages(server, filter_text, limit=7, **query):
    ids, cursor, pages = [], None, 0
    while True:
        extra = {"cursor": cursor} if cursor else {}
        status, body = get(server, "/devices", filter=filter_text, limit=limit, **query, **extra)
        assert status == 200, body
        ids += [item["deviceId"] for item in body["items"]]
        cursor, pages = body["nextCursor"], pages + 1
        assert pages < 100
        if cursor is None:
            return ids


@pytest.mark.parametrize("filter_text, predicate", FILTERS, ids=[text for text, _ in FILTERS])
def test_every_page_together_holds_each_matching_device_once_and_the_count_agrees(fleet, filter_text, predicate):
    server, devices = fleet
    expected = sorted(device_id for device_id, device in devices.items() if predicate(device))
    found = all_pages(server, filter_text)
    assert len(found) == len(set(found)), "a device came twice"
    assert sorted(found) == expected
    status, body = get(server, "/devices/count", filter=filter_text)
    assert (status, body) == (200, {"count": len(expected)})


def test_the_model_is_not_trivial(fleet):
    """Each filter matches some devices and misses others, so a wrong answer shows."""
    _, devices = fleet
    for text, predicate in FILTERS:
        matched = sum(map(predicate, devices.values()))
        assert 0 < matched < len(devices) or text == 'eq(state/site,"")', text


@pytest.mark.parametrize("group_filter", ["exists(reported/firmware)", "gt(reported/battery,50)",
                                          'and(like(state/site,"berlin*"),exists(delta))'])
def test_group_by_counts_by_value_most_frequent_first(fleet, group_filter):
    server, devices = fleet
    predicate = dict(FILTERS + [("exists(reported/firmware)", lambda d: present(firmware(d))),
                                ('and(like(state/site,"berlin*"),exists(delta))',
                                 lambda d: present(site(d)) and site(d).startswith("berlin") and has_delta(d))])[
        group_filter]
    matched = [device for device in devices.values() if predicate(device)]
    expected = Counter(None if firmware(device) is MISSING else firmware(device) for device in matched)
    status, body = get(server, "/devices/count", filter=group_filter, groupBy="reported/firmware")
    assert status == 200, body
    assert body["count"] == len(matched)
    assert {group["value"]: group["count"] for group in body["groups"]} == dict(expected)
    counts = [group["count"] for group in body["groups"]]
    assert counts == sorted(counts, reverse=True)


def test_sort_orders_by_the_field_with_devices_lacking_it_last(fleet):
    server, devices = fleet
    # " reported/battery": a + a client sent unencoded, as the query string reads it (it was 400)
    for sort, descending in (("-reported/battery", True), ("+reported/battery", False), (" reported/battery", False)):
        ids = all_pages(server, "exists(reported/firmware)", limit=6, sort=sort)
        matched = [d for d in devices.values() if present(firmware(d))]
        assert sorted(ids) == sorted(d["deviceId"] for d in matched)
        batteries = [battery(devices[device_id]) for device_id in ids]
        held = [b for b in batteries if present(b)]
        assert held == sorted(held, reverse=descending)
        assert batteries[len(held):] == [MISSING] * (len(batteries) - len(held)), "devices lacking it come last"
    ids = all_pages(server, "gt(reported/battery,20)", limit=5, sort="-reported/battery")
    assert [battery(devices[i]) for i in ids] == sorted((battery(d) for d in devices.values()
                                                        if present(battery(d)) and battery(d) > 20), reverse=True)


def test_a_write_is_visible_to_the_next_query_and_count(fleet):
    server, devices = fleet
    device_id = "fq-003"
    for round_no in range(12):
        version = f"9.{round_no}"
        status, _, body = server.request("PATCH", f"/devices/{device_id}/reported", {"firmware": version},
                                         headers={"Content-Type": "application/merge-patch+json"})
        assert status == 200, body
        status, body = get(server, "/devices", filter=f'eq(reported/firmware,"{version}")')
        assert [item["deviceId"] for item in body["items"]] == [device_id]
        assert get(server, "/devices/count", filter=f'eq(reported/firmware,"{version}")')[1] == {"count": 1}
        previous = f"9.{round_no - 1}"
        assert get(server, "/devices/count", filter=f'eq(reported/firmware,"{previous}")')[1] == {"count": 0}
    devices[device_id]["reported"]["firmware"] = "9.11"
    # a value of another type leaves the index at once
    server.request("PATCH", f"/devices/{device_id}/reported", {"firmware": 911},
                   headers={"Content-Type": "application/merge-patch+json"})
    assert get(server, "/devices/count", filter='eq(reported/firmware,"9.11")')[1] == {"count": 0}
    server.request("PATCH", f"/devices/{device_id}/reported", {"firmware": "9.11"},
                   headers={"Content-Type": "application/merge-patch+json"})
    # an increment (a compiled patch) keeps a number field's index
    before = devices["fq-004"]["reported"].get("battery")
    if isinstance(before, int) and not isinstance(before, bool):
        status, _, body = server.request("PATCH", "/devices/fq-004/reported",
                                         raw=json.dumps([{"op": "increment", "path": "/battery", "value": 1000}]).encode(),
                                         headers={"Content-Type": "application/json-patch+json"})
        assert status == 200, body
        assert [item["deviceId"] for item in get(server, "/devices", filter="ge(reported/battery,1000)")[1]["items"]] \
            == ["fq-004"]
        server.request("PATCH", "/devices/fq-004/reported",
                       raw=json.dumps([{"op": "increment", "path": "/battery", "value": -1000}]).encode(),
                       headers={"Content-Type": "application/json-patch+json"})
    # a deleted device leaves every index
    status, _, _ = server.request("POST", "/devices", {"deviceId": "fq-gone", "state": {"site": "gone-1"}})
    assert get(server, "/devices/count", filter='eq(state/site,"gone-1")')[1] == {"count": 1}
    server.request("DELETE", "/devices/fq-gone")
    assert get(server, "/devices/count", filter='eq(state/site,"gone-1")')[1] == {"count": 0}
    assert get(server, "/devices", filter='eq(state/site,"gone-1")')[1]["items"] == []


@pytest.mark.parametrize("path, query, status, slug", [
    ("/devices", {"filter": "eq(reported/firmware,"}, 400, "invalid-filter"),
    ("/devices", {"filter": "eq(reported/firmware,2.1)"}, 400, "invalid-filter"),
    ("/devices", {"filter": "foo(reported/firmware,1)"}, 400, "invalid-filter"),
    ("/devices", {"filter": 'eq(state/x,"y")'}, 400, "unindexed-filter"),
    ("/devices", {"filter": 'or(eq(state/site,"a"),eq(state/x,"y"))'}, 400, "unindexed-filter"),
    ("/devices", {"filter": "exists(delta)"}, 400, "unindexed-filter"),
    ("/devices", {"filter": "not(exists(state/site))"}, 400, "unindexed-filter"),
    ("/devices", {"filter": 'like(state/site,"a*b*")'}, 400, "invalid-filter"),
    ("/devices", {"filter": "exists(state/site)", "sort": "reported/battery"}, 400, "invalid-filter"),
    ("/devices", {"filter": "exists(state/site)", "sort": "+state/x"}, 400, "invalid-filter"),
    ("/devices", {"sort": "+reported/battery"}, 400, "bad-request"),
    ("/devices", {"filter": "exists(state/site)", "cursor": "abc"}, 400, "invalid-cursor"),
    ("/devices", {"filter": "exists(state/site)", "limit": "0"}, 400, "bad-request"),
    ("/devices/count", {}, 400, "bad-request"),
    ("/devices/count", {"filter": "exists(state/site)", "groupBy": "state/x"}, 400, "invalid-filter"),
    ("/devices/count", {"filter": "eq(reported/online,1)"}, 400, "invalid-filter"),
    ("/devices", {"filter": "or(" + ",".join(f'eq(state/site,"a{n}")' for n in range(101)) + ")"}, 400,
     "invalid-filter"),  # 101 ranges of the index; 100 are read (docs/api/fleet-query.md)
    ("/devices", {"filter": "or(" + ",".join(f'eq(state/site,"a{n}")' for n in range(100)) + ")"}, 200, None),
])
def test_bad_queries_are_refused_with_a_problem_naming_the_cause(fleet, path, query, status, slug):
    server, _ = fleet
    got, body = get(server, path, **query)
    assert (got, body.get("type", ":").rsplit(":", 1)[-1] or None) == (status, slug), body
    if slug == "invalid-filter" and "position" in body:
        assert isinstance(body["position"], int)
    if slug == "unindexed-filter":
        assert "FLEET_INDEX" in body["detail"]


def test_a_malformed_filter_names_the_position(fleet):
    server, _ = fleet
    _, body = get(server, "/devices", filter='and(eq(state/site,"a"),gt(reported/battery,))')
    assert body["position"] == len('and(eq(state/site,"a"),gt(reported/battery,')


def test_a_cursor_of_another_filter_is_refused(fleet):
    server, _ = fleet
    _, body = get(server, "/devices", filter="exists(state/site)", limit=2)
    assert body["nextCursor"]
    status, problem = get(server, "/devices", filter="exists(reported/firmware)", cursor=body["nextCursor"])
    assert (status, problem["type"].rsplit(":", 1)[-1]) == (400, "invalid-cursor")


def test_devices_and_callers_without_the_list_right_are_refused_and_learn_nothing(fleet):
    server, _ = fleet
    for headers in (bearer(device="fq-001"), bearer(scopes=("devices.write",)), bearer(scopes=("devices.report",))):
        for path in ("/devices?filter=exists(state/site)", "/devices/count?filter=exists(state/site)"):
            status, _, body = server.request("GET", path, headers=headers)
            assert status == 403, body
            assert b"fq-" not in body
    status, _, _ = server.request("GET", "/devices/count?filter=exists(state/site)", headers={"Authorization": None})
    assert status == 401


def test_the_count_route_is_no_device(fleet):
    server, _ = fleet
    status, _, body = server.request("PUT", "/devices/count", {"state": {}})
    assert status in (400, 405), body
    status, _, body = server.request("POST", "/devices", {"deviceId": "count", "state": {}})
    assert status == 400 and b"reserved" in body


def test_a_page_of_large_devices_holds_at_most_400_kb_of_them_and_the_walk_each_once(dynamodb_local):
    """Twenty devices of 340 KB each. A filter's page of all of them is 6.8 MB, past Lambda's 6 MB
    answer: the invocation fails and the API answers 500, as the dev server does (the filter's
    first page was so while pages were bounded by count alone; the plain listing's held 16
    devices). A page holds one such device, and the walks by a filter and by the plain listing
    each hold every device once."""
    process, server = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"large-{uuid.uuid4().hex[:8]}",
                             FLEET_INDEX="state/site:string", STREAM_PROCESSOR="off", WORKERS="2")
    try:
        expected = [f"large-{number:02}" for number in range(20)]
        for device_id in expected:
            status, _, body = server.request("POST", "/devices", {"deviceId": device_id,
                                                                  "state": {"site": "large", "blob": "x" * 340_000}})
            assert status == 201, body
        for query in ({"filter": 'eq(state/site,"large")'}, {}):
            found, cursor = [], None
            while True:
                status, body = get(server, "/devices", limit=100, **query, **({"cursor": cursor} if cursor else {}))
                assert status == 200, body
                assert len(body["items"]) <= 1, query  # a filter's walk may end on an empty page
                found += [item["deviceId"] for item in body["items"]]
                cursor = body["nextCursor"]
                if cursor is None:
                    break
                assert len(found) <= len(expected), query
            assert sorted(found) == expected, query
    finally:
        process.terminate()
        process.wait(timeout=20)
