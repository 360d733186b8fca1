"""The desire lifecycle (desires.py): a device acknowledges a desire (applied, in
progress, refused, failed), a desire expires, and a desire marked clear on confirm leaves
desired with the report that confirms it. On moto and DynamoDB Local."""

from __future__ import annotations

import pytest

from functions.device_state import (Ack, DesireMoved, DesireOptions, DeviceStateManager, InvalidValue, JsonPatch,
                                    MergePatch)
from functions.device_state.feed.items import acks_between


def desired_meta(device, now=None) -> dict:
    return device.as_dict(include_metadata=True, now=now)["metadata"]["desired"]


def test_a_refusal_takes_the_leaf_out_of_the_delta_until_desired_sets_it_again(manager):
    manager.create("lamp", {}, sections={"reported": {"power": "off", "brightness": 10}})
    wanted = manager.update_with_retry("lamp", MergePatch({"power": "on", "brightness": 150}), section="desired")
    assert wanted.delta() == {"power": "on", "brightness": 150}
    acked = manager.acknowledge("lamp", [Ack("/brightness", wanted.version, 400, "out of range 0-100"),
                                         Ack("/power", wanted.version, 202)])
    assert acked.version == wanted.version + 1 and acked.desired == wanted.desired
    assert acked.delta() == {"power": "on"}  # in progress stays; refused leaves
    shown = desired_meta(manager.get("lamp"))
    assert shown["brightness"]["ack"] == {"code": 400, "version": wanted.version, "reason": "out of range 0-100",
                                          "at": shown["brightness"]["ack"]["at"]}
    assert shown["power"]["ack"]["code"] == 202 and "reason" not in shown["power"]["ack"]
    again = manager.update_with_retry("lamp", MergePatch({"brightness": 90}), section="desired")
    assert again.delta() == {"power": "on", "brightness": 90}
    assert "ack" not in desired_meta(manager.get("lamp"))["brightness"]
    assert desired_meta(manager.get("lamp"))["power"]["ack"]["code"] == 202


def test_an_ack_of_a_desire_that_moved_on_writes_nothing(manager):
    manager.create("lamp", {})
    first = manager.update_with_retry("lamp", MergePatch({"brightness": 150}), section="desired")
    second = manager.update_with_retry("lamp", MergePatch({"brightness": 90}), section="desired")
    for ack, current in ((Ack("/brightness", first.version, 400), second.version),
                         (Ack("/brightness", second.version + 5, 400), second.version),
                         (Ack("/power", second.version, 400), None)):
        with pytest.raises(DesireMoved) as refused:
            manager.acknowledge("lamp", [Ack("/brightness", second.version, 200), ack]
                                if ack.path != "/brightness" else [ack])
        assert refused.value.current_version == current
    assert manager.get("lamp").version == second.version
    assert "ack" not in desired_meta(manager.get("lamp"))["brightness"]


def test_a_desire_expires_without_a_write_unless_confirmed(timed):
    manager, clock, spy = timed
    manager.create("heater", {}, sections={"reported": {"heating": "off", "target": 18}})
    wanted = manager.update_with_retry("heater", MergePatch({"heating": "on", "target": 21}), section="desired",
                                       desire=DesireOptions(expires_in=60))
    manager.update_with_retry("heater", MergePatch({"target": 21}), section="reported")
    device = manager.get("heater")
    assert device.delta(clock.now + 59) == {"heating": "on"}
    assert device.delta(clock.now + 60) == {}
    shown = desired_meta(device, clock.now + 61)
    assert shown["heating"]["expired"] is True and shown["heating"]["expiresAt"]
    assert "expired" not in shown["target"] and shown["target"]["confirmedVersion"] == wanted.version + 1
    spy.calls.clear()
    clock.now += 3600
    assert manager.get("heater").delta(clock.now) == {} and spy.calls == ["get_item"]
    # a desire set again without an expiry is asked for again
    manager.update_with_retry("heater", MergePatch({"heating": "on"}), section="desired")
    assert manager.get("heater").delta() == {"heating": "on"}



