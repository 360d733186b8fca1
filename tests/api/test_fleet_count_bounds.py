"""What one fleet count or page may read, over the real local server on DynamoDB Local: a count
that must judge more devices' items than it may (a predicate on an undeclared path or the
delta beside a broad declared one) is refused with a 400 naming those paths, before it reads any
item; narrowed by a declared field it is answered exactly, and so is a broad count the indexes
answer alone; pages of the same broad filter are answered."""

from __future__ import annotations

import json
import urllib.parse
import uuid

import pytest

from functions.device_state import DeviceStateManager, FleetIndex, dynamodb_client
from functions.device_state.fleet.query import MAX_COUNT_ITEMS, MAX_LIMIT
from bench.fleet_load import clone_devices
from tests.api.test_http import launch

pytestmark = pytest.mark.dynamodb_local

DECLARED = "reported/firmware:string,state/site:string"
DEVICES = MAX_COUNT_ITEMS + 1
NARROW = 7  # devices at site "a"; every third device of all holds state/undeclared


def _undeclared(number: int) -> bool:
    return number % 3 == 0


@pytest.fixture(scope="module")
def server(dynamodb_local):
    table_name = f"bounds-{uuid.uuid4().hex[:8]}"
    process, candidate = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=table_name,
                                FLEET_INDEX=DECLARED, WORKERS="2", STREAM_PROCESSOR="off")
    # One written through the library, as the server writes it (the same declaration), the rest
    # its clones with their own state and index attributes: quicker than a thousand writes.
    client, fleet = dynamodb_client(dynamodb_local.endpoint, "us-east-1"), FleetIndex.parse(DECLARED)
    ids = [f"b-{number:04d}" for number in range(DEVICES)]

    def state(device_id: str) -> dict:
        number = int(device_id[2:])
        return {"site": "a" if number < NARROW else "b", **({"undeclared": number} if _undeclared(number) else {})}

    DeviceStateManager(client, table_name, fleet_index=fleet).create(ids[0], state(ids[0]),
                                                                     sections={"reported": {"firmware": "2.0"}})
    clone_devices(client, table_name, fleet, ids[0], ids[1:], lambda device_id: {"state": state(device_id)})
    yield candidate
    process.terminate()
    process.wait(timeout=30)


def get(server, path: str, **query):
    status, _, body = server.request("GET", f"{path}?{urllib.parse.urlencode(query)}")
    return status, json.loads(body)


def count(server, text: str):
    return get(server, "/devices/count", filter=text)


def pages(server, text: str) -> list[str]:
    """The device ids of every page of a fleet query."""
    found, cursor = [], None
    for _ in range(20):
        status, body = get(server, "/devices", filter=text, limit=MAX_LIMIT, **({"cursor": cursor} if cursor else {}))
        assert status == 200, body
        found += [item["deviceId"] for item in body["items"]]
        cursor = body["nextCursor"]
        if cursor is None:
            return found
    raise AssertionError("the walk does not end")


@pytest.mark.parametrize("text, fields", [
    ("and(exists(reported/firmware),exists(state/undeclared))", ["state/undeclared"]),
    ("and(eq(reported/firmware,\"2.0\"),exists(delta))", ["delta"]),
    ("and(like(reported/firmware,\"2*\"),or(exists(state/undeclared),exists(delta/x)))", ["delta/x", "state/undeclared"]),
])
def test_a_count_that_would_judge_more_devices_than_it_may_is_refused_naming_the_paths(server, text, fields):
    status, problem = count(server, text)
    assert status == 400, problem
    assert problem["type"].endswith(":filter-too-broad") and problem["limit"] == "count-items"
    assert problem["fields"] == fields and str(MAX_COUNT_ITEMS) in problem["detail"]
    assert "declared field" in problem["detail"]


def test_the_refusal_is_for_that_count_alone(server):
    """The same predicate narrowed by a declared field is counted exactly, a broad count the
    indexes answer alone is answered, and pages of the refused filter (each reading its own
    bounded share) find exactly the devices it matches."""
    broad = "and(exists(reported/firmware),exists(state/undeclared))"
    assert count(server, broad)[0] == 400
    narrowed = count(server, 'and(eq(state/site,"a"),exists(state/undeclared))')
    assert narrowed == (200, {"count": sum(_undeclared(number) for number in range(NARROW))})
    assert count(server, "exists(reported/firmware)") == (200, {"count": DEVICES})
    assert count(server, 'and(eq(reported/firmware,"2.0"),like(state/site,"a*"))') == (200, {"count": NARROW})
    assert sorted(pages(server, broad)) == [f"b-{number:04d}" for number in range(DEVICES) if _undeclared(number)]
