"""A device's own connections end with the credential they were opened with and with the
device: once the device no longer holds that credential (revoked, expired, a certificate it never
registered once it registers one) or no longer counts the connection (the device deleted, or
deleted and created again: a connection of a token naming no credential too), the fan-out closes
them (@connections DELETE) and forgets them, so they get no further message; the device connects
again once it exists, and that connection counts against its cap. It learns of such a change from
the stream: a credential's item added or removed (``CREDENTIAL_PATTERN``), or a device's delete
among the change items; it then reads the device's state item once and judges each subscriber by
it (``Holder.admits``, ``counted_connections``). A back-end's subscription stays: it follows the
device id, created again or not."""

from __future__ import annotations

import logging
from typing import Callable

from functions.device_state import CREDENTIAL_SK_PREFIX, counted_connections, table

from .subscriptions import Subscription, Subscriptions

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
    """Closes (``close``) and forgets (``forget``) every connection of the device's own that the
    device's state item now (``item``; None: it is gone) no longer admits; their ids."""
    closed = []
    for subscription in subscriptions.of_device(device_id):
        if not _shut_out(subscription, item, now):
            continue
        close(subscription.connection_id)
        forget(subscription.connection_id)
        closed.append(subscription.connection_id)
    if closed:
        logger.info("connections of a revoked credential or a deleted device closed",
                    extra={"deviceId": device_id, "closed": len(closed)})
    return closed


def _shut_out(subscription: Subscription, item: dict | None, now: float) -> bool:
    holder = subscription.holder
    if holder is not None and (item is None or not holder.admits(item, now)):
        return True
    return subscription.own and subscription.connection_id not in counted_connections(item)
