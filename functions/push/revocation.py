"""A device's own connections end with the credential they were opened with and with the
device. Once the device no longer holds that credential (revoked, expired, a certificate it never
registered once it registers one, or the device deleted), the fan-out closes them (@connections
DELETE) and forgets them before the batch's changes go out, so they get no further message. Once
the device no longer counts a connection (deleted, or deleted and created again: a connection of
a token naming no credential too), the fan-out closes it after the batch's changes went out, so
it hears the delete; the device connects again once it exists, and that connection counts
against its cap. It learns of such a change from the stream: a credential's item added or removed
(``CREDENTIAL_PATTERN``), or a device's delete among the change items; it then reads the device's
state item once and judges each subscriber by it (``Holder.admits``, ``counted_connections``), and
each own connection the item counts that follows nothing of the device by the credential its
connection's item records (one batch read): left open, those would hold the device's places
under its cap until their tokens expire. A back-end's subscription stays: it follows the device
id, created again or not."""

from __future__ import annotations

import logging
from typing import Callable

from functions.device_state import CREDENTIAL_SK_PREFIX, Holder, counted_connections, table

from .subscriptions import Subscription

logger = logging.getLogger("device_state.push")

# The fan-out mapping's second filter (Lambda filter-pattern syntax): a credential added or removed.
CREDENTIAL_PATTERN = {"eventName": ["INSERT", "REMOVE"],
                      "dynamodb": {"Keys": {table.SORT_KEY: {"S": [{"prefix": CREDENTIAL_SK_PREFIX}]}}}}


def is_credential_change(record: dict) -> bool:
    """``CREDENTIAL_PATTERN`` as the mapping applies it."""
    keys = (record.get("dynamodb") or {}).get("Keys") or {}
    return (record.get("eventName") in ("INSERT", "REMOVE")
            and keys.get(table.SORT_KEY, {}).get("S", "").startswith(CREDENTIAL_SK_PREFIX))


def close_revoked(device_id: str, followers: list[Subscription], item: dict | None, now: float,
                  close: Callable[[str], None], forget: Callable[[str], None],
                  holders: Callable[[list[str]], dict[str, Holder]]) -> list[Subscription]:
    """Closes (``close``) and forgets (``forget``) each of the device's own connections whose
    credential the device's state item now (``item``; None: it is gone) no longer admits: those
    among its ``followers``, and those the item counts that follow nothing of it (``holders``,
    given their ids, reads the credential each came with), which would otherwise stay open and
    hold a place under the device's cap. The followers left."""
    revoked = [subscription for subscription in followers if subscription.holder is not None
               and (item is None or not subscription.holder.admits(item, now))]
    idle = sorted(counted_connections(item) - {subscription.connection_id for subscription in followers})
    revoked_idle = [connection_id for connection_id, holder in (holders(idle) if idle else {}).items()
                    if item is None or not holder.admits(item, now)]
    _close(device_id, [subscription.connection_id for subscription in revoked] + revoked_idle, close, forget,
           "connections of a revoked credential closed")
    return [subscription for subscription in followers if subscription not in revoked]


def close_uncounted(device_id: str, followers: list[Subscription], item: dict | None,
                    close: Callable[[str], None], forget: Callable[[str], None], counted_before=()) -> None:
    """Closes and forgets each of the device's own connections that its state item (``item``) does
    not count: its own ``followers``, once the delete went out to them, and those a delete's
    change says it counted until then (``counted_before``), which may follow nothing of it."""
    counted = counted_connections(item)
    ending = {subscription.connection_id for subscription in followers if subscription.own}
    _close(device_id, sorted((ending | set(counted_before)) - counted), close, forget,
           "connections of a deleted device closed")


def _close(device_id: str, ending: list[str], close, forget, what: str) -> None:
    for connection_id in ending:
        close(connection_id)
        forget(connection_id)
    if ending:
        logger.info(what, extra={"deviceId": device_id, "closed": len(ending)})
