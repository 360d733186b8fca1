"""The one definition of the ``devices`` table, shared by the library, the tests, the
local server and the CDK stack.

Every item lives in a device's partition (``deviceId``); the sort key ``sk`` says what
it is. The device's own state item is ``sk = "state"``; later features keep their items
(lease tickets, idempotency records) in the same partition under other sort keys.
``expiresAt`` (epoch seconds) is the TTL attribute: an item whose ``expiresAt`` has
passed is treated as absent by every read, whatever DynamoDB's TTL has deleted yet.
"""

from __future__ import annotations

import time

DEFAULT_TABLE_NAME = "devices"
PARTITION_KEY = "deviceId"
SORT_KEY = "sk"
STATE_SK = "state"
TTL_ATTRIBUTE = "expiresAt"
STREAM_VIEW_TYPE = "NEW_AND_OLD_IMAGES"  # the change feed's processor diffs old and new images

KEY_SCHEMA = (
    {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
    {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
)
ATTRIBUTE_DEFINITIONS = (
    {"AttributeName": PARTITION_KEY, "AttributeType": "S"},
    {"AttributeName": SORT_KEY, "AttributeType": "S"},
)


def state_key(device_id: str) -> dict:
    return {PARTITION_KEY: {"S": device_id}, SORT_KEY: {"S": STATE_SK}}


def is_live_state(item: dict | None, now_epoch: float) -> bool:
    """True for a device's live state item: it has a version, is no tombstone, and has
    not expired (tombstones and settle stubs read as absent everywhere)."""
    return (item is not None and VERSION in item and DELETED_AT not in item
            and not is_expired(item, now_epoch))


def is_expired(item: dict, now_epoch: float) -> bool:
    """True when a raw (low-level) item carries an ``expiresAt`` that has passed."""
    expires = item.get(TTL_ATTRIBUTE)
    return expires is not None and "N" in expires and float(expires["N"]) <= now_epoch


def create_table(client, table_name: str, fleet_index=None) -> None:
    """Create the table as the CDK stack defines it (on-demand, TTL on ``expiresAt``, a
    stream, an index per field ``fleet_index`` declares) and wait until it is active. For
    tests, the local server and scripts."""
    indexes = fleet_index.global_secondary_indexes() if fleet_index else []
    client.create_table(
        TableName=table_name,
        KeySchema=list(KEY_SCHEMA),
        AttributeDefinitions=list(ATTRIBUTE_DEFINITIONS) + (fleet_index.attribute_definitions() if indexes else []),
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": STREAM_VIEW_TYPE},
        **({"GlobalSecondaryIndexes": indexes} if indexes else {}),
    )
    client.get_waiter("table_exists").wait(
        TableName=table_name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300}
    )
    client.update_time_to_live(
        TableName=table_name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
    )


def ensure_table(client, table_name: str, fleet_index=None) -> None:
    """Create the table unless it exists already; on one that exists, add the index of
    each declared field it lacks (one at a time, as DynamoDB requires), waiting until
    each is active."""
    try:
        description = client.describe_table(TableName=table_name)["Table"]
    except client.exceptions.ResourceNotFoundException:
        create_table(client, table_name, fleet_index)
        return
    existing = {index["IndexName"] for index in description.get("GlobalSecondaryIndexes", [])}
    for index in (fleet_index.global_secondary_indexes() if fleet_index else []):
        if index["IndexName"] in existing:
            continue
        attributes = {key["AttributeName"] for key in index["KeySchema"]}
        client.update_table(
            TableName=table_name,
            AttributeDefinitions=[definition for definition in fleet_index.attribute_definitions()
                                  if definition["AttributeName"] in attributes],
            GlobalSecondaryIndexUpdates=[{"Create": index}])
        _wait_for_index(client, table_name, index["IndexName"])


def _wait_for_index(client, table_name: str, index_name: str) -> None:
    """Until the index is ACTIVE (at most 10 minutes); a DescribeTable that DynamoDB fails
    (a 5xx, as DynamoDB Local does while it builds an index under load) is asked again."""
    from botocore.exceptions import ClientError

    for _ in range(1200):
        try:
            indexes = client.describe_table(TableName=table_name)["Table"].get("GlobalSecondaryIndexes", [])
        except ClientError as error:
            if error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) < 500:
                raise
            indexes = []
        if any(index["IndexName"] == index_name and index.get("IndexStatus") == "ACTIVE" for index in indexes):
            return
        time.sleep(0.5)
    raise TimeoutError(f"index {index_name} of {table_name} did not become active")

# Attributes of a device's state item.
VERSION = "version"
STATE = "state"
CREATED_AT = "createdAt"
UPDATED_AT = "updatedAt"
DELETED_AT = "deletedAt"  # set on a tombstone: the device was deleted at this time
DESIRED = "desired"  # what apps want the device to be
REPORTED = "reported"  # what the device says it is
META_DESIRED = "metaDesired"  # per-leaf metadata of desired and reported (see sections.py)
META_REPORTED = "metaReported"
# Per desired leaf: the device's acknowledgement, the desire's expiry, clear on confirm (desires.py).
STATUS_DESIRED = "statusDesired"
CLEAR_PENDING = "clearPending"  # set while a desire is to be cleared by its confirming report
CHANGED_DESIRED = "changedDesired"  # the version of the last write to desired (what a delta waiter waits for)
CHANGED_REPORTED = "changedReported"
LAST_WRITE = "lastWrite"  # what the write that made this version did: created, replaced, updated, deleted
# The device's connectivity, beside its versioned sections (connectivity.py).
CONNECTIONS = "connections"  # a string set: one member per open WebSocket connection
CONNECTED_SINCE = "connectedSince"  # ms
LAST_SEEN = "lastSeen"  # ms
# Epoch ms, set by read-modify-writes that won after racing others long: the first such
# winner leaves racedUntil, a second one before then contendedUntil; read-modify-writes that
# start before contendedUntil hold back so that those racing go first (contention.py).
RACED_UNTIL = "racedUntil"
CONTENDED_UNTIL = "contendedUntil"
# An upper estimate of the item's size: set by every read-modify-write, raised by each
# compiled patch by the most it can add. A compiled patch (which reads nothing) applies
# only while it leaves room; otherwise read-modify-write checks the size exactly.
ITEM_BYTES = "itemBytes"

# The write journal: one attribute per recent write, named by its write id and holding
# the version that write produced (0: settled as never applied). See journal.py.
JOURNAL_PREFIX = "w:"
JOURNAL_TRIMMED = "journalTrimmed"  # the newest write-id stamp (ms) trimmed by a write that read the item
# Number set: the newest stamps compiled patches dropped; its highest is their watermark.
JOURNAL_TRIMMED_STAMPS = "journalTrimmedStamps"

# The active lease holder, recorded on the state item so every write can be fenced.
LEASE_TOKEN = "leaseToken"  # the holder's fencing token (its ticket): ordering, never a credential
LEASE_KEY = "leaseKey"  # a digest of the holder's secret lease token: what a write must present
LEASE_UNTIL = "leaseUntil"  # epoch seconds (to the millisecond) when the holder's lease ends

# Sort-key prefix of idempotency records (see idempotency.py).
IDEMPOTENCY_SK_PREFIX = "idem#"
IDEMPOTENCY_PART_SK_PREFIX = "idem-part#"  # further parts of a long recorded answer
# Lease queue rows and the ticket counter (see leases.py).
LEASE_SK_PREFIX = "lease#"
LEASE_COUNTER_SK = "lease-counter"
