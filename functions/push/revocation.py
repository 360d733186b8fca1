"""A device's own connections end with the credential they were opened with and with the
device. Once the device no longer holds that credential (revoked, expired, a certificate it never
registered once it registers one, or the device deleted), the fan-out closes them (@connections
DELETE) and forgets them before the batch's changes go out, so they get no further message. Once
the device no longer counts a connection (deleted, or deleted and created again: a connection of
a token naming no credential too), the fan-out closes it after the batch's changes went out, so
it hears the delete; the device connects again once it exists, and that connection counts
against its cap. It learns of such a change from the stream: a credential's item added or removed
(``CREDENTIAL_PATTERN``), or a device's delete among the change items; it then reads the device's
state item once and judges each subscriber by it (``Holder.admits``, ``counted_connections``). A
back-end's subscription stays: it follows the device id, created again or not."""

from __future__ import annotations

import logging
from typing import Callable

from functions.device_state import CREDENTIAL_SK_PREFIX, counted_connections, table

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
                  close: Callable[[str], None], forget: Callable[[str], None]) -> list[Subscription]:
    """Closes (``close``) and forgets (``forget``) each of the device's ``followers`` whose
    credential the device's state item now (``item``; None: it is gone) no longer admits; the
    followers left."""
    revoked = [subscription for subscription in followers if subscription.holder is not None
               and (item is None or not subscription.holder.admits(item, now))]
    _close(device_id, revoked, close, forget, "connections of a revoked credential closed")
    return [subscription for subscription in followers if subscription not in revoked]


def close_uncounted(device_id: str, followers: list[Subscription], item: dict | None,
                    close: Callable[[str], None], forget: Callable[[str], None]) -> None:
    """Closes and forgets each of the device's own ``followers`` that its state item (``item``)
    does not count: once the delete went out to them."""
    counted = counted_connections(item)
    _close(device_id, [subscription for subscription in followers
                       if subscription.own and subscription.connection_id not in counted],
           close, forget, "connections of a deleted device closed")


def _close(device_id: str, ending: list[Subscription], close, forget, what: str) -> None:
    for subscription in ending:
        close(subscription.connection_id)
        forget(subscription.connection_id)
    if ending:
        logger.info(what, extra={"deviceId": device_id, "closed": len(ending)})
