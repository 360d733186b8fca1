"""A write whose answer is lost, and whose first settle mark's answer is lost too (a DynamoDB
brownout: two 3 s read timeouts in a row), with one other write landing meanwhile, is settled
as applied (it did apply): the journal keeps an entry as long as a settle may still ask for it
(JOURNAL_KEEP_SECONDS covers the settle deadline after a read timeout). With entries kept 5 s
and only the newest by count, the second mark found the entry dropped and answered 504."""
from __future__ import annotations

import time

import pytest

from functions.device_state import DeviceStateManager, JsonPatch, MergePatch
from functions import config
from functions.device_state.client import READ_TIMEOUT_SECONDS, dynamodb_client
from functions.device_state.item.journal import JOURNAL_KEEP_SECONDS
from localdev.faults import Forwarder

pytestmark = pytest.mark.dynamodb_local

READ_TIMEOUT = READ_TIMEOUT_SECONDS


@pytest.mark.parametrize("kind", ["read-modify-write", "compiled"])
def test_a_landed_write_is_settled_applied_when_its_first_settle_answer_is_lost_too(dynamodb_local, local_table, kind):
    client, name = local_table
    forwarder = Forwarder(dynamodb_local.port)
    try:
        writer = DeviceStateManager(dynamodb_client(forwarder.endpoint, "us-east-1"), name)  # default settle (10 s)
        other = DeviceStateManager(client, name)
        other.create("d", {"n": 0})
        writer.get("d")  # the writer's container has seen the item (a compiled patch trims from this view)
        # 1. the write lands; its answer is lost (known after the read timeout)
        forwarder.lose("UpdateItem", then=lambda: time.sleep(READ_TIMEOUT))
        # 2. (a read-modify-write) the first settle mark's answer is lost as well; meanwhile one other write lands
        forwarder.lose("UpdateItem", then=lambda: (time.sleep(READ_TIMEOUT - 0.5),
                                                   other.update_with_retry("d", MergePatch({"other": {"v": 1}}))))
        patch = (JsonPatch([{"op": "increment", "path": "/n", "value": 1}]) if kind == "compiled"
                 else JsonPatch([{"op": "add", "path": "/mine", "value": 1}]))
        device = writer.update_with_retry("d", patch)  # OutcomeUnknown (504) here
        assert device.version >= 2
        assert other.get("d").version == 3  # applied once, plus the other write
    finally:
        forwarder.close()


def test_the_journal_keeps_an_entry_longer_than_any_settle_asks_for_it():
    """The longest settle (SETTLE_SECONDS at its maximum) starts after a read timeout."""
    assert JOURNAL_KEEP_SECONDS > config.MAX_SETTLE_SECONDS + READ_TIMEOUT_SECONDS
