"""An assertion's ``jti`` is good once: a small item in the device's partition
(``sk = "jti#<jti>"``), written under ``attribute_not_exists`` and kept until the assertion
expires (the table's TTL). The write names its own request, so the store's resend of it after
a lost answer is not taken for a replay."""

from __future__ import annotations

import uuid

from ..errors import AssertionReplayed, ConditionNotMet
from ..item import schema
from ..write.expressions import Expression
from ..write.store import IDEMPOTENT, Store

SK_PREFIX = "jti#"
MAX_JTI_CHARS = 128
_REQUEST = "request"
ASSERTION = "assertion"  # a provisioning's jti part beside its other parts (``send_together``)


def jti_key(device_id: str, jti: str) -> dict:
    return {schema.PARTITION_KEY: {"S": device_id}, schema.SORT_KEY: {"S": SK_PREFIX + jti}}


def jti_put(table_name: str, device_id: str, jti: str, until: int, request: str | None = None) -> dict:
    """The Put that records ``jti`` as used, unless it was (by another request than ``request``)."""
    expr = Expression()
    ours = request or uuid.uuid4().hex
    return {"TableName": table_name,
            "Item": {**jti_key(device_id, jti), _REQUEST: {"S": ours}, schema.TTL_ATTRIBUTE: {"N": str(until)}},
            "ConditionExpression": f"attribute_not_exists({expr.name(schema.SORT_KEY)}) OR "
                                   f"{expr.name(_REQUEST)} = {expr.value({'S': ours})}",
            **expr.attributes()}


def use_once(store: Store, device_id: str, jti: str, until: int) -> None:
    """Records the assertion ``jti`` as used until ``until`` (epoch seconds);
    ``AssertionReplayed`` when it was used before."""
    try:
        store.send("put_item", IDEMPOTENT, **jti_put(store.table_name, device_id, jti, until))
    except ConditionNotMet:
        raise AssertionReplayed(device_id) from None
