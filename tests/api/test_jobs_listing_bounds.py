"""GET /jobs stays within what a Lambda may answer: each job shows its desired (8 KB as stored,
up to 6 times that escaped) and its filter, and a page of 100 of the largest was 7 MB, which the
HTTP API answers 500. A page stops before the job that would take it past 2 MB of JSON, with a
cursor to the rest."""

from __future__ import annotations

import pytest

from functions.api.common import fits_in_an_answer
from functions.device_state import DeviceStateManager, FleetIndex
from functions.device_state.client import dynamodb_client
from functions.device_state.table import create_table
from tests.conftest import new_table_name, table_admin

INDEX = "reported/battery:number"


@pytest.fixture
def engine(dynamodb_local, monkeypatch):
    client, admin = dynamodb_client(dynamodb_local.endpoint, "us-east-1"), table_admin(dynamodb_local.endpoint)
    name, fleet = new_table_name(), FleetIndex.parse(INDEX)
    create_table(admin, name, fleet_index=fleet, stream=False)
    DeviceStateManager(client, name, fleet_index=fleet).reindex()
    monkeypatch.setenv("FLEET_INDEX", INDEX)
    yield client, name
    admin.delete_table(TableName=name)


def test_a_page_of_the_largest_jobs_fits_in_a_lambdas_answer_and_the_walk_finds_each_once(api):
    core = "lt(reported/battery,20)"
    longest_filter = core[:3] + "\t" * (4096 - len(core)) + core[3:]  # whitespace RQL allows, escaped in JSON
    for number in range(100):
        created = api("POST", "/jobs", {"jobId": f"job{number:03d}", "filter": longest_filter,
                                        "desired": {"k": "\x01" * 8187}})
        assert created.status == 201, created.text[:300]
    found, cursor, pages = [], None, 0
    while True:
        page = api("GET", "/jobs?limit=100" + (f"&cursor={cursor}" if cursor else ""))
        assert page.status == 200 and fits_in_an_answer(page.json)
        found += [job["jobId"] for job in page.json["items"]]
        cursor, pages = page.json["nextCursor"], pages + 1
        if cursor is None:
            break
    assert sorted(found) == [f"job{number:03d}" for number in range(100)] and len(found) == 100
    assert pages > 1
