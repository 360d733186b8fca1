"""Device leases: a FIFO lock per device with heartbeats, fencing tokens and TTL clean-up.

In the device's partition:

- ``sk = "lease-counter"``: the ticket counter. ``ADD`` creates it on first use
  atomically, so there is no create race to handle; it never expires, so tickets (the
  fencing tokens) only ever go up, even across a delete and re-create of the device.
- ``sk = "lease#<ticket, 38 digits>"``: one queue row per ticket, sorted by ticket, with
  ``secret``, ``owner``, ``ttlSeconds``, ``createdAt``, ``until`` (epoch seconds to the
  millisecond) and ``expiresAt`` (whole seconds, the TTL backstop). A row whose ``until``
  has passed is ignored at once and deleted when a waiter meets it.
- On the state item, ``leaseToken`` and ``leaseUntil`` name the active holder. They are
  what fences writes (see ``fencing.py``): the queue gives the order, the
  state item's condition gives mutual exclusion, so even two waiters that both believe
  they are at the head cannot both hold the lease.

A waiter is at the head when no live row with a lower ticket exists; it then takes the
lease with one transaction (its row refreshed, the holder recorded on the state item
under the condition that no other lease is active). Heartbeats extend both in one
transaction; release deletes the row and clears the holder in one transaction.

Anyone the caller trusts to do so (the API: a back-end with the write right) may *end* a
lease or a waiting ticket by its fencing token alone (``end``): the same transaction as a
release, without the secret. A waiter refreshes its row only while the row is still the one
it put, so an ended waiting ticket stops waiting (``LeaseLost``) rather than coming back.
"""

from __future__ import annotations

import hashlib
from decimal import Decimal
import math
import secrets
import threading
import uuid
from dataclasses import dataclass

from . import table
from .device import timestamp
from .errors import (DeviceNotFound, InvalidLease, LeaseBusy, LeaseLost, OutcomeUnknown, StorageError,
                     StorageUnavailable, UnknownLease)
from .expressions import Expression, live, number
from .fencing import active_holder, lease_key
from .store import IDEMPOTENT, Ambiguous, Cancelled, Rejected
from .values import validate_device_id

DEFAULT_TTL_SECONDS = 60
MAX_TTL_SECONDS = 900
# A waiting row lives this long past each poll, so a crashed waiter stops blocking the
# queue soon after it stops polling (a holder's row lives for its ttl).
WAITING_ROW_SECONDS = 5.0
POLL_SECONDS = (0.02, 0.2)  # a waiter polls at a uniformly jittered interval in this range
MAX_REAPED_PER_POLL = 25  # expired rows deleted by one poll at most; TTL does the rest
TICKET_DIGITS = 38

_SECRET = "secret"
_OWNER = "owner"
_TICKET = "ticket"
_TTL = "ttlSeconds"
_UNTIL = "until"
_CREATED_AT = "createdAt"


def _number_value(value: float):
    """A number for JSON: ints stay ints, fractions become exact Decimals (never a float)."""
    return int(value) if float(value).is_integer() else Decimal(repr(float(value)))


def _sort_key(ticket: int) -> str:
    return f"{table.LEASE_SK_PREFIX}{ticket:0{TICKET_DIGITS}d}"


def _row_key(device_id: str, ticket: int) -> dict:
    return {table.PARTITION_KEY: {"S": device_id}, table.SORT_KEY: {"S": _sort_key(ticket)}}


def _ms(seconds: float) -> float:
    """Epoch seconds to the millisecond, as leases store and compare them."""
    return round(seconds, 3)


def lease_token_of(secret: str) -> str:
    """The secret lease token a holder presents on its writes, derived from its row's secret
    (so a heartbeat can hand it out again); unguessable without the lease id."""
    return hashlib.sha256(f"lease-token\n{secret}".encode()).hexdigest()[:32]


def parse_lease_id(lease_id: str) -> tuple[int, str]:
    """``"<ticket>.<secret>"`` → (ticket, secret); ``InvalidLease`` for anything else."""
    ticket, dot, secret = lease_id.partition(".") if isinstance(lease_id, str) else ("", "", "")
    if not dot or not ticket.isascii() or not ticket.isdigit() or len(ticket) > TICKET_DIGITS \
            or not 16 <= len(secret) <= 64 or not secret.isascii() or not secret.isalnum():
        raise InvalidLease(f"{lease_id!r} is not a lease id this service issued")
    return int(ticket), secret


