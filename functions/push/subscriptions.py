"""Subscriptions and connections as items of the devices table, through the library's one
door (``Store``). A subscription lives in its device's partition (``sk =
subscription#<connectionId>``), so a change's fan-out finds its subscribers with one query;
it records ``delivered``, the last version sent, which every sender advances only from the
value it read (a conditional write), so the first copy of each version goes out in order.
A connection's item (partition ``connection#<id>``, never a device id: those have no ``#``)
lists the devices it follows, for the limit and for clean-up. Both expire with API
Gateway's connection lifetime. Neither is a device's state item, so neither makes a change.
A device's own connection records the credential it was opened with (``HOLDER``, on both
items) and its subscription to itself is marked (``OWN``), so the fan-out can close it once the
device no longer holds that credential or no longer counts the connection (``revocation``)."""

from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from functions.device_state import AnswerLost, ConditionNotMet, Holder, StorageUnavailable, table
from functions.device_state.write.expressions import Expression, number
from functions.device_state.write.store import IDEMPOTENT, ONCE, Store

logger = logging.getLogger("device_state.push")

SUBSCRIPTION_SK_PREFIX = "subscription#"
CONNECTION_PK_PREFIX = "connection#"
CONNECTION_SK = "connection"
MAX_SUBSCRIPTIONS = 100  # per connection
DEVICES = "devices"  # on a connection's item: the devices it follows (a string set)
DELIVERED = "delivered"  # on a subscription: the last version sent
SUBSCRIBED_BY = "subscribedBy"  # on a subscription: the subscribe that put it (a random id)
HOLDER = "holder"  # on a device's own connection and its subscription: the credential it came with
OWN = "own"  # on a device's own subscription to itself, whatever its token names
CONNECTION_LIFETIME_SECONDS = 2 * 60 * 60  # API Gateway closes a WebSocket connection after 2 hours
OPENED_AT = "openedAt"  # on a connection's item: when its $connect stored it (epoch seconds)
# API Gateway answers a connection whose $connect has not returned yet as gone, as it does a closed
# one; a $connect returns within its integration's 29 s, so only connections opened longer ago than
# this are asked about.
CONNECTING_SECONDS = 30


class TooManySubscriptions(Exception):
    pass


class UnknownConnection(Exception):
    """The connection has no item: it closed (or expired) meanwhile."""


@dataclass(frozen=True)
class Subscription:
    device_id: str
    connection_id: str
    delivered: int  # the last version sent (``since`` at first)
    sections: tuple
    expires: float | None = None  # the connection's end (its token's expiry, or API Gateway's 2 hours)
    holder: Holder | None = None  # a device's own connection: the credential it was opened with
    own: bool = False  # the device's own connection following itself

    def expired(self, now: float) -> bool:
        return self.expires is not None and self.expires <= now


def _connection_key(connection_id: str) -> dict:
    return {table.PARTITION_KEY: {"S": CONNECTION_PK_PREFIX + connection_id}, table.SORT_KEY: {"S": CONNECTION_SK}}


def _subscription_key(device_id: str, connection_id: str) -> dict:
    return {table.PARTITION_KEY: {"S": device_id}, table.SORT_KEY: {"S": SUBSCRIPTION_SK_PREFIX + connection_id}}


