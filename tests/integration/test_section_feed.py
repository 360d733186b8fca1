"""The feed over every section: 16 writers x 20 mixed section writes through the real
stream poller on DynamoDB Local rebuild state, desired and reported exactly from the
patches, each change names the sections it changed, and history shows every section and
the delta as they were."""

from __future__ import annotations

import copy

import jsonpatch
import pytest

from functions.device_state import JsonPatch, MergePatch
from functions.device_state.feed.items import change_of
from functions.device_state.model.sections import delta
from tests.helpers import run_writers
from tests.integration.test_changes import feed, follow  # noqa: F401  (the poller fixture)

pytestmark = [pytest.mark.dynamodb_local, pytest.mark.table_stream]  # the feed fixture reads the stream


def write(manager, index, step):
    kind = (index + step) % 4
    if kind == 0:
        return manager.update_with_retry("hot", MergePatch({f"r{index}": step}), section="reported", budget_seconds=60)
    if kind == 1:
        return manager.update_with_retry("hot", JsonPatch([{"op": "increment", "path": "/n", "value": 1}]),
                                         section="desired", budget_seconds=60)
    if kind == 2:
        return manager.update_with_retry("hot", MergePatch({"nested": {f"w{index}": step}}), section="reported",
                                         budget_seconds=60)
    return manager.update_with_retry("hot", MergePatch({f"s{index}": step}), budget_seconds=60)


@pytest.mark.concurrency
def test_16_writers_x_20_mixed_section_writes_rebuild_every_section(feed):  # noqa: F811
    manager, log, start = feed
    start()
    manager.create("hot", {}, sections={"desired": {"n": 0}, "reported": {"nested": {}}})
    writers, per_writer = 16, 20
    errors = run_writers(writers, per_writer, lambda index, step: write(manager, index, step))
    assert errors == []
    final = manager.get("hot")
    assert final.version == 1 + writers * per_writer
    assert final.desired["n"] == writers * per_writer // 4

    changes = follow(log, "hot", final.version)
    assert [change.version for change in changes] == list(range(1, final.version + 1))
    document = {}
    for change in changes:
        document = jsonpatch.apply_patch(document, copy.deepcopy(change.patch))
        touched = {operation["path"].split("/")[1] for operation in change.patch}
        assert touched <= set(change.sections)  # a change names every section its patch touches
    assert document == {"state": final.state, "desired": final.desired, "reported": final.reported}
    counts = {name: sum(name in change.sections for change in changes[1:]) for name in ("state", "desired",
                                                                                          "reported")}
    assert counts == {"state": 80, "desired": 80, "reported": 160}
    at = log.at_version("hot", final.version)
    assert (at.desired, at.reported, at.as_dict()["delta"]) == (final.desired, final.reported,
                                                                delta(final.desired, final.reported))


def test_history_keeps_every_section_its_metadata_and_delta(feed):  # noqa: F811
    manager, log, start = feed
    start()
    manager.create("lamp", {"room": "k"}, sections={"desired": {"power": "on"}})
    manager.update_with_retry("lamp", MergePatch({"power": "on"}), section="reported")
    manager.update_with_retry("lamp", MergePatch({"power": "off"}), section="desired")
    changes = follow(log, "lamp", 3)
    assert [change.sections for change in changes] == [("state", "desired", "reported"), ("reported",),
                                                       ("desired",)]
    assert changes[1].patch == [{"op": "add", "path": "/reported/power", "value": "on"}]
    second = log.at_version("lamp", 2).as_dict(include_metadata=True)
    assert second["delta"] == {} and second["metadata"]["desired"]["power"]["confirmedVersion"] == 2
    assert log.at_version("lamp", 3).as_dict()["delta"] == {"power": "off"}


def test_a_write_that_sets_a_section_to_what_it_was_still_names_it():
    from functions.device_state.model.values import to_attribute

    def image(version, reported, changed_reported):
        return {"deviceId": {"S": "d"}, "sk": {"S": "state"}, "version": {"N": str(version)},
                "state": to_attribute({}), "reported": to_attribute(reported), "createdAt": {"S": "t"},
                "updatedAt": {"S": "t"}, "changedReported": {"N": str(changed_reported)}}

    change = change_of(image(1, {"a": 1}, 1), image(2, {"a": 1}, 2))
    assert change.sections == ("reported",) and change.patch == []