@dataclass(frozen=True)
class LeaseGrant:
    """An acquired or heartbeated lease."""

    device_id: str
    lease_id: str
    fencing_token: int  # orders leases; opens nothing
    expires_at: float  # epoch seconds
    ttl_seconds: float

    @property
    def lease_token(self) -> str:
        """The secret a write presents (``Lease-Token``); only the holder ever gets it."""
        return lease_token_of(parse_lease_id(self.lease_id)[1])

    def as_dict(self) -> dict:
        """The lease as the API shows it (to its holder only)."""
        return {"deviceId": self.device_id, "leaseId": self.lease_id, "leaseToken": self.lease_token,
                "fencingToken": self.fencing_token, "expiresAt": timestamp(self.expires_at),
                "ttlSeconds": _number_value(self.ttl_seconds)}


@dataclass(frozen=True)
class LeaseStatus:
    """Who holds a device's lease (fencing token and expiry, never the lease id, which is a
    secret) and the tickets waiting behind it, in order. A fencing token opens nothing; it
    names a lease to ``LeaseQueue.end``."""

    holder_token: int | None
    holder_expires_at: float | None
    holder_owner: str | None
    waiting: int
    queue: tuple[tuple[int, str | None], ...] = ()  # (fencing token, owner) of each waiting ticket

    def as_dict(self, device_id: str) -> dict:
        holder = None
        if self.holder_token is not None:
            holder = {"fencingToken": self.holder_token, "expiresAt": timestamp(self.holder_expires_at),
                      "owner": self.holder_owner}
        return {"deviceId": device_id, "holder": holder, "queueLength": self.waiting,
                "queue": [{"fencingToken": token, "owner": owner} for token, owner in self.queue]}


