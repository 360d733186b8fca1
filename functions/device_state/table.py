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

# The state item's names, for callers of the table (scripts, tests, the stack): declared in item/schema.py.
from .item.schema import (  # noqa: F401
    BOOKKEEPING_ATTRIBUTES,
    CERTIFICATE_REQUIRED,
    CHANGED_ATTRIBUTES,
    CHANGED_DESIRED,
    CHANGED_REPORTED,
    CLEAR_PENDING,
    CONNECTED_SINCE,
    CONNECTIONS,
    CONNECTIVITY_ATTRIBUTES,
    CONTENDED_UNTIL,
    CONTENTION_MARKS,
    CREATED_AT,
    CREDENTIALS,
    DELETED_AT,
    DELETED_WITH_THE_DEVICE,
    DESIRED,
    ENROLLMENT,
    GONE_ON_CREATE,
    IDENTITY_ATTRIBUTES,
    INDEX_ATTRIBUTE_PREFIX,
    ITEM_BYTES,
    JOB_MARKS,
    JOURNAL_PREFIX,
    JOURNAL_TRIMMED,
    JOURNAL_TRIMMED_STAMPS,
    JOURNAL_VIEW,
    LAST_SEEN,
    LAST_WRITE,
    LEASE_ATTRIBUTES,
    LEASE_KEY,
    LEASE_TOKEN,
    LEASE_UNTIL,
    META_ATTRIBUTES,
    META_DESIRED,
    META_REPORTED,
    PARTITION_KEY,
    RACED_UNTIL,
    REPORTED,
    SECTION_ATTRIBUTES,
    SECTIONS,
    SHARD_ATTRIBUTE,
    SORT_KEY,
    STATE,
    STATE_SK,
    STATUS_DESIRED,
    TTL_ATTRIBUTE,
    UPDATED_AT,
    VERSION,
    is_expired,
    is_live_state,
    state_key,
)

DEFAULT_TABLE_NAME = "devices"
STREAM_VIEW_TYPE = "NEW_AND_OLD_IMAGES"  # the change feed's processor diffs old and new images

KEY_SCHEMA = (
    {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
    {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
)
ATTRIBUTE_DEFINITIONS = (
    {"AttributeName": PARTITION_KEY, "AttributeType": "S"},
    {"AttributeName": SORT_KEY, "AttributeType": "S"},
)


def create_table(client, table_name: str, fleet_index=None, stream: bool = True) -> None:
    """Create the table as the CDK stack defines it (on-demand, TTL on ``expiresAt``, a
    stream, an index per field ``fleet_index`` declares) and wait until it is active. For
    tests, the local server and scripts. ``stream=False`` leaves the stream out, for a table
    whose stream nobody reads: DynamoDB Local keeps a stream's records after its table is
    deleted, and every later write on that engine costs more for them."""
    indexes = fleet_index.global_secondary_indexes() if fleet_index else []
    streamed = {"StreamSpecification": {"StreamEnabled": True, "StreamViewType": STREAM_VIEW_TYPE}} if stream else {}
    client.create_table(
        TableName=table_name,
        KeySchema=list(KEY_SCHEMA),
        AttributeDefinitions=list(ATTRIBUTE_DEFINITIONS) + (fleet_index.attribute_definitions() if indexes else []),
        BillingMode="PAY_PER_REQUEST",
        **streamed,
        **({"GlobalSecondaryIndexes": indexes} if indexes else {}),
    )
    client.get_waiter("table_exists").wait(
        TableName=table_name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300}
    )
    client.update_time_to_live(
        TableName=table_name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
    )


def ensure_table(client, table_name: str, fleet_index=None, stream: bool = True) -> None:
    """Create the table unless it exists already (its stream as ``create_table``'s); on one
    that exists, add the index of each declared field it lacks (one at a time, as DynamoDB
    requires), waiting until each is active."""
    try:
        description = client.describe_table(TableName=table_name)["Table"]
    except client.exceptions.ResourceNotFoundException:
        create_table(client, table_name, fleet_index, stream)
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

# Sort-key prefix of idempotency records (see write/keyed.py).
IDEMPOTENCY_SK_PREFIX = "idem#"
IDEMPOTENCY_PART_SK_PREFIX = "idem-part#"  # further parts of a long recorded answer
# Lease queue rows and the ticket counter (see leases/queue.py).
LEASE_SK_PREFIX = "lease#"
LEASE_COUNTER_SK = "lease-counter"
