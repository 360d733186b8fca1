"""The fan-out: a consumer of the table's stream of its own (its own event source mapping,
so a slow or failing post never holds up the change feed's writer) that reads each change
item the feed's processor writes and brings the device's subscribers up to it. A failing
device's records are reported back (partial batch response) and retried; the others go on.
After the mapping's last retry the batch goes to the on-failure queue; subscribers catch up
with the device's next change, or by subscribing again from the last version they have.

Before a batch's changes go out, a device whose credentials changed (a credential's item added
or removed) or that was deleted has the connections it no longer admits closed (``revocation``),
so a revoked credential's connection gets no further message; after they went out, a deleted
device's own connections that heard its delete."""

from __future__ import annotations

import functools
import logging
import time

from functions.device_state import CHANGE_SK_PREFIX, DELETED, LEGACY_CHANGE_SK_PREFIX, change_from_item, table

from . import connections
from .revocation import CREDENTIAL_PATTERN, close_revoked, close_uncounted, is_credential_change
from .services import devices, forget, services

logger = logging.getLogger("device_state.push")

# The event source mapping's filters (Lambda filter-pattern syntax, any one matches): new change
# items, and credentials added or removed. A change item under the legacy key is one an older
# release's processor wrote just before an upgrade, still in the stream.
_CHANGE_PREFIXES = (CHANGE_SK_PREFIX, LEGACY_CHANGE_SK_PREFIX)
FILTER_PATTERN = {"eventName": ["INSERT"],
                  "dynamodb": {"Keys": {table.SORT_KEY: {"S": [{"prefix": p} for p in _CHANGE_PREFIXES]}}}}
FILTER_PATTERNS = (FILTER_PATTERN, CREDENTIAL_PATTERN)
BATCH_SIZE = 100
MAX_RETRY_ATTEMPTS = 10


def matches_filter(record: dict) -> bool:
    """``FILTER_PATTERNS`` as the mapping applies them (the local poller uses this)."""
    return is_change(record) or is_credential_change(record)


def is_change(record: dict) -> bool:
    """``FILTER_PATTERN``: a new change item."""
    keys = (record.get("dynamodb") or {}).get("Keys") or {}
    return (record.get("eventName") == "INSERT"
            and keys.get(table.SORT_KEY, {}).get("S", "").startswith(_CHANGE_PREFIXES))


def changed_since(change) -> dict | None:
    """What ``Delivery.fan_out`` needs to leave a subscriber alone: per section, the version
    that last changed it as of ``change``; None when the change is every subscriber's business
    (a delete, a version whose change was lost) or the item carries no marks."""
    if change.kind == DELETED or change.lost or not change.last_changed:
        return None
    return change.last_changed


def lambda_handler(event, _context):
    subscriptions, delivery = services()
    newest: dict[str, tuple[int, str, dict | None]] = {}  # device -> (version, first sequence number, marks)
    streamed: dict[str, list] = {}  # device -> the changes the batch brought, in stream order
    revoking: dict[str, str] = {}  # device whose credentials changed -> its first sequence number
    closing: dict[str, set] = {}  # deleted device -> the connections it counted until then
    for record in event.get("Records", []):
        dynamodb = record.get("dynamodb") or {}
        if is_credential_change(record):
            revoking.setdefault(dynamodb["Keys"][table.PARTITION_KEY]["S"], dynamodb["SequenceNumber"])
            continue
        if not is_change(record):
            continue
        device_id = dynamodb["Keys"][table.PARTITION_KEY]["S"]
        change = change_from_item(dynamodb["NewImage"])
        streamed.setdefault(device_id, []).append(change)
        if change.kind == DELETED:  # deleting a device revokes its credentials
            revoking.setdefault(device_id, dynamodb["SequenceNumber"])
            closing.setdefault(device_id, set()).update(change.closing)
        version, first, marks = newest.get(device_id, (0, dynamodb["SequenceNumber"], {}))
        # the newest change's marks cover the batch's earlier ones; a delete or a lost change
        # anywhere in it (None) keeps every subscriber in
        current = changed_since(change)
        if marks is not None and (current is None or change.version > version):
            marks = current
        newest[device_id] = (max(version, change.version), first, marks)
    failed, left = [], {}  # device -> (its first sequence number, its state item, the followers revocation left)
    close_ended = functools.partial(forget, subscriptions)
    for device_id, sequence in revoking.items():
        first = min(sequence, newest.get(device_id, (0, sequence, None))[1], key=int)
        try:
            item = devices().live_state(device_id)
            left[device_id] = first, item, close_revoked(device_id, subscriptions.of_device(device_id), item,
                                                         time.time(), connections.close, close_ended,
                                                         subscriptions.holders)
        except Exception:  # noqa: BLE001 - retried by the mapping from this device's first record
            logger.exception("closing revoked connections failed", extra={"deviceId": device_id})
            # its changes wait too (none goes out to a connection that may be revoked): retried from the first
            newest.pop(device_id, None)
            failed.append(first)
    for device_id, (version, sequence, marks) in newest.items():
        try:
            delivery.fan_out(device_id, version, marks, streamed[device_id])
        except Exception:  # noqa: BLE001 - retried by the mapping from this device's first record
            logger.exception("fan-out failed", extra={"deviceId": device_id, "version": version})
            failed.append(sequence)
            left.pop(device_id, None)  # closed once its changes went out, when retried
    for device_id, (first, item, followers) in left.items():
        try:
            close_uncounted(device_id, followers, item, connections.close, close_ended, closing.get(device_id, ()))
        except Exception:  # noqa: BLE001 - retried by the mapping from this device's first record
            logger.exception("closing a deleted device's connections failed", extra={"deviceId": device_id})
            failed.append(first)
    return {"batchItemFailures": [{"itemIdentifier": sequence} for sequence in sorted(failed, key=int)[:1]]}
