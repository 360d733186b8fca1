"""The fan-out leaves a subscriber alone through changes of sections it does not follow: a
device following its own ``desired`` pays no read and no write of its subscription for each of
its own reports, hears every desired change in order all the same, and is moved on at least
every ``CATCH_UP_VERSIONS`` versions, so its catch-up read stays short and inside the feed's
retention; catching up through changes it does not follow writes its subscription once a page. The control (every change fanned out to every subscriber, sections unknown) writes
the subscription at every report."""

from __future__ import annotations

import pytest

from functions.device_state import ChangeLog, MergePatch
from functions.push.delivery import CATCH_UP_VERSIONS, Delivery, PostFailed
from functions.push.fanout import changed_since
from functions.push.subscriptions import Subscriptions


class WriteCounter:
    """The client, counting the write requests sent through it."""

    def __init__(self, client):
        self._client, self.writes = client, 0

    def __getattr__(self, name):
        attribute = getattr(self._client, name)
        if name in ("put_item", "update_item", "delete_item", "transact_write_items"):
            def counted(**request):
                self.writes += 1
                return attribute(**request)
            return counted
        return attribute


class Rig:
    def __init__(self, manager, engine):
        client, name = engine
        self.manager, self.client, self.name = manager, client, name
        self.log = ChangeLog(client, name)
        self.counting = WriteCounter(client)
        self.subscriptions = Subscriptions(self.counting, name)
        self.messages: dict[str, list[tuple[int, list]]] = {}
        self.failing: set[int] = set()  # versions whose next post fails (a throttled connection)
        self.delivery = Delivery(self.subscriptions, ChangeLog(self.counting, name), self.post)

    def post(self, connection_id: str, message: dict) -> None:
        if message.get("version") in self.failing:
            self.failing.discard(message["version"])
            raise RuntimeError("the connection is throttled")
        if message.get("type") == "change":
            self.messages.setdefault(connection_id, []).append((message["version"], message["sections"]))

    def follow(self, connection_id: str, sections: tuple) -> None:
        self.subscriptions.open(connection_id, "test")
        self.subscriptions.subscribe(connection_id, "t", self.manager.get("t").version, sections)

    def write(self, section: str, patch: dict, marks_known: bool = True, fail: bool = False) -> int:
        """One write, its change recorded as the stream processor would, and its fan-out."""
        item = lambda: self.client.get_item(TableName=self.name, Key={"deviceId": {"S": "t"}, "sk": {"S": "state"}},  # noqa: E731
                                            ConsistentRead=True)["Item"]
        old = item()
        device = self.manager.update_with_retry("t", MergePatch(patch), section=section)
        if fail:
            self.failing.add(device.version)
        change = self.log.record(old, item())
        try:
            self.delivery.fan_out("t", change.version, changed_since(change) if marks_known else None)
        except PostFailed:  # the mapping's retries and the on-failure queue: the subscriber catches up later
            assert fail
        return change.version

    def delivered(self, connection_id: str) -> int:
        return next(s.delivered for s in self.subscriptions.of_device("t") if s.connection_id == connection_id)


@pytest.fixture
def rig(manager, engine):
    manager.create("t", {"name": "thermostat"}, sections={"desired": {"setpoint": 20}, "reported": {"setpoint": 20}})
    return Rig(manager, engine)


def test_a_device_following_its_desired_pays_nothing_for_its_reports_and_hears_every_desire(rig):
    rig.follow("device", ("desired",))
    rig.follow("dashboard", ("reported",))
    start = rig.delivered("device")
    writes = rig.counting.writes
    reports = [rig.write("reported", {"temperature": n}) for n in range(5)]
    assert rig.counting.writes - writes == 5  # the dashboard's subscription only, once a report
    assert rig.delivered("device") == start  # left where it was: nothing read or written for it
    assert [version for version, _ in rig.messages["dashboard"]] == reports
    writes = rig.counting.writes
    desire = rig.write("desired", {"setpoint": 22})
    assert rig.messages["device"] == [(desire, ["desired"])]  # the desire, and none of the reports
    assert rig.counting.writes - writes == 1  # its subscription moved past the reports in one write
    assert rig.delivered("device") == desire


def test_a_subscriber_is_moved_on_through_changes_it_does_not_follow_every_so_often(rig):
    rig.follow("device", ("desired",))
    start = rig.delivered("device")
    versions = [rig.write("reported", {"temperature": n}) for n in range(CATCH_UP_VERSIONS)]
    assert rig.delivered("device") == versions[-1] >= start + CATCH_UP_VERSIONS  # moved on, nothing sent
    assert "device" not in rig.messages


def test_a_desire_whose_post_failed_is_sent_with_the_next_report_not_held_back(rig):
    rig.follow("device", ("desired",))
    desire = rig.write("desired", {"setpoint": 23}, fail=True)  # its post fails, retries given up
    assert "device" not in rig.messages and rig.delivered("device") < desire
    rig.write("reported", {"temperature": 1})  # a change it does not follow, yet the desire is still owed
    assert rig.messages["device"] == [(desire, ["desired"])]


def test_control_fanning_every_change_out_to_everyone_writes_the_subscription_at_every_report(rig):
    rig.follow("device", ("desired",))
    writes = rig.counting.writes
    for n in range(5):
        rig.write("reported", {"temperature": n}, marks_known=False)
    assert rig.counting.writes - writes == 5  # one write of the device's subscription a report
    assert "device" not in rig.messages
