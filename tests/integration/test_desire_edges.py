"""Desire statuses (desires.py) count for their own desire only: not for a later one set by
a writer whose clock is behind, and a clear-on-confirm mark a read-free desired write made
stale costs one refused write once."""

from __future__ import annotations

from functions.device_state import Ack, DesireMoved, DesireOptions, DeviceStateManager, JsonPatch, MergePatch
from tests.helpers import Clock, RecordingClient


def test_a_read_free_desired_write_over_a_desire_to_clear_costs_one_refused_write_once(local_table):
    """A desire marked clearOnConfirm is replaced by a compiled (read-free) desired write:
    its status no longer counts, but `clearPending` stays on the item until the next report,
    which is refused in its read-free form and, on the item the refusal returned, drops the
    mark in its write."""
    client, name = local_table
    spy = RecordingClient(client)
    manager = DeviceStateManager(spy, name)
    manager.create("lamp", {})
    manager.update_with_retry("lamp", MergePatch({"target": 21}), section="desired",
                              desire=DesireOptions(clear_on_confirm=True))
    manager.update_with_retry("lamp", MergePatch({"target": 22}), section="desired")  # compiled, no options
    spy.calls.clear()
    manager.update_with_retry("lamp", MergePatch({"target": 22}), section="reported")
    manager.update_with_retry("lamp", MergePatch({"other": 1}), section="reported")
    calls = list(spy.calls)
    # the first report pays once (its read-free form refused, then a write that drops the mark,
    # planned on the item the refusal returned: no read); the next is read-free again
    assert calls == ["update_item", "update_item", "update_item"]
    assert "clearPending" not in manager.live_state("lamp")


def test_a_refusal_never_counts_for_a_later_desire_whatever_the_clocks_said(local_table):
    """Metadata picks the newest entry by time (ms * SPAN + version). Two containers whose
    clocks differ by a few seconds: A (ahead) sets /a/b read-modify-write and the device
    refuses it; B (behind) replaces /a whole (read-modify-write: a read-free write does not
    replace an object whose leaves hold entries). The leaf /a/b is the new desire; were its
    version resolved by time, the old refusal would count: the new desire hidden from the
    delta, and the device unable to ack it (409 desire-moved)."""
    client, name = local_table
    ahead, behind = Clock(1_800_000_005.0), Clock(1_800_000_000.0)
    a, b = DeviceStateManager(client, name, clock=ahead), DeviceStateManager(client, name, clock=behind)
    a.create("lamp", {})
    first = a.update_with_retry("lamp", MergePatch({"a": {"b": 150}}), section="desired",
                                desire=DesireOptions(expires_in=3600))  # read-modify-write
    a.acknowledge("lamp", [Ack("/a/b", first.version, 400, "out of range")])
    new = b.update_with_retry("lamp", JsonPatch([{"op": "replace", "path": "/a", "value": {"b": 90}}]),
                              section="desired")
    device = a.get("lamp")
    print("desired:", device.desired, "version", device.version, "(new desire at", new.version, ")")
    print("delta:", device.delta(ahead.now))
    print("metadata /a/b:", device.as_dict(include_metadata=True, now=ahead.now)["metadata"]["desired"]["a"]["b"])
    try:
        a.acknowledge("lamp", [Ack("/a/b", new.version, 200)])
        print("ack of the new desire: accepted")
    except DesireMoved as moved:
        print("ack of the new desire:", moved)
    assert device.delta(ahead.now) == {"a": {"b": 90}}, "the new desire is hidden by the old desire's refusal"
