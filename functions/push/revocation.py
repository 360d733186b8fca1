"""A device's own connections end with the credential they were opened with: once the device no
longer holds it (revoked, expired, a certificate it never registered once it registers one, or
the device deleted), the fan-out closes them (@connections DELETE) and forgets them, so they get
no further message. It learns of such a change from the stream: a credential's item added or
removed (``CREDENTIAL_PATTERN``), or a device's delete among the change items; it then reads the
device's state item once and judges each subscriber by it (``Holder.admits``)."""

from __future__ import annotations

import logging
from typing import Callable

from functions.device_state import CREDENTIAL_SK_PREFIX, table

from .subscriptions import Subscriptions

logger = logging.getLogger("device_state.push")

# The fan-out mapping's second filter (Lambda filter-pattern syntax): a credential added or removed.
CREDENTIAL_PATTERN = {"eventName": ["INSERT", "REMOVE"],
                      "dynamodb": {"Keys": {table.SORT_KEY: {"S": [{"prefix": CREDENTIAL_SK_PREFIX}]}}}}


def is_credential_change(record: dict) -> bool:
    """``CREDENTIAL_PATTERN`` as the mapping applies it."""
    keys = (record.get("dynamodb") or {}).get("Keys") or {}
    return (record.get("eventName") in ("INSERT", "REMOVE")
            and keys.get(table.SORT_KEY, {}).get("S", "").startswith(CREDENTIAL_SK_PREFIX))


def close_revoked(device_id: str, subscriptions: Subscriptions, item: dict | None, now: float,
                  close: Callable[[str], None], forget: Callable[[str], None]) -> list[str]:
    """Closes (``close``) and forgets (``forget``) every connection that follows the device with a
    credential ``item`` (the device's state item now; None: it is gone) no longer admits; their ids."""
    closed = []
    for subscription in subscriptions.of_device(device_id):
        holder = subscription.holder
        if holder is None or (item is not None and holder.admits(item, now)):
            continue
        close(subscription.connection_id)
        forget(subscription.connection_id)
        closed.append(subscription.connection_id)
    if closed:
        logger.info("connections of a revoked credential closed", extra={"deviceId": device_id,
                                                                         "closed": len(closed)})
    return closed