def test_an_expired_desire_is_never_asked_for_again_and_a_report_equal_to_it_shows_as_its_confirmation(timed):
    """Expiry and confirmation are judged when read, against what reported holds then
    (docs/api/sections.md): past the deadline a leaf is out of the delta whatever comes, and
    reported equal to it, early or late, is its confirmation."""
    manager, clock, _ = timed
    manager.create("fan", {}, sections={"reported": {"speed": 1, "mode": "eco"}})
    wanted = manager.update_with_retry("fan", MergePatch({"speed": 3, "mode": "boost"}), section="desired",
                                       desire=DesireOptions(expires_in=60))
    in_time = manager.update_with_retry("fan", MergePatch({"speed": 3}), section="reported")
    clock.now += 61
    drifted = manager.update_with_retry("fan", MergePatch({"speed": 2}), section="reported")
    assert drifted.delta(clock.now) == {}  # drifted after the deadline: not asked again
    shown = desired_meta(manager.get("fan"), clock.now)
    assert shown["speed"]["expired"] is True and "confirmedVersion" not in shown["speed"]
    assert shown["mode"]["expired"] is True
    late = manager.update_with_retry("fan", MergePatch({"mode": "boost"}), section="reported")
    shown = desired_meta(manager.get("fan"), clock.now)
    assert shown["mode"]["confirmedVersion"] == late.version and "expired" not in shown["mode"]
    assert (wanted.version, in_time.version) == (2, 3)

def test_a_desire_reported_already_holds_is_not_shown_expired_past_its_deadline(timed):
    """Past its deadline a leaf was shown expired though reported held its value all along
    (equal, not confirmed: the report came first), telling an app the desire ran out unmet
    when nothing was left to do (a hostile review); expired says so only where reported differs."""
    manager, clock, _ = timed
    manager.create("fan", {}, sections={"reported": {"mode": "eco", "speed": 1}})
    manager.update_with_retry("fan", MergePatch({"mode": "eco", "speed": 3}), section="desired",
                              desire=DesireOptions(expires_in=60))
    shown = desired_meta(manager.get("fan"), clock.now + 61)
    assert "expired" not in shown["mode"] and "confirmedVersion" not in shown["mode"] and shown["mode"]["expiresAt"]
    assert shown["speed"]["expired"] is True


def test_expiry_takes_whole_numbers_of_seconds_up_to_30_days():
    for bad in (0, 30 * 24 * 3600 + 1, 1.5, True, "60"):
        with pytest.raises(InvalidValue):
            DesireOptions(expires_in=bad)
    assert DesireOptions(expires_in=30 * 24 * 3600).expires_in == 2_592_000


def test_clear_on_confirm_removes_the_leaf_in_the_confirming_report(timed):
    manager, clock, spy = timed
    manager.create("lamp", {}, sections={"reported": {"power": "off"}, "desired": {"mode": "eco"}})
    wanted = manager.update_with_retry("lamp", MergePatch({"power": "on", "light": {"level": 80}}),
                                       section="desired", desire=DesireOptions(clear_on_confirm=True))
    # a report that confirms only part of it clears that part
    partial = manager.update_with_retry("lamp", MergePatch({"power": "on"}), section="reported")
    assert partial.desired == {"mode": "eco", "light": {"level": 80}}
    confirmed = manager.update_with_retry("lamp", MergePatch({"light": {"level": 80}}), section="reported")
    assert confirmed.desired == {"mode": "eco"} and confirmed.delta() == {"mode": "eco"}
    device = manager.get("lamp")
    assert device.desired == {"mode": "eco"}
    shown = desired_meta(device)
    assert shown["power"] == {"version": wanted.version, "confirmedVersion": partial.version, "cleared": True}
    assert shown["light"]["level"] == {"version": wanted.version, "confirmedVersion": confirmed.version,
                                       "cleared": True}
    # nothing left to clear: reports go read-free again
    spy.calls.clear()
    manager.update_with_retry("lamp", MergePatch({"power": "off"}), section="reported")
    assert spy.calls == ["update_item"]
    assert manager.get("lamp").desired == {"mode": "eco"}


