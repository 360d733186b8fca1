"""The 768 bytes of bookkeeping room (journal, lease holder, trimmed stamps) also hold the
device's connections (up to MAX_CONNECTIONS members of `<until ms>:<connection id>`),
connectedSince, lastSeen and connectivity's index attribute. A device whose state is as large
as the service accepts, holding a lease and its most connections, with a busy journal, still
takes a write that fits."""

from __future__ import annotations

from functions.device_state import DeviceStateManager, ItemTooLarge, MergePatch
from functions.device_state.item.room import MAX_STATE_ITEM_BYTES
from functions.device_state.model.connectivity import MAX_CONNECTIONS


def _largest_state(manager, device_id):
    low, high = 300_000, 409_600
    while low < high:  # the longest filler the service accepts (on create)
        middle = (low + high + 1) // 2
        try:
            manager.create(f"probe-{middle}", {"f": "x" * middle, "g": 0})
            manager.delete(f"probe-{middle}")
            low = middle
        except ItemTooLarge:
            high = middle - 1
    manager.create(device_id, {"f": "x" * low, "g": 0})
    return low


def test_a_full_device_with_a_lease_and_its_most_connections_takes_a_write_that_fits(local_table):
    client, name = local_table
    manager = DeviceStateManager(client, name)
    filler = _largest_state(manager, "lamp")
    print("largest accepted filler:", filler, "(state item limit", MAX_STATE_ITEM_BYTES, ")")
    for number in range(MAX_CONNECTIONS):  # API Gateway connection ids are 16 characters, e.g. L0SM9cOFvHcCIhw=
        assert manager.connected("lamp", f"L0SM9cOFvHcC{number:03d}=", 4_000_000_000)
    with manager.lease("lamp", 60) as lease:
        holder = lease.manager
        answers = []
        for value in range(1, 17):  # a busy second: 16 journal entries kept
            try:
                holder.as_device("lamp").update("lamp", MergePatch({"g": value % 10}),
                                                holder.get("lamp").version)
                answers.append("200")
            except ItemTooLarge as error:
                answers.append(f"413 {error}")
        print("answers:", answers)
        item = manager.live_state("lamp")
        sets = {k: v for k, v in item.items() if "SS" in v or "NS" in v}
        from functions.device_state.model.values import item_size
        size = item_size({k: v for k, v in item.items() if k not in sets})
        size += sum(len(k.encode()) + sum(len(m.encode()) for m in v.get("SS", [])) +
                    sum(len(m) // 2 + 2 for m in v.get("NS", [])) for k, v in sets.items())
        print("item bytes now (about):", size, "of", 400 * 1024, "; journal entries:",
              sum(k.startswith("w:") for k in item), "; bookkeeping:",
              {k: v for k, v in item.items() if k.startswith(("lease", "journal", "connect", "last"))}.keys())
        assert all(answer == "200" for answer in answers), "a write that fits was refused"


def test_a_connect_of_a_full_device_leaves_room_for_its_next_write_of_the_same_size(connectivity_fleet):
    """Where connectivity/connected is declared, a connect SETs its index attributes (ix:…
    and ixShard) on the item outside the state's accounting and outside the bookkeeping
    attributes; the next read-modify-write counts them, so a state accepted once is refused
    (413) after the device merely connected."""
    manager = connectivity_fleet
    filler = _largest_state(manager, "lamp")
    manager.update("lamp", MergePatch({"g": 1}), manager.get("lamp").version)  # fits: 200
    manager.connected("lamp", "L0SM9cOFvHcCIhw=", 4_000_000_000)
    manager.disconnected("lamp", "L0SM9cOFvHcCIhw=", 4_000_000_000)  # gone again: connected false
    try:
        manager.update("lamp", MergePatch({"g": 2}), manager.get("lamp").version)
        answer = "200"
    except ItemTooLarge as error:
        answer = f"413 {error}"
    print("filler", filler, "; the same write after a connect and disconnect:", answer)
    assert answer == "200"


def test_settle_marks_fit_on_a_full_device_with_a_lease_and_its_most_connections(dynamodb_local, local_table):
    """The same full device, then writes whose first send never reaches DynamoDB: each is
    settled with a 'never applied' mark (a journal entry of its own), sent again, and must
    answer 200. Prints what each answered and the item's size."""
    from tests.integration.test_faults import Rig

    rig = Rig(dynamodb_local, *local_table)
    try:
        filler = _largest_state(rig.other, "lamp")
        for number in range(MAX_CONNECTIONS):
            rig.other.connected("lamp", f"L0SM9cOFvHcC{number:03d}=", 4_000_000_000)
        answers = []
        with rig.manager.lease("lamp", 60) as lease:
            holder = lease.manager.as_device("lamp")
            for value in range(1, 20):
                if value > 12:
                    rig.forwarder.lose("UpdateItem", land=False)
                try:
                    holder.update_with_retry("lamp", lambda state, v=value: {**state, "g": v % 10})
                    answers.append("200")
                except Exception as error:  # noqa: BLE001 - what the caller would hear
                    answers.append(f"{type(error).__name__}: {error}"[:160])
        item = rig.other.live_state("lamp")
        sets = {k: v for k, v in item.items() if "SS" in v or "NS" in v}
        from functions.device_state.model.values import item_size
        size = item_size({k: v for k, v in item.items() if k not in sets})
        size += sum(len(k.encode()) + sum(len(m.encode()) for m in v.get("SS", [])) +
                    sum(len(m) // 2 + 2 for m in v.get("NS", [])) for k, v in sets.items())
        print("filler", filler, "answers:", answers)
        print("item bytes (about):", size, "journal entries:", sum(k.startswith("w:") for k in item))
        assert all(answer == "200" for answer in answers)
    finally:
        rig.forwarder.close()