class Subscriptions:
    def __init__(self, client, table_name: str, clock=time.time):
        self.store = Store(client, table_name)
        self.clock = clock

    def open(self, connection_id: str, subject: str, credential_expires_at: int | None = None,
             holder: Holder | None = None) -> int:
        """A connection's item; returns when it ends (epoch seconds). It and its subscriptions
        expire with API Gateway's connection lifetime, or with the credential it was opened
        with if that ends sooner: no change is pushed on a token past its expiry. ``holder``: the
        credential a device's own connection came with."""
        expires = self.ends(credential_expires_at)
        self.store.send("put_item", IDEMPOTENT, Item={
            **_connection_key(connection_id), "subject": {"S": subject}, table.TTL_ATTRIBUTE: number(expires),
            OPENED_AT: number(int(self.clock())),
            **({HOLDER: _holder_attribute(holder)} if holder is not None else {})})
        return expires

    def ends(self, credential_expires_at: int | None = None) -> int:
        """When a connection opened now ends at the latest (epoch seconds)."""
        expires = int(self.clock()) + CONNECTION_LIFETIME_SECONDS
        return expires if credential_expires_at is None else min(expires, credential_expires_at)

    def subscribe(self, connection_id: str, device_id: str, since: int, sections, own: bool = False) -> Subscription:
        """Follows ``device_id`` from ``since`` (a subscription of the same device replaced);
        ``own``: the connection is the device's own."""
        expr = Expression()
        devices = expr.name(DEVICES)
        condition = (f"attribute_exists({expr.name(table.SORT_KEY)}) AND (attribute_not_exists({devices}) OR "
                     f"contains({devices}, {expr.value({'S': device_id})}) OR "
                     f"size({devices}) < {expr.number(MAX_SUBSCRIPTIONS)})")
        try:
            answer = self.store.send(
                "update_item", IDEMPOTENT, Key=_connection_key(connection_id),
                UpdateExpression=f"ADD {devices} {expr.value({'SS': [device_id]})}", ConditionExpression=condition,
                **expr.attributes(), ReturnValuesOnConditionCheckFailure="ALL_OLD", ReturnValues="ALL_NEW")
        except ConditionNotMet as refused:
            if refused.item is None:
                raise UnknownConnection(connection_id) from None
            raise TooManySubscriptions(f"a connection follows at most {MAX_SUBSCRIPTIONS} devices") from None
        expires, holder = answer["Attributes"][table.TTL_ATTRIBUTE], answer["Attributes"].get(HOLDER)
        subscription = Subscription(device_id, connection_id, since, tuple(sections), float(expires["N"]),
                                    _holder(holder), own)
        # Put unless this subscribe's own first copy landed already: a resend after a lost answer
        # would move `delivered` back over versions the fan-out sent meanwhile (sent again).
        ours, put = {"S": uuid.uuid4().hex[:16]}, Expression()
        mark = put.name(SUBSCRIBED_BY)
        try:
            self.store.send("put_item", IDEMPOTENT, Item={
                **_subscription_key(device_id, connection_id), "connectionId": {"S": connection_id},
                DELIVERED: number(since), "sections": {"L": [{"S": name} for name in sections]},
                SUBSCRIBED_BY: ours, table.TTL_ATTRIBUTE: expires, **({HOLDER: holder} if holder is not None else {}),
                **({OWN: {"BOOL": True}} if own else {})},
                ConditionExpression=f"attribute_not_exists({mark}) OR {mark} <> {put.value(ours)}", **put.attributes())
        except ConditionNotMet:
            pass  # this subscribe's own copy, landed first
        return subscription

    def unsubscribe(self, connection_id: str, device_id: str) -> bool:
        """Whether there was such a subscription."""
        answer = self.store.send("delete_item", IDEMPOTENT, Key=_subscription_key(device_id, connection_id),
                                 ReturnValues="ALL_OLD")
        expr = Expression()
        try:
            self.store.send("update_item", IDEMPOTENT, Key=_connection_key(connection_id),
                            UpdateExpression=f"DELETE {expr.name(DEVICES)} {expr.value({'SS': [device_id]})}",
                            ConditionExpression=f"attribute_exists({expr.name(table.SORT_KEY)})", **expr.attributes())
        except ConditionNotMet:
            pass  # the connection is gone already
        return "Attributes" in answer

    def close(self, connection_id: str) -> tuple[str, int] | None:
        """Forgets the connection and every subscription it had; (its subject, when it was
        to end) if it was open."""
        answer = self.store.send("delete_item", IDEMPOTENT, Key=_connection_key(connection_id),
                                 ReturnValues="ALL_OLD")
        closed = answer.get("Attributes", {})
        for device_id in closed.get(DEVICES, {}).get("SS", []):
            try:  # what storage does not take expires with the connection: the close still answers what it was
                self.store.send("delete_item", IDEMPOTENT, Key=_subscription_key(device_id, connection_id))
            except StorageUnavailable as error:
                logger.warning("subscription not removed", extra={"reason": str(error)})
        if "subject" not in closed:
            return None
        return closed["subject"]["S"], int(closed[table.TTL_ATTRIBUTE]["N"])

    def closed(self, connection_ids: list[str], known_gone: Callable[[str], bool] | None = None) -> set[str]:
        """Of ``connection_ids`` (at most 100), those whose connection's item is gone (its close
        deleted it, or it expired), and with ``known_gone`` (asked at once for each, given a
        connection id), those whose item stays but which ``known_gone`` says are gone: closed
        while their $disconnect never came, or never established (asked only once opened
        ``CONNECTING_SECONDS`` ago). Read strongly consistent: a connection's item is written
        before its device records it, so an open connection's item is always found."""
        keys = [_connection_key(connection_id) for connection_id in connection_ids]
        found, now = self.store.batch_get(keys), self.clock()
        gone, kept = set(), []
        for connection_id, key in zip(connection_ids, keys):
            item = found.get((key[table.PARTITION_KEY]["S"], CONNECTION_SK))
            if item is None or table.is_expired(item, now):
                gone.add(connection_id)
            elif float(item.get(OPENED_AT, {"N": str(now)})["N"]) <= now - CONNECTING_SECONDS:  # none: may be new
                kept.append(connection_id)
        if known_gone is not None and kept:
            with ThreadPoolExecutor(max_workers=len(kept)) as pool:
                gone.update(connection_id for connection_id, dead in zip(kept, pool.map(known_gone, kept)) if dead)
        return gone

    def holders(self, connection_ids: list[str]) -> dict[str, Holder]:
        """Of ``connection_ids`` (at most 100), the open connections a device's own credential
        opened, and the credential each came with (strongly consistent)."""
        keys = [_connection_key(connection_id) for connection_id in connection_ids]
        found, now, held = self.store.batch_get(keys), self.clock(), {}
        for connection_id, key in zip(connection_ids, keys):
            item = found.get((key[table.PARTITION_KEY]["S"], CONNECTION_SK))
            holder = None if item is None or table.is_expired(item, now) else _holder(item.get(HOLDER))
            if holder is not None:
                held[connection_id] = holder
        return held

    def of_device(self, device_id: str) -> list[Subscription]:
        now, found, start = self.clock(), [], None
        expr = Expression()
        followers = (f"{expr.name(table.PARTITION_KEY)} = {expr.value({'S': device_id})} AND "
                     f"begins_with({expr.name(table.SORT_KEY)}, {expr.value({'S': SUBSCRIPTION_SK_PREFIX})})")
        while True:
            page = self.store.send(
                "query", ConsistentRead=True, KeyConditionExpression=followers, **expr.attributes(),
                **({"ExclusiveStartKey": start} if start else {}))
            found += [_subscription(item) for item in page.get("Items", []) if not table.is_expired(item, now)]
            start = page.get("LastEvaluatedKey")
            if not start:
                return found

    def current(self, subscription: Subscription) -> Subscription | None:
        item = self.store.get(_subscription_key(subscription.device_id, subscription.connection_id))
        return None if item is None or table.is_expired(item, self.clock()) else _subscription(item)

    def advance(self, subscription: Subscription, version: int) -> bool:
        """Records ``version`` as sent if nothing moved ``delivered`` since it was read."""
        expr = Expression()
        delivered = expr.name(DELIVERED)
        try:
            self.store.send("update_item", ONCE, Key=_subscription_key(subscription.device_id,
                                                                       subscription.connection_id),
                            UpdateExpression=f"SET {delivered} = {expr.number(version)}",
                            ConditionExpression=f"{delivered} = {expr.number(subscription.delivered)}",
                            **expr.attributes())
            return True
        except (ConditionNotMet, AnswerLost):  # moved by another sender, or unknown: read it again
            return False


def _subscription(item: dict) -> Subscription:
    expires = item.get(table.TTL_ATTRIBUTE, {}).get("N")
    return Subscription(item[table.PARTITION_KEY]["S"], item["connectionId"]["S"], int(item[DELIVERED]["N"]),
                        tuple(entry["S"] for entry in item.get("sections", {}).get("L", [])),
                        None if expires is None else float(expires), _holder(item.get(HOLDER)),
                        item.get(OWN, {}).get("BOOL", False))


def _holder_attribute(holder: Holder) -> dict:
    registration = {} if holder.registration is None else {"registration": {"N": holder.registration}}
    return {"M": {"credentialId": {"S": holder.credential_id}, "certificate": {"BOOL": holder.certificate},
                  "required": {"BOOL": holder.required}, **registration}}


def _holder(attribute: dict | None) -> Holder | None:
    if attribute is None:
        return None
    fields = attribute["M"]
    return Holder(fields["credentialId"]["S"], fields["certificate"]["BOOL"], fields["required"]["BOOL"],
                  fields["registration"]["N"] if "registration" in fields else None)
