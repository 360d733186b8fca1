"""GET /devices/{id}/changes and /versions/{v}: in process (problems, parameters) and
through the real dev server, whose stream processor runs on DynamoDB Local's stream."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from functions.changes.events import DETAIL_TYPE
from functions.device_state.feed.items import SNAPSHOT_EVERY, change_sk
from functions.device_state.feed.log import ChangeLog
from functions.device_state.table import state_key
from tests.api.test_http import launch


def _record_old_change(api, device_id):
    """The change item of version 1 as the processor writes it, 8 days after the write."""
    item = api.client.get_item(TableName=api.table, Key=state_key(device_id), ConsistentRead=True)["Item"]
    ChangeLog(api.client, api.table).record(None, {**item, "updatedAt": {"S": "2026-01-01T00:00:00.000Z"}})


def test_since_past_the_retention_is_410_changes_expired_with_the_current_version(api):
    """Version 1's change is past the retention and version 2's is recorded: whether TTL has
    deleted the first yet (DynamoDB Local's sweeper may, at any moment) or not, a follower
    from 0 missed a change and hears 410 with the current version; from 1 it reads on."""
    assert api("POST", "/devices", {"deviceId": "gone", "state": {}}).status == 201
    _record_old_change(api, "gone")
    before = api.client.get_item(TableName=api.table, Key=state_key("gone"), ConsistentRead=True)["Item"]
    assert api("PATCH", "/devices/gone", {"n": 1}, content_type="application/merge-patch+json").status == 200
    after = api.client.get_item(TableName=api.table, Key=state_key("gone"), ConsistentRead=True)["Item"]
    ChangeLog(api.client, api.table).record(before, after)
    result = api("GET", "/devices/gone/changes?since=0")
    assert result.status == 410
    assert result.json["type"].endswith(":changes-expired") and result.json["currentVersion"] == 2
    assert [change["version"] for change in api("GET", "/devices/gone/changes?since=1").json["changes"]] == [2]


def test_history_and_the_feed_answer_each_version_as_it_was_between_and_at_snapshots(api):
    """Most change items hold only their patch (``SNAPSHOT_EVERY``): GET /versions/{v} still
    answers each version as GET /devices/{id} did then, and the feed each change as written."""
    note = "x" * 700  # the sections cost a second write unit: versions between snapshots leave them out
    assert api("POST", "/devices", {"deviceId": "t", "state": {"note": note, "n": 0}}).status == 201
    log, shown, entries = ChangeLog(api.client, api.table), {}, {}
    for n in range(2 * SNAPSHOT_EVERY + 2):
        before = api.client.get_item(TableName=api.table, Key=state_key("t"), ConsistentRead=True).get("Item")
        if n:
            path, body = ("/devices/t/reported", {"n": n}) if n % 3 else ("/devices/t", {"n": n})
            assert api("PATCH", path, body, content_type="application/merge-patch+json").status == 200
        after = api.client.get_item(TableName=api.table, Key=state_key("t"), ConsistentRead=True)["Item"]
        entries[int(after["version"]["N"])] = log.record(None if n == 0 else before, after).as_dict()
        current = api("GET", "/devices/t?include=metadata")
        shown[int(after["version"]["N"])] = (current.headers["ETag"], {
            key: value for key, value in current.json.items() if key != "connectivity"})
    stored = [api.client.get_item(TableName=api.table, Key={**state_key("t"), "sk": {"S": change_sk(v)}})
              ["Item"] for v in shown]
    assert sum("state" not in item for item in stored) > SNAPSHOT_EVERY
    for version, (etag, body) in shown.items():
        answer = api("GET", f"/devices/t/versions/{version}?include=metadata")
        assert (answer.status, answer.headers["ETag"], answer.json) == (200, etag, body), version
    assert api("GET", "/devices/t/changes?since=0").json["changes"] == [entries[v] for v in sorted(entries)]


@pytest.mark.parametrize("query", ["since=-1", "since=x", "limit=0", "limit=101", "waitSeconds=21",
                                   "waitSeconds=1.5", "from=3", "since=1&since=2"])
def test_malformed_parameters_are_400(api, query):
    api("POST", "/devices", {"deviceId": "p", "state": {}})
    assert api("GET", f"/devices/p/changes?{query}").status == 400


def test_unknown_devices_are_404_and_since_past_the_current_version_is_400(api):
    assert api("GET", "/devices/nobody/changes").status == 404
    api("POST", "/devices", {"deviceId": "one", "state": {}})
    assert api("GET", "/devices/one/changes?since=7").status == 400
    assert api("GET", "/devices/one/versions/0").status == 400
    missing = api("GET", "/devices/one/versions/5")
    assert missing.status == 404 and missing.json["type"].endswith(":version-not-found")


# ------------------------------------------------------------------ the dev server


@pytest.fixture(scope="module")
def feed_server(dynamodb_local, tmp_path_factory):
    events = tmp_path_factory.mktemp("events") / "change-events.jsonl"
    process, server = launch(DYNAMODB_ENDPOINT=dynamodb_local.endpoint, TABLE_NAME=f"feed-{uuid.uuid4().hex[:8]}",
                             WORKERS="4", CHANGE_EVENTS_FILE=str(events))
    server.events = events
    yield server
    process.terminate()
    process.wait(timeout=20)


@pytest.mark.dynamodb_local
def test_write_then_long_poll_over_http_and_history(feed_server):
    server = feed_server
    assert server.request("PUT", "/devices/porch", {"state": {"on": False}})[0] == 201
    status, _, body = server.request("GET", "/devices/porch/changes?since=0&waitSeconds=10")
    assert status == 200
    page = json.loads(body)
    # the server's log goes with a failure: once (1 of 4 clean-clone runs) the first change did
    # not reach the feed within 10 s, and its cause is not known yet
    assert [(c["version"], c["kind"]) for c in page["changes"]] == [(1, "created")], server.log[-4000:]
    assert page["changes"][0]["patch"] == [{"op": "add", "path": "/state", "value": {"on": False}},
                                           {"op": "add", "path": "/desired", "value": {}},
                                           {"op": "add", "path": "/reported", "value": {}}]
    assert page["nextSince"] == 1

    result = {}

    def long_poll():
        started = time.monotonic()
        result["answer"] = server.request("GET", "/devices/porch/changes?since=1&waitSeconds=20")
        result["seconds"] = time.monotonic() - started

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(0.5)
    assert poller.is_alive()
    status, headers, _ = server.request("PATCH", "/devices/porch", {"on": True},
                                        headers={"Content-Type": "application/merge-patch+json"})
    assert status == 200 and headers["etag"] == '"2"'
    poller.join(timeout=30)
    status, _, body = result["answer"]
    assert status == 200 and result["seconds"] < 15
    assert json.loads(body) == {"changes": [{
        "deviceId": "porch", "version": 2, "previousVersion": 1, "kind": "updated", "sections": ["state"],
        "patch": [{"op": "replace", "path": "/state/on", "value": True}],
        "updatedAt": json.loads(server.request("GET", "/devices/porch")[2])["updatedAt"]}], "nextSince": 2}

    status, headers, body = server.request("GET", "/devices/porch/versions/1")
    assert status == 200 and headers["etag"] == '"1"' and json.loads(body)["state"] == {"on": False}

    assert server.request("DELETE", "/devices/porch")[0] == 204
    status, _, body = server.request("GET", "/devices/porch/changes?since=2&waitSeconds=10")
    assert [(c["version"], c["kind"], c["patch"]) for c in json.loads(body)["changes"]] == [(3, "deleted", None)]
    assert server.request("GET", "/devices/porch/versions/2")[0] == 200  # history outlives the delete

    events = [json.loads(line) for line in server.events.read_text().splitlines()]
    ours = [e["detail"] for e in events if e["detail"]["deviceId"] == "porch"]
    assert {e["detail-type"] for e in events} == {DETAIL_TYPE}
    assert [(e["version"], e["kind"]) for e in ours] == [(1, "created"), (2, "updated"), (3, "deleted")]
    assert ours[1]["state"] == {"on": True}