class LeaseQueue:
    """The lease protocol for one ``DeviceStateManager`` (its client, table, clock,
    sleep, randomness and observer)."""

    def __init__(self, manager):
        self._m = manager

    @property
    def manager(self):
        return self._m

    # ------------------------------------------------------------- acquire

    def acquire(self, device_id: str, ttl_seconds: float = DEFAULT_TTL_SECONDS, wait_seconds: float = 0,
                owner: str | None = None) -> LeaseGrant:
        """Take a ticket, queue, and wait up to ``wait_seconds`` to reach the head and
        take the lease. ``LeaseBusy`` (ticket withdrawn) when the wait runs out;
        ``DeviceNotFound`` when there is no such device. ``wait_seconds`` is finite:
        a caller inside a Lambda caps it by its remaining time."""
        validate_device_id(device_id)
        ttl_seconds, wait_seconds = _check_ttl(ttl_seconds), float(wait_seconds)
        if not 0 <= wait_seconds <= MAX_TTL_SECONDS or math.isnan(wait_seconds):
            raise InvalidLease(f"wait_seconds must be from 0 to {MAX_TTL_SECONDS}")
        m = self._m
        device = m.live_state(device_id)
        if device is None:
            raise DeviceNotFound(device_id)
        since = device[table.CREATED_AT]["S"]  # rows of an earlier incarnation of the device do not count
        started = m.monotonic()
        deadline = started + wait_seconds
        # A resend after a lost answer may skip a ticket number: harmless, tickets need only go up.
        counter = Expression()
        ticket = int(m.store.send(
            "update_item", IDEMPOTENT,
            Key={table.PARTITION_KEY: {"S": device_id}, table.SORT_KEY: {"S": table.LEASE_COUNTER_SK}},
            UpdateExpression=f"ADD {counter.name(_TICKET)} {counter.number(1)}", **counter.attributes(),
            ReturnValues="UPDATED_NEW",
        )["Attributes"][_TICKET]["N"])
        secret = secrets.token_hex(16)
        lease_id = f"{ticket}.{secret}"
        row_refreshed = m.monotonic()
        self._put_row(device_id, ticket, secret, owner, ttl_seconds, m.clock() + min(ttl_seconds, WAITING_ROW_SECONDS),
                      first=True)
        try:
            while True:
                ahead = self._live_rows(device_id, since, below=ticket)
                holder_until = float(ahead[0][_UNTIL]["N"]) if ahead else None
                if not ahead:
                    taken, holder_until = self._take(device_id, ticket, secret, owner, ttl_seconds)
                    if taken is not None:
                        m.observer.lease_acquired(device_id, m.monotonic() - started)
                        return LeaseGrant(device_id, lease_id, ticket, taken, ttl_seconds)
                remaining = deadline - m.monotonic()
                if remaining <= 0:
                    m.observer.lease_busy(device_id)
                    raise LeaseBusy(device_id, holder_until, len(ahead))
                m.sleep(min(remaining, m.rng.uniform(*POLL_SECONDS)))
                if m.monotonic() - row_refreshed > WAITING_ROW_SECONDS / 2:
                    row_refreshed = m.monotonic()
                    self._put_row(device_id, ticket, secret, owner, ttl_seconds,
                                  m.clock() + min(ttl_seconds, WAITING_ROW_SECONDS))
        except BaseException as error:
            if isinstance(error, OutcomeUnknown):
                self._unseat(device_id, ticket)  # a take whose answer was lost may have landed
            try:
                self._withdraw(device_id, ticket, secret)
            except (StorageError, StorageUnavailable):
                pass  # the row runs out by itself; what the caller must hear is the first error
            raise

    def _take(self, device_id, ticket, secret, owner, ttl_seconds) -> tuple[float | None, float | None]:
        """At the head: record this ticket as the holder unless another lease is active.
        Returns (our expiry, None) or (None, the active holder's expiry)."""
        m = self._m
        now = m.clock()
        until = _ms(now + ttl_seconds)  # as stored
        expr = Expression()
        token, holder_until, ours = expr.name(table.LEASE_TOKEN), expr.name(table.LEASE_UNTIL), expr.number(ticket)
        condition = (f"{live(expr, _ms(now))} AND "
                     f"(attribute_not_exists({token}) OR {holder_until} <= {expr.number(_ms(now))} OR {token} = {ours})")
        update = (f"SET {token} = {ours}, {expr.name(table.LEASE_KEY)} = "
                  f"{expr.value({'S': lease_key(lease_token_of(secret))})}, {holder_until} = {expr.number(until)}")
        try:
            self._send_transaction(device_id, [
                {"Put": {"TableName": m.table_name, "Item": self._row(device_id, ticket, secret, owner, ttl_seconds, until),
                         **self._still_ours(secret)}},
                {"Update": {
                    "TableName": m.table_name, "Key": table.state_key(device_id),
                    "UpdateExpression": update, "ConditionExpression": condition, **expr.attributes(),
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }},
            ])
        except Cancelled as cancelled:
            reasons = cancelled.reasons + [{}, {}]
            if reasons[0].get("Code") == "ConditionalCheckFailed":  # our ticket was ended while we waited
                raise self._lost(device_id, f"{ticket}.{secret}") from None
            state = reasons[1]
            if state.get("Code") == "ConditionalCheckFailed":
                item = state.get("Item")
                if not table.is_live_state(item, m.clock()):
                    raise DeviceNotFound(device_id) from None
                return None, active_holder(item, m.clock())[1]
            if any(reason.get("Code") == "TransactionConflict" for reason in cancelled.reasons):
                return None, None  # someone else's heartbeat or write at that instant: poll again
            raise StorageError(f"lease transaction cancelled: {cancelled.reasons}") from None
        return until, None

    def _live_rows(self, device_id: str, since: str, below: int | None = None) -> list[dict]:
        """Live queue rows in ticket order (those before ticket ``below`` only, if given),
        strongly consistent and paginated; expired ones met on the way, and rows created
        before ``since`` (the device's creation: a deleted incarnation's queue), are deleted."""
        if below is not None and below <= 1:
            return []
        m = self._m
        now = m.clock()
        high = _sort_key(below - 1) if below is not None else table.LEASE_SK_PREFIX + "9" * (TICKET_DIGITS + 1)
        expr = Expression()
        request = {
            "TableName": m.table_name, "ConsistentRead": True,
            "KeyConditionExpression": (f"{expr.name(table.PARTITION_KEY)} = {expr.value({'S': device_id})} AND "
                                       f"{expr.name(table.SORT_KEY)} BETWEEN {expr.value({'S': _sort_key(0)})} AND "
                                       f"{expr.value({'S': high})}"),
            **expr.attributes(),
        }
        live, expired = [], []
        while True:
            page = m.store.send("query", **request)
            for row in page.get("Items", []):
                current = float(row[_UNTIL]["N"]) > now and row.get(_CREATED_AT, {}).get("S", since) >= since
                (live if current else expired).append(row)
            if "LastEvaluatedKey" not in page:
                break
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        for row in expired[:MAX_REAPED_PER_POLL]:
            self._reap(row, now, since)
        if expired:
            m.observer.lease_reclaimed(device_id, min(len(expired), MAX_REAPED_PER_POLL))
        return live

    def _reap(self, row: dict, now: float, since: str) -> None:
        """Delete an expired or stale row, unless its holder heartbeated it meanwhile."""
        m = self._m
        expr = Expression()
        condition = (f"{expr.name(_UNTIL)} <= {expr.number(_ms(now))} OR "
                     f"{expr.name(_CREATED_AT)} < {expr.value({'S': since})}")
        try:
            m.store.send("delete_item", IDEMPOTENT,
                         Key={table.PARTITION_KEY: row[table.PARTITION_KEY], table.SORT_KEY: row[table.SORT_KEY]},
                         ConditionExpression=condition, **expr.attributes())
        except Rejected:
            pass

    # ----------------------------------------------------- heartbeat, release

    def heartbeat(self, device_id: str, lease_id: str, ttl_seconds: float | None = None) -> LeaseGrant:
        """Extend a held lease by ``ttl_seconds`` (default: its own ttl) from now;
        ``LeaseLost`` when it expired, was released, or is not the holder."""
        validate_device_id(device_id)
        ticket, secret = parse_lease_id(lease_id)
        m = self._m
        key = _row_key(device_id, ticket)
        if ttl_seconds is None:
            row = m.store.get(key)
            if row is None or row.get(_SECRET, {}).get("S") != secret:
                raise self._lost(device_id, lease_id, row)
            ttl_seconds = float(row[_TTL]["N"])
        ttl_seconds = _check_ttl(ttl_seconds)
        now = m.clock()
        until = _ms(now + ttl_seconds)  # as stored
        row, held = Expression(), Expression()
        row_until, holder_until = row.name(_UNTIL), held.name(table.LEASE_UNTIL)
        try:
            self._transact(device_id, [
                {"Update": {
                    "TableName": m.table_name, "Key": key,
                    "UpdateExpression": (f"SET {row_until} = {row.number(until)}, {row.name(table.TTL_ATTRIBUTE)} = "
                                         f"{row.number(math.ceil(until))}, {row.name(_TTL)} = {row.number(ttl_seconds)}"),
                    "ConditionExpression": (f"{row.name(_SECRET)} = {row.value({'S': secret})} AND "
                                            f"{row_until} > {row.number(_ms(now))}"),
                    **row.attributes(),
                }},
                {"Update": {
                    "TableName": m.table_name, "Key": table.state_key(device_id),
                    "UpdateExpression": f"SET {holder_until} = {held.number(until)}",
                    "ConditionExpression": (f"{held.name(table.LEASE_TOKEN)} = {held.number(ticket)} AND "
                                            f"{holder_until} > {held.number(_ms(now))}"),
                    **held.attributes(),
                }},
            ])
        except Cancelled as cancelled:
            if any(reason.get("Code") == "ConditionalCheckFailed" for reason in cancelled.reasons):
                raise self._lost(device_id, lease_id) from None
            raise StorageUnavailable(f"lease heartbeat kept conflicting: {cancelled.reasons}") from None
        return LeaseGrant(device_id, lease_id, ticket, until, ttl_seconds)

    def release(self, device_id: str, lease_id: str) -> bool:
        """Give the lease (or a waiting ticket) back: the row goes and, if it held the
        lease, the holder is cleared so the next waiter proceeds at once. True when
        something was released, False when it was already gone."""
        validate_device_id(device_id)
        ticket, secret = parse_lease_id(lease_id)
        m = self._m
        try:
            self._transact(device_id, [
                {"Delete": self._delete_own_row(device_id, ticket, secret)},
                {"Update": self._clear_holder(device_id, ticket)},
            ])
            return True
        except Cancelled as cancelled:
            row_reason, state_reason = (cancelled.reasons + [{}, {}])[:2]
            if row_reason.get("Code") == "ConditionalCheckFailed":
                if self._never_issued(device_id, lease_id, m.store.get(_row_key(device_id, ticket))):
                    raise UnknownLease(device_id, lease_id) from None
                return False  # released, reaped, or expired already
            if state_reason.get("Code") != "ConditionalCheckFailed":
                raise StorageUnavailable(f"lease release kept conflicting: {cancelled.reasons}") from None
        return self._withdraw(device_id, ticket, secret)  # a waiting ticket, or a holder already superseded

    def end(self, device_id: str, fencing_token: int) -> bool:
        """End the lease or waiting ticket ``fencing_token`` whoever holds it (no secret: the
        caller decides who may). The row goes and, if it held the lease, the holder is cleared
        in the same transaction, so the fence opens at once; the holder's next heartbeat is
        ``LeaseLost`` and its Lease-Token opens nothing. True when something was ended, False
        when it had already ended; ``UnknownLease`` for a ticket never drawn.

        Every condition names this ticket, so a resend after a lost answer (the store's, or a
        caller's retry) can never end a lease taken after it."""
        validate_device_id(device_id)
        ticket = int(fencing_token)
        if not 1 <= ticket < 10 ** TICKET_DIGITS:
            raise InvalidLease(f"{fencing_token!r} is not a fencing token this service issued")
        m = self._m
        key = _row_key(device_id, ticket)
        clear_holder = self._clear_holder(device_id, ticket)
        drawn = Expression()
        delete_row = {"TableName": m.table_name, "Key": key,
                      "ConditionExpression": f"attribute_exists({drawn.name(_TICKET)})", **drawn.attributes()}
        try:
            self._transact(device_id, [{"Delete": delete_row}, {"Update": clear_holder}])
            return True
        except Cancelled as cancelled:
            row_reason, state_reason = (cancelled.reasons + [{}, {}])[:2]
            row_gone = row_reason.get("Code") == "ConditionalCheckFailed"
            not_holder = state_reason.get("Code") == "ConditionalCheckFailed"
            if not (row_gone or not_holder):
                raise StorageUnavailable(f"ending a lease kept conflicting: {cancelled.reasons}") from None
        try:
            if not row_gone:  # a waiting ticket, or a holder already superseded: its row only
                m.store.send("delete_item", IDEMPOTENT, **delete_row)
                return True
            if not not_holder:  # the holder's row went (reaped at its expiry) but the item still names it
                m.store.send("update_item", IDEMPOTENT, **clear_holder)
                return True
        except Rejected:
            return False  # ended meanwhile
        if not self._drawn(device_id, ticket):
            raise UnknownLease(device_id, str(ticket))
        return False

    def _unseat(self, device_id: str, ticket: int) -> None:
        """Clear the holder if it is this ticket (best effort): nobody else knows its lease id,
        so a take that landed unanswered would otherwise lock the device for its whole ttl."""
        try:
            self._m.store.send("update_item", IDEMPOTENT, **self._clear_holder(device_id, ticket))
        except (Rejected, StorageError, StorageUnavailable):
            pass  # not the holder, or DynamoDB still silent: then the lease ends at its expiry

    def _withdraw(self, device_id: str, ticket: int, secret: str) -> bool:
        try:
            self._m.store.send("delete_item", IDEMPOTENT, **self._delete_own_row(device_id, ticket, secret))
            return True
        except Rejected:
            return False

    def _delete_own_row(self, device_id: str, ticket: int, secret: str) -> dict:
        """Deleting a queue row, only if it is still the one issued with ``secret``."""
        return {"TableName": self._m.table_name, "Key": _row_key(device_id, ticket), **self._still_ours(secret)}

    def _clear_holder(self, device_id: str, ticket: int) -> dict:
        """Clearing the lease holder from the state item, only if it is ``ticket``."""
        expr = Expression()
        holder = ", ".join(expr.name(attribute) for attribute in (table.LEASE_TOKEN, table.LEASE_KEY,
                                                                  table.LEASE_UNTIL))
        return {"TableName": self._m.table_name, "Key": table.state_key(device_id),
                "UpdateExpression": f"REMOVE {holder}",
                "ConditionExpression": f"{expr.name(table.LEASE_TOKEN)} = {expr.number(ticket)}", **expr.attributes()}

    def status(self, device_id: str) -> LeaseStatus:
        """The active holder (from the state item) and how many live tickets wait behind it."""
        state = self._m.live_state(device_id)
        if state is None:
            raise DeviceNotFound(device_id)
        token, until = active_holder(state, self._m.clock())
        rows = self._live_rows(device_id, state[table.CREATED_AT]["S"])
        holder_row = next((row for row in rows if token is not None and int(row[_TICKET]["N"]) == token), None)
        owner = holder_row.get(_OWNER, {}).get("S") if holder_row else None
        queue = tuple((int(row[_TICKET]["N"]), row.get(_OWNER, {}).get("S")) for row in rows if row is not holder_row)
        return LeaseStatus(token, until, owner, len(queue), queue)

    # ------------------------------------------------------------ internals

    def _row(self, device_id, ticket, secret, owner, ttl_seconds, until) -> dict:
        row = {
            **_row_key(device_id, ticket),
            _TICKET: number(ticket), _SECRET: {"S": secret}, _TTL: number(ttl_seconds),
            _CREATED_AT: {"S": timestamp(self._m.clock())},
            _UNTIL: number(until), table.TTL_ATTRIBUTE: number(math.ceil(until)),
        }
        if owner:
            row[_OWNER] = {"S": owner}
        return row

    def _put_row(self, device_id, ticket, secret, owner, ttl_seconds, until, first: bool = False) -> None:
        """Put a waiting row: the first time as new, then only while it is still ours (not
        ended by ``end``, nor reaped after a pause): else ``LeaseLost``."""
        m = self._m
        try:
            m.store.send("put_item", IDEMPOTENT, Item=self._row(device_id, ticket, secret, owner, ttl_seconds, until),
                         **({} if first else self._still_ours(secret)))
        except Rejected:
            raise self._lost(device_id, f"{ticket}.{secret}") from None

    @staticmethod
    def _still_ours(secret: str) -> dict:
        """The condition that a queue row is still the one issued with ``secret``."""
        expr = Expression()
        return {"ConditionExpression": f"{expr.name(_SECRET)} = {expr.value({'S': secret})}", **expr.attributes()}

    def _transact(self, device_id: str, items: list[dict], attempts: int = 8) -> None:
        """TransactWriteItems, tried again after a TransactionConflict (another request on
        the same items at that instant, e.g. a waiter taking the lease), which is not an
        answer. Other cancellations are raised for the caller to read."""
        m = self._m
        for attempt in range(1, attempts + 1):
            try:
                self._send_transaction(device_id, items)
                return
            except Cancelled as cancelled:
                codes = {reason.get("Code") for reason in cancelled.reasons}
                if "ConditionalCheckFailed" in codes or "TransactionConflict" not in codes or attempt == attempts:
                    raise
            m.sleep(m.backoff.delay(attempt, m.rng))

    def _send_transaction(self, device_id: str, items: list[dict]) -> None:
        """One TransactWriteItems; its ClientRequestToken makes the store's resend after a
        lost answer safe. An answer that never comes is an unknown outcome, not a refusal."""
        try:
            self._m.store.send("transact_write_items", IDEMPOTENT, ClientRequestToken=uuid.uuid4().hex,
                               TransactItems=items)
        except Ambiguous as lost:
            self._m.observer.outcome_unknown(device_id)
            raise OutcomeUnknown(device_id, str(lost)) from None

    def _lost(self, device_id: str, lease_id: str, row: dict | None = None) -> Exception:
        """``LeaseLost`` for a lease that was issued and has ended; ``UnknownLease`` for one
        that never was (its row has another secret, or its ticket was never drawn)."""
        if row is None:
            row = self._m.store.get(_row_key(device_id, parse_lease_id(lease_id)[0]))
        if self._never_issued(device_id, lease_id, row):
            return UnknownLease(device_id, lease_id)
        self._m.observer.lease_lost(device_id)
        return LeaseLost(device_id, lease_id)

    def _never_issued(self, device_id: str, lease_id: str, row: dict | None) -> bool:
        ticket, secret = parse_lease_id(lease_id)
        if row is not None:
            return row.get(_SECRET, {}).get("S") != secret
        return not self._drawn(device_id, ticket)

    def _drawn(self, device_id: str, ticket: int) -> bool:
        """Whether the device's counter has reached ``ticket``."""
        counter = self._m.store.get({table.PARTITION_KEY: {"S": device_id},
                                     table.SORT_KEY: {"S": table.LEASE_COUNTER_SK}})
        return ticket <= (int(counter[_TICKET]["N"]) if counter else 0)


