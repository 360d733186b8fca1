"""What an ack write adds to its change record, push message and event stays bounded: a
change carries its acks only up to MAX_ACKS_BYTES of JSON (a control character in a name or
reason is 6 bytes there, as \\u0001, 1 on the item), else says acksOmitted."""

from __future__ import annotations

from functions.changes.events import MAX_EVENT_BYTES, detail
from functions.device_state import Ack, ChangeLog, DeviceStateManager, MergePatch, dumps
from functions.device_state.feed.items import change_sk
from functions.device_state.feed.log import ChangesExpired
from functions.push.delivery import MAX_MESSAGE_BYTES, change_message

NAME = "\x01" * 1000  # a legal member name: 1,000 bytes of UTF-8
LEAVES = 45
REASON = "\x01" * 256  # a legal reason: 256 characters


def test_an_ack_write_of_huge_acks_is_recorded_with_acks_omitted(local_table):
    client, name = local_table
    manager = DeviceStateManager(client, name)
    manager.create("lamp", {})
    document = {NAME: {NAME: {NAME: {NAME: {f"k{i:02d}": i for i in range(LEAVES)}}}}}
    wanted = manager.update_with_retry("lamp", MergePatch(document), section="desired")
    prefix = "/" + "/".join([NAME] * 4)
    before = manager.live_state("lamp")
    acked = manager.acknowledge("lamp", [Ack(f"{prefix}/k{i:02d}", wanted.version, 400, REASON)
                                         for i in range(LEAVES)])  # 200: the write fits
    after = manager.live_state("lamp")
    print("ack write accepted at version", acked.version)
    log = ChangeLog(client, name)
    change = log.record(before, after)  # what the stream processor does with the record
    acks_bytes = len(dumps(list(change.acks)).encode())
    print("acks JSON on the change item:", acks_bytes, "bytes")
    print("push message:", len(dumps(change_message(change, change.device().delta())).encode()),
          "bytes (limit", MAX_MESSAGE_BYTES, ")")
    print("event detail:", len(dumps(detail(change)).encode()), "bytes (limit", MAX_EVENT_BYTES, ")")
    stored = client.get_item(TableName=name, Key={"deviceId": {"S": "lamp"}, "sk": {"S": change_sk(acked.version)}})
    print("change item stored:", "Item" in stored)
    try:
        page = log.read("lamp", acked.version - 1)
        print("feed after the ack:", [c.version for c in page])
    except ChangesExpired as error:
        print("feed after the ack:", type(error).__name__, error)
    nxt_before = manager.live_state("lamp")
    manager.update_with_retry("lamp", MergePatch({"power": "on"}), section="reported")
    log.record(nxt_before, manager.live_state("lamp"))
    try:
        print("feed since", acked.version - 1, "after a later write is recorded:",
              [c.version for c in log.read("lamp", acked.version - 1)])
    except ChangesExpired as error:
        print("feed since", acked.version - 1, "after a later write is recorded: 410", error)
    assert "Item" in stored, "no form of the change record (not even the lost marker) was stored; record() said ok"
    assert change.acks == () and change.acks_omitted and change.as_dict()["acksOmitted"] is True
    assert len(dumps(change_message(change, change.device().delta())).encode()) <= MAX_MESSAGE_BYTES
    assert len(dumps(detail(change)).encode()) <= MAX_EVENT_BYTES
    assert [c.version for c in log.read("lamp", acked.version - 1)][:1] == [acked.version]
