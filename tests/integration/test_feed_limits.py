"""The change feed under hostile input, on DynamoDB Local's real stream: every version a
device reaches gets its change (empty maps included), a change that cannot be stored is
marked lost so followers learn at once (410), and one device's failing record holds no
other device's feed beyond one retry."""

from __future__ import annotations

import functools
import time

import boto3
import pytest

from functions.api.common import fits_in_an_answer
from functions.changes.events import LogPublisher
from functions.changes import handler
from functions.changes.handler import MAX_RETRY_ATTEMPTS, process
from functions.device_state import metrics as names
from functions.device_state import DeviceStateManager, MergePatch
from functions.device_state.feed.items import change_of
from functions.device_state.feed.log import GIVEN_UP_SECONDS, ChangeLog, ChangesExpired, VersionNotFound
from functions.device_state.model.sections import pack
from functions.device_state.model.times import timestamp
from localdev.stream import StreamPoller, typed

pytestmark = [pytest.mark.dynamodb_local, pytest.mark.table_stream]  # tables made with their stream


def streams_client(endpoint):
    return boto3.client("dynamodbstreams", endpoint_url=endpoint, region_name="us-east-1")


class PoisonLog(ChangeLog):
    """Fails every try of writing one device's changes (a bug, or a fault that does not pass)."""

    def __init__(self, *args, poisoned: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.poisoned, self.failures = poisoned, 0

    def record(self, old_image, new_image, **options):
        change = change_of(old_image, new_image)
        if change is not None and change.device_id == self.poisoned:
            self.failures += 1
            raise RuntimeError("injected processor failure")
        return super().record(old_image, new_image, **options)


def poller(dynamodb_local, local_table, log: ChangeLog, **options) -> StreamPoller:
    client, name = local_table
    return StreamPoller(streams_client(dynamodb_local.endpoint), client, name,
                        functools.partial(process, log=log, events=LogPublisher()), **options).start()


def wait_for(log: ChangeLog, device_id: str, version: int, timeout: float = 20.0) -> float:
    """Seconds until the feed holds ``version`` of the device."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        changes = log.read(device_id, version - 1, 1) if version > 1 else log.read(device_id, 0, 1)
        if changes and changes[-1].version >= version:
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"the feed of {device_id} never reached version {version}")


def test_empty_objects_reach_the_feed_and_history(dynamodb_local, local_table):
    client, name = local_table
    manager, log = DeviceStateManager(client, name), ChangeLog(client, name)
    manager.put("empty", {})
    manager.put("cfg", {"cfg": {}, "list": [{}], "deep": {"a": {"b": {}}}})
    manager.update("cfg", MergePatch({"cfg": {"on": True}}), 1)
    running = poller(dynamodb_local, local_table, log)
    try:
        wait_for(log, "empty", 1)
        wait_for(log, "cfg", 2)
    finally:
        running.stop()
    assert running.discarded == []
    assert log.at_version("empty", 1).state == {}
    assert log.at_version("cfg", 1).state == {"cfg": {}, "list": [{}], "deep": {"a": {"b": {}}}}
    assert [change.patch for change in log.read("cfg", 1)] == [[{"op": "add", "path": "/state/cfg/on", "value": True}]]


def test_dynamodb_locals_untyped_empty_map_is_read_as_a_map():
    assert typed({}) == {"M": {}}
    assert typed({"M": {"a": {}, "l": {"L": [{}, {"S": "x"}]}}}) == {
        "M": {"a": {"M": {}}, "l": {"L": [{"M": {}}, {"S": "x"}]}}}


def test_one_devices_failing_record_does_not_hold_other_devices_feeds(dynamodb_local, local_table):
    client, name = local_table
    manager = DeviceStateManager(client, name)
    log = PoisonLog(client, name, poisoned="poison")
    running = poller(dynamodb_local, local_table, log, max_retry_attempts=10)
    try:
        manager.create("poison", {"n": 0})
        time.sleep(0.3)  # its record is failing now, and being retried
        manager.create("healthy", {"n": 0})
        delay = wait_for(log, "healthy", 1)
        manager.update("healthy", MergePatch({"n": 1}), 1)
        later_delay = wait_for(log, "healthy", 2)
        assert log.failures >= 1 and not running.discarded  # the poison record is still being retried
    finally:
        running.stop()
    # One backoff at most (2 s) and the batch window, never the poison record's whole retry cycle (~13 s).
    assert delay < 3 and later_delay < 3, (delay, later_delay)


def test_a_given_up_record_makes_the_feed_answer_410_at_once(dynamodb_local, local_table):
    client, name = local_table
    manager, log = DeviceStateManager(client, name), ChangeLog(client, name)
    manager.create("poison", {"n": 0})
    manager.update("poison", MergePatch({"n": 1}), 1)
    failing = PoisonLog(client, name, poisoned="poison")
    running = poller(dynamodb_local, local_table, failing, max_retry_attempts=1,
                     on_give_up=lambda record: log.record_lost(record["dynamodb"].get("NewImage")))
    try:
        deadline = time.monotonic() + 20
        while len(running.discarded) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        running.stop()
    assert len(running.discarded) == 2
    with pytest.raises(ChangesExpired) as gone:  # not an empty page: the follower learns now
        log.read("poison", 1)
    assert gone.value.current_version == 2
    with pytest.raises(ChangesExpired):
        log.read("poison", 0)
    assert log.at_version("poison", 2).state == {"n": 1}  # the current version is the state item's
    with pytest.raises(VersionNotFound):
        log.at_version("poison", 1)


def stream_record(device_id: str, version: int, old_state: dict | None, new_state: dict, sequence: int) -> dict:
    """A stream record as Lambda hands it over (low-level images)."""
    stamp = {"S": timestamp(time.time())}  # within the retention: a fixed date expires

    def image(state, at):
        return {"deviceId": {"S": device_id}, "sk": {"S": "state"}, "version": {"N": str(at)},
                "state": {"M": {key: {"S": value} for key, value in state.items()}},
                "createdAt": stamp, "updatedAt": stamp, "lastWrite": {"S": "updated"}}

    dynamodb = {"Keys": {"deviceId": {"S": device_id}, "sk": {"S": "state"}}, "SequenceNumber": str(sequence),
                "NewImage": image(new_state, version)}
    if old_state is not None:
        dynamodb["OldImage"] = image(old_state, version - 1)
    return {"eventID": str(sequence), "eventName": "MODIFY" if old_state is not None else "INSERT",
            "eventSource": "aws:dynamodb", "eventSourceARN": "arn", "dynamodb": dynamodb}


def test_a_change_too_large_to_hold_its_state_keeps_its_patch_and_history_rebuilds_it(local_table, monkeypatch):
    """Records a state write can no longer produce (its limit keeps the change record in
    size), as an older item or a bug could: the version is never dropped. The one marked lost is
    counted as lost, not recorded (ChangesLost: nothing else tells an operator)."""
    client, name = local_table
    counted = []
    monkeypatch.setattr(handler.metrics, "add_metric", lambda **metric: counted.append(metric["name"]))
    log = ChangeLog(client, name)
    base = {"blob": "b" * 300_000}
    grown = {**base, "extra": "e" * 105_000}  # 405 KB: no change record can hold this state
    records = [stream_record("huge", 1, None, base, 100), stream_record("huge", 2, base, grown, 101),
               stream_record("huge", 3, grown, {**grown, "n": "1"}, 102)]
    records.append(stream_record("lost", 1, None, {"a": "x" * 420_000}, 103))
    assert process({"Records": records}, None, log, LogPublisher()) == {"batchItemFailures": []}
    assert [change.version for change in log.read("huge", 0)] == [1, 2, 3]
    assert log.at_version("huge", 3).state == {**grown, "n": "1"}
    assert log.at_version("huge", 2).state == grown
    with pytest.raises(ChangesExpired):  # neither state nor patch fits: marked lost, 410 at once
        log.read("lost", 0)
    assert counted.count(names.CHANGES_LOST) == 1 and counted.count(names.CHANGES_RECORDED) == 3


def pages(log: ChangeLog, device_id: str) -> list[list]:
    """The device's feed from version 0, page after page (each of the default limit, 100)."""
    walked, since = [], 0
    while page := log.read(device_id, since):
        assert page[0].version == since + 1 and len(walked) < 100  # each page moves on
        walked.append(page)
        since = page[-1].version
    return walked


def test_a_page_of_large_changes_holds_at_most_400_kb_of_them_and_fits_in_lambdas_answer(local_table):
    """Nine changes of 130,000 control characters each: 130 KB as DynamoDB stores them, 780 KB
    escaped in JSON. A page of the default 100 held all nine, 7 MB, past what a Lambda may answer
    (the feed answered 500 on every default read); a page holds what fits in 400 KB as stored."""
    client, name = local_table
    log = ChangeLog(client, name)
    states = [{"s": chr(1) * 130_000 + str(version)} for version in range(1, 10)]
    records = [stream_record("noisy", version, states[version - 2] if version > 1 else None, states[version - 1],
                             200 + version) for version in range(1, 10)]
    assert process({"Records": records}, None, log, LogPublisher()) == {"batchItemFailures": []}
    walked = pages(log, "noisy")
    assert [change.version for page in walked for change in page] == list(range(1, 10))  # each once, in order
    assert len(walked) > 1
    for page in walked:
        assert fits_in_an_answer({"changes": [change.as_dict() for change in page], "nextSince": page[-1].version})
    every = [change for page in walked for change in page]
    assert not fits_in_an_answer({"changes": [change.as_dict() for change in every], "nextSince": 9})  # one page


def test_a_version_whose_change_never_came_is_410_once_the_processor_would_have_given_up(local_table):
    """On AWS a record given up after its tries goes to the on-failure queue and writes no
    marker: the feed still answers 410 (not an empty page forever) once that is certain."""
    client, name = local_table
    DeviceStateManager(client, name).create("silent", {"n": 0})  # no processor: its change never comes
    assert ChangeLog(client, name).read("silent", 0) == []  # still on its way, as far as anyone can tell
    later = ChangeLog(client, name, clock=lambda: time.time() + GIVEN_UP_SECONDS + 1)
    with pytest.raises(ChangesExpired) as gone:
        later.read("silent", 0)
    assert gone.value.current_version == 1
    assert later.read("silent", 1) == []  # caught up is not expired


def test_a_section_change_too_large_to_hold_its_sections_keeps_its_patch_and_metadata(local_table):
    """The same for desired: history rebuilds every section from the version before and the
    whole-document patch, and the version's metadata is kept beside its patch."""
    client, name = local_table
    log = ChangeLog(client, name)
    stamp = {"S": timestamp(time.time())}  # within the retention: a fixed date expires

    def image(desired: dict, at: int) -> dict:
        entries = {f"/{key}": {"N": str(pack(at, 1_800_000_000))} for key in desired}
        return {"deviceId": {"S": "wish"}, "sk": {"S": "state"}, "version": {"N": str(at)},
                "state": {"M": {"room": {"S": "hall"}}}, "reported": {"M": {}}, "metaReported": {"M": {}},
                "desired": {"M": {key: {"S": value} for key, value in desired.items()}},
                "metaDesired": {"M": entries}, "changedDesired": {"N": str(at)},
                "createdAt": stamp, "updatedAt": stamp, "lastWrite": {"S": "updated"}}

    def record(old: dict | None, new: dict, at: int) -> dict:
        dynamodb = {"Keys": {"deviceId": {"S": "wish"}, "sk": {"S": "state"}}, "SequenceNumber": str(200 + at),
                    "NewImage": image(new, at)}
        if old is not None:
            dynamodb["OldImage"] = image(old, at - 1)
        return {"eventID": str(200 + at), "eventName": "MODIFY" if old is not None else "INSERT",
                "eventSource": "aws:dynamodb", "eventSourceARN": "arn", "dynamodb": dynamodb}

    base = {"blob": "b" * 300_000}
    grown = {**base, "extra": "e" * 110_000}  # no change record can hold this desired
    last = {**grown, "n": "1"}
    records = [record(None, base, 1), record(base, grown, 2), record(grown, last, 3)]
    assert process({"Records": records}, None, log, LogPublisher()) == {"batchItemFailures": []}
    changes = [change for page in pages(log, "wish") for change in page]  # 410 KB: two pages
    assert [change.version for change in changes] == [1, 2, 3]
    assert changes[1].sections == ("desired",) and changes[1].state is None  # stored without its sections
    at_three, at_two = log.at_version("wish", 3), log.at_version("wish", 2)
    assert (at_three.desired, at_three.state, at_three.reported) == (last, {"room": "hall"}, {})
    assert (at_two.desired, at_two.state) == (grown, {"room": "hall"})
    assert set(at_two.entries["desired"]) == {"/blob", "/extra"}  # the version's metadata, kept with its patch


def test_the_processor_marks_a_version_lost_on_its_last_try_so_lambda_never_gives_it_up_silently(local_table,
                                                                                                   monkeypatch):
    """Lambda sends a record it gives up to the on-failure queue and leaves no marker; the
    processor counts its own tries and, on the last one, marks the version lost itself, so
    followers get 410 at once on AWS too. Before the last try the record is retried."""
    client, name = local_table
    log = ChangeLog(client, name)
    records = [stream_record("hard", 1, None, {"a": "1"}, 200), stream_record("hard", 2, {"a": "1"}, {"a": "2"}, 201)]
    assert process({"Records": records[:1]}, None, log, LogPublisher()) == {"batchItemFailures": []}
    failing = PoisonLog(client, name, poisoned="hard")
    for _ in range(MAX_RETRY_ATTEMPTS - 1):  # Lambda's first try and its retries but the last
        assert process({"Records": records[1:]}, None, failing, LogPublisher()) == {
            "batchItemFailures": [{"itemIdentifier": "201"}]}
        assert log.read("hard", 1) == []  # retried, nothing marked yet
    counted = []
    monkeypatch.setattr(handler.metrics, "add_metric", lambda **metric: counted.append(metric["name"]))
    assert process({"Records": records[1:]}, None, failing, LogPublisher()) == {"batchItemFailures": []}
    with pytest.raises(ChangesExpired) as gone:
        log.read("hard", 1)
    assert gone.value.current_version == 2
    # the invocation succeeds and nothing reaches the on-failure queue: the metric is its only trace
    assert counted == [names.CHANGES_LOST]