def test_a_report_equal_by_coincidence_does_not_clear(manager):
    manager.create("lamp", {}, sections={"reported": {"power": "on"}})
    manager.update_with_retry("lamp", MergePatch({"power": "on"}), section="desired",
                              desire=DesireOptions(clear_on_confirm=True))
    untouched = manager.update_with_retry("lamp", MergePatch({"uptime": 5}), section="reported")
    assert untouched.desired == {"power": "on"}
    cleared = manager.update_with_retry("lamp", JsonPatch([{"op": "replace", "path": "/power", "value": "on"}]),
                                        section="reported")
    assert cleared.desired == {}


def test_a_desire_set_again_without_the_option_is_not_cleared(manager):
    manager.create("lamp", {})
    manager.update_with_retry("lamp", MergePatch({"power": "on"}), section="desired",
                              desire=DesireOptions(clear_on_confirm=True))
    manager.update_with_retry("lamp", MergePatch({"power": "on"}), section="desired")  # compiled, no option
    reported = manager.update_with_retry("lamp", MergePatch({"power": "on"}), section="reported")
    assert reported.desired == {"power": "on"}
    assert "cleared" not in desired_meta(manager.get("lamp"))["power"]



@pytest.mark.parametrize("again", [MergePatch({"speed": 5}), JsonPatch([{"op": "add", "path": "/speed", "value": 5}]),
                                   JsonPatch([{"op": "add", "path": "/speed", "value": {"level": 5}}])],
                         ids=["merge", "json-patch", "an-object"])
def test_a_desire_set_again_after_its_cleared_confirmation_and_withdrawn_is_not_shown_confirmed(timed, again):
    """The confirmation kept of a cleared desire lasts until desired sets the leaf again: a
    read-free write setting it (then one removing it) leaves no confirmation that answers the
    new, withdrawn desire as confirmed."""
    manager, _, spy = timed
    manager.create("fan", {})
    wanted = manager.update_with_retry("fan", MergePatch({"speed": 2}), section="desired",
                                       desire=DesireOptions(clear_on_confirm=True))
    confirmed = manager.update_with_retry("fan", MergePatch({"speed": 2}), section="reported")
    assert desired_meta(manager.get("fan"))["speed"] == {"version": wanted.version,
                                                         "confirmedVersion": confirmed.version, "cleared": True}
    set_again = manager.update_with_retry("fan", again, section="desired")
    assert "cleared" not in desired_meta(manager.get("fan"))["speed"]
    spy.calls.clear()
    withdrawn = manager.update_with_retry("fan", MergePatch({"speed": None}), section="desired")
    # removing a member that holds an object is refused read-free first (compiled writes remove leaves only)
    read_free = not isinstance(set_again.desired["speed"], dict)
    assert spy.calls == (["update_item"] if read_free else ["update_item", "update_item"])
    assert withdrawn.desired == {} and "speed" not in desired_meta(manager.get("fan"))


@pytest.mark.parametrize("above", [MergePatch({"fan": 5}), JsonPatch([{"op": "add", "path": "/fan", "value": 5}]),
                                   JsonPatch([{"op": "add", "path": "/fan", "value": {"mode": "eco"}}])],
                         ids=["merge", "json-patch", "an-object"])
def test_a_desire_set_above_a_cleared_confirmation_and_withdrawn_does_not_bring_it_back(timed, above):
    """The confirmation of /fan/speed is superseded by a desire that /fan be a scalar, not by
    an object without speed (a sibling's desire): read-free, a write setting /fan cannot list
    the confirmations below it, so ``clearedNested`` is set and the write reads first."""
    manager, _, spy = timed
    manager.create("hall", {})
    manager.update_with_retry("hall", MergePatch({"fan": {"speed": 2}}), section="desired",
                              desire=DesireOptions(clear_on_confirm=True))
    confirmed = manager.update_with_retry("hall", MergePatch({"fan": {"speed": 2}}), section="reported")
    assert confirmed.desired == {} and desired_meta(manager.get("hall"))["fan"]["speed"]["cleared"] is True
    spy.calls.clear()
    manager.update_with_retry("hall", above, section="desired")
    assert spy.calls == ["update_item", "update_item"]  # refused read-free, then read-modify-write
    withdrawn = manager.update_with_retry("hall", MergePatch({"fan": None}), section="desired")
    kept = desired_meta(manager.get("hall"))
    assert withdrawn.desired == {} and kept == ({} if not isinstance(above_value(above), dict) else
                                                {"fan": {"speed": {"version": 2, "confirmedVersion": 3,
                                                                   "cleared": True}}})


