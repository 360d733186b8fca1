"""The fan-out: a consumer of the table's stream of its own (its own event source mapping,
so a slow or failing post never holds up the change feed's writer) that reads each change
item the feed's processor writes and brings the device's subscribers up to it. A failing
device's records are reported back (partial batch response) and retried; the others go on.
After the mapping's last retry the batch goes to the on-failure queue; subscribers catch up
with the device's next change, or by subscribing again from the last version they have."""

from __future__ import annotations

import logging

from functions.device_state import CHANGE_SK_PREFIX, DELETED, change_from_item, table

from .services import services

logger = logging.getLogger("device_state.push")

# The event source mapping's filter (Lambda filter-pattern syntax): new change items only.
FILTER_PATTERN = {"eventName": ["INSERT"],
                  "dynamodb": {"Keys": {table.SORT_KEY: {"S": [{"prefix": CHANGE_SK_PREFIX}]}}}}
BATCH_SIZE = 100
MAX_RETRY_ATTEMPTS = 10


def matches_filter(record: dict) -> bool:
    """``FILTER_PATTERN`` as the mapping applies it (the local poller uses this)."""
    keys = (record.get("dynamodb") or {}).get("Keys") or {}
    return (record.get("eventName") == "INSERT"
            and keys.get(table.SORT_KEY, {}).get("S", "").startswith(CHANGE_SK_PREFIX))


def changed_since(change) -> dict | None:
    """What ``Delivery.fan_out`` needs to leave a subscriber alone: per section, the version
    that last changed it as of ``change``; None when the change is every subscriber's business
    (a delete, a version whose change was lost) or the item carries no marks."""
    if change.kind == DELETED or change.lost or not change.last_changed:
        return None
    return change.last_changed


def lambda_handler(event, _context):
    _, delivery = services()
    newest: dict[str, tuple[int, str, dict | None]] = {}  # device -> (version, first sequence number, marks)
    for record in event.get("Records", []):
        if not matches_filter(record):
            continue
        dynamodb = record["dynamodb"]
        device_id = dynamodb["Keys"][table.PARTITION_KEY]["S"]
        change = change_from_item(dynamodb["NewImage"])
        version, first, marks = newest.get(device_id, (0, dynamodb["SequenceNumber"], {}))
        # the newest change's marks cover the batch's earlier ones; a delete or a lost change
        # anywhere in it (None) keeps every subscriber in
        current = changed_since(change)
        if marks is not None and (current is None or change.version > version):
            marks = current
        newest[device_id] = (max(version, change.version), first, marks)
    failed = []
    for device_id, (version, sequence, marks) in newest.items():
        try:
            delivery.fan_out(device_id, version, marks)
        except Exception:  # noqa: BLE001 - retried by the mapping from this device's first record
            logger.exception("fan-out failed", extra={"deviceId": device_id, "version": version})
            failed.append(sequence)
    return {"batchItemFailures": [{"itemIdentifier": sequence} for sequence in sorted(failed, key=int)[:1]]}