def _check_ttl(ttl_seconds) -> float:
    try:
        ttl = float(ttl_seconds)
    except (TypeError, ValueError):
        raise InvalidLease("ttl_seconds must be a number") from None
    if not 1 <= ttl <= MAX_TTL_SECONDS:
        raise InvalidLease(f"ttl_seconds must be from 1 to {MAX_TTL_SECONDS}")
    return ttl


class Lease:
    """One caller's lease on a device. As a context manager it acquires, heartbeats on a
    background thread every ttl/2 and releases on exit (also on an exception); or call
    ``acquire()``, ``heartbeat()`` and ``release()`` yourself. ``manager`` writes to the
    device under this lease's fencing token and refuses once the lease is lost."""

    def __init__(self, queue: LeaseQueue, device_id: str, ttl_seconds: float, wait_seconds: float,
                 owner: str | None):
        self._queue = queue
        self.device_id = device_id
        self.ttl_seconds = _check_ttl(ttl_seconds)
        self.wait_seconds = wait_seconds
        self.owner = owner
        self.grant: LeaseGrant | None = None
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lease_id(self) -> str | None:
        return self.grant.lease_id if self.grant else None

    @property
    def fencing_token(self) -> int | None:
        return self.grant.fencing_token if self.grant else None

    @property
    def lease_token(self) -> str | None:
        return self.grant.lease_token if self.grant else None

    @property
    def expires_at(self) -> float | None:
        return self.grant.expires_at if self.grant else None

    @property
    def manager(self):
        """The device-state manager, fenced by this lease."""
        return self._queue.manager.fenced({self.device_id: self})

    def lease_token_if_held(self) -> str:
        if self.grant is None or self.lost or self._queue.manager.clock() >= self.grant.expires_at:
            raise LeaseLost(self.device_id, self.lease_id or "(not acquired)")
        return self.grant.lease_token

    def acquire(self) -> "Lease":
        self.grant = self._queue.acquire(self.device_id, self.ttl_seconds, self.wait_seconds, self.owner)
        self.lost = False
        return self

    def heartbeat(self) -> "Lease":
        if self.grant is None:
            raise LeaseLost(self.device_id, "(not acquired)")
        try:
            self.grant = self._queue.heartbeat(self.device_id, self.grant.lease_id, self.ttl_seconds)
        except LeaseLost:
            self.lost = True
            raise
        return self

    def release(self) -> bool:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        if self.grant is None:
            return False
        released = self._queue.release(self.device_id, self.grant.lease_id)
        self.lost = True  # nothing may be written under it any more
        return released

    def __enter__(self) -> "Lease":
        self.acquire()
        self._stop.clear()
        self._thread = threading.Thread(target=self._heartbeat_loop, name=f"lease-{self.device_id}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def _heartbeat_loop(self) -> None:
        """Heartbeat at ttl/2; a failed heartbeat (storage trouble) is tried again sooner,
        and the lease counts as lost once it is refused or its expiry has passed."""
        interval = self.ttl_seconds / 2
        while not self._stop.wait(interval):
            try:
                self.heartbeat()
                interval = self.ttl_seconds / 2
            except LeaseLost:
                return
            except (StorageError, StorageUnavailable, OutcomeUnknown):  # try again sooner
                if self._queue.manager.clock() >= self.grant.expires_at:
                    self.lost = True
                    self._queue.manager.observer.lease_lost(self.device_id)
                    return
                interval = max(0.05, min(interval / 2, self.grant.expires_at - self._queue.manager.clock()) / 2)