def above_value(patch):
    return patch.patch["fan"] if isinstance(patch, MergePatch) else patch.operations[0]["value"]

def test_options_are_for_desired_writes_only(manager):
    manager.create("lamp", {})
    with pytest.raises(ValueError):
        manager.update_with_retry("lamp", MergePatch({"a": 1}), section="reported",
                                  desire=DesireOptions(expires_in=5))
    assert manager.get("lamp").version == 1


def test_ack_changes_carry_the_acks_and_a_delete_forgets_statuses(manager):
    manager.create("lamp", {})
    wanted = manager.update_with_retry("lamp", MergePatch({"brightness": 150}), section="desired",
                                       desire=DesireOptions(expires_in=60))
    before = manager.live_state("lamp")
    manager.acknowledge("lamp", [Ack("/brightness", wanted.version, 400, "too bright")])
    after = manager.live_state("lamp")
    (ack,) = acks_between(before, after)
    assert (ack["path"], ack["version"], ack["code"], ack["reason"]) == ("/brightness", wanted.version, 400,
                                                                         "too bright")
    assert acks_between(after, after) == ()
    manager.delete("lamp")
    recreated = manager.create("lamp", {}, sections={"desired": {"brightness": 150}})
    assert recreated.delta() == {"brightness": 150} and "statusDesired" not in manager.live_state("lamp")


def test_a_null_desire_is_confirmed_by_a_reported_null_which_only_a_json_patch_writes(manager):
    """docs/api/sections.md: a merge patch's null removes, so it cannot report a null."""
    manager.create("fan", {}, sections={"reported": {"timer": 30}})
    wanted = manager.update_with_retry("fan", JsonPatch([{"op": "add", "path": "/timer", "value": None}]),
                                       section="desired")
    assert wanted.delta() == {"timer": None}
    removed = manager.update_with_retry("fan", MergePatch({"timer": None}), section="reported")
    assert removed.reported == {} and removed.delta() == {"timer": None}
    nulled = manager.update_with_retry("fan", JsonPatch([{"op": "add", "path": "/timer", "value": None}]),
                                       section="reported")
    assert nulled.reported == {"timer": None} and nulled.delta() == {}


def test_a_write_that_reads_marks_the_nested_confirmations_of_an_item_kept_from_before(engine):
    """An item whose nested confirmation was kept before ``clearedNested`` existed gets it from
    its next write that reads, after which a read-free write above it reads first."""
    from functions.device_state.item import schema

    client, name = engine
    manager = DeviceStateManager(client, name)
    manager.create("hall", {})
    manager.update_with_retry("hall", MergePatch({"fan": {"speed": 2}}), section="desired",
                              desire=DesireOptions(clear_on_confirm=True))
    manager.update_with_retry("hall", MergePatch({"fan": {"speed": 2}}), section="reported")
    key = {"deviceId": {"S": "hall"}, "sk": {"S": "state"}}
    client.update_item(TableName=name, Key=key, UpdateExpression="REMOVE #a", ExpressionAttributeNames={
        "#a": schema.CLEARED_NESTED})  # as kept before
    manager.update_with_retry("hall", JsonPatch([{"op": "add", "path": "/x", "value": 1},
                                                 {"op": "test", "path": "/x", "value": 1}]))  # reads; no status moves
    item = client.get_item(TableName=name, Key=key)["Item"]
    assert item[schema.CLEARED_NESTED] == {"BOOL": True}
    manager.update_with_retry("hall", MergePatch({"fan": 5}), section="desired")
    manager.update_with_retry("hall", MergePatch({"fan": None}), section="desired")
    assert "fan" not in desired_meta(manager.get("hall"))
