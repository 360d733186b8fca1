"""Device leases: a FIFO lock per device with heartbeats, fencing tokens and TTL clean-up.

In the device's partition:

- ``sk = "lease-counter"``: the ticket counter. ``ADD`` creates it on first use
  atomically, so there is no create race to handle; it never expires, so tickets (the
  fencing tokens) only ever go up, even across a delete and re-create of the device.
- ``sk = "lease#<ticket, 38 digits>"``: one queue row per ticket, sorted by ticket, with
  ``secret``, ``owner``, ``ttlSeconds``, ``createdAt``, ``until`` (epoch seconds to the
  millisecond) and ``expiresAt`` (whole seconds, the TTL backstop). A row whose ``until``
  has passed is ignored at once and deleted when a waiter meets it.
- On the state item, ``leaseToken`` and ``leaseUntil`` name the active holder, and
  ``leaseLast`` the last ticket granted (kept when the lease ends and across a delete). They are
  what fences writes (see ``item/fencing.py``): the queue gives the order, the
  state item's condition gives mutual exclusion, so even two waiters that both believe
  they are at the head cannot both hold the lease.

A waiter is at the head when no live row with a lower ticket exists; it then takes the
lease with one transaction (its row refreshed, the holder recorded on the state item
under the condition that no other lease is active and no later ticket was granted:
``leaseLast``). Heartbeats extend both in one transaction; release deletes the row and
clears the holder in one transaction.

A ticket is drawn before its row is put, so a later ticket may look at the queue in
between, find it empty and take the lease: the earlier waiter's take is then refused
(``LeaseOvertaken``) and it queues again under a new ticket (``_requeue``), so fencing
tokens go up in the order leases are granted.

Anyone the caller trusts to do so (the API: a back-end with the write right) may *end* a
lease or a waiting ticket by its fencing token alone (``end``): the same transaction as a
release, without the secret. A waiter refreshes its row only while the row is still the one
it put, so an ended waiting ticket stops waiting (``LeaseLost``) rather than coming back.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import uuid
from dataclasses import dataclass, replace

from .. import table
from ..errors import (
    ConditionNotMet,
    CredentialRevoked,
    DeviceLocked,
    DeviceNotFound,
    InvalidLease,
    LeaseBusy,
    LeaseLost,
    LeaseNotHeld,
    LeaseOvertaken,
    OutcomeUnknown,
    RetriesExhausted,
    StorageError,
    StorageUnavailable,
    UnknownLease,
)
from ..item import schema
from ..item.credentials import Holder
from ..item.fencing import active_holder, lease_instant
from ..model.times import stored_time, timestamp
from ..model.values import validate_device_id
from ..runtime import NULL_OBSERVER
from ..write.expressions import Expression, number
from ..write.outcomes import Moved, Refusals
from ..write.pipeline import WritePipeline
from ..write.retry import RetryLoop
from ..write.store import IDEMPOTENT
from .limits import DEFAULT_TTL_SECONDS, MAX_OWNER_CHARS, MAX_TTL_SECONDS, TICKET_DIGITS

# A waiting row lives this long past each poll, so a crashed waiter stops blocking the
# queue soon after it stops polling (a holder's row lives for its ttl).
WAITING_ROW_SECONDS = 5.0
POLL_SECONDS = (0.02, 0.2)  # a waiter polls at a uniformly jittered interval in this range
MAX_REAPED_PER_POLL = 25  # expired rows deleted by one poll at most; TTL does the rest

_SECRET = "secret"
_OWNER = "owner"
_TICKET = "ticket"
_TTL = "ttlSeconds"
_UNTIL = "until"
_CREATED_AT = "createdAt"
ROW = "row"  # a lease change's queue-row part beside the holder's change (``send_together``)


def _sort_key(ticket: int) -> str:
    return f"{table.LEASE_SK_PREFIX}{ticket:0{TICKET_DIGITS}d}"


def _row_key(device_id: str, ticket: int) -> dict:
    return {schema.PARTITION_KEY: {"S": device_id}, schema.SORT_KEY: {"S": _sort_key(ticket)}}


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


class LeaseQueue:
    """The lease protocol on a write pipeline: its store for the queue rows and the ticket
    counter, and its planner and sends for every change of the holder on the state item."""

    CONFLICT_ATTEMPTS = 8  # a lease transaction meeting a TransactionConflict is tried again this often
    CONFLICT_BUDGET_SECONDS = 5.0

    def __init__(self, pipeline: WritePipeline):
        self._pipeline = pipeline
        self._store = pipeline.store
        self._runtime = pipeline.runtime

    @property
    def runtime(self):
        return self._runtime

    # ------------------------------------------------------------- acquire

    def acquire(self, device_id: str, ttl_seconds: float = DEFAULT_TTL_SECONDS, wait_seconds: float = 0,
                owner: str | None = None, credential: Holder | None = None) -> LeaseGrant:
        """Take a ticket, queue, and wait up to ``wait_seconds`` to reach the head and
        take the lease. ``LeaseBusy`` (ticket withdrawn) when the wait runs out;
        ``DeviceNotFound`` when there is no such device. ``wait_seconds`` is finite:
        a caller inside a Lambda caps it by its remaining time. ``credential``: the device's
        own request, which takes the lease only while the device holds it (in the take's
        condition: ``CredentialRevoked`` for one revoked during the wait)."""
        validate_device_id(device_id)
        ttl_seconds = check_ttl(ttl_seconds)
        try:
            waits = not isinstance(wait_seconds, bool) and 0 <= wait_seconds <= MAX_TTL_SECONDS  # NaN: False
        except (TypeError, ArithmeticError):  # text, None; a Decimal NaN
            waits = False
        if not waits:
            raise InvalidLease(f"wait_seconds must be a number from 0 to {MAX_TTL_SECONDS}")
        wait_seconds = float(wait_seconds)
        if owner is not None and (not isinstance(owner, str) or not 1 <= len(owner) <= MAX_OWNER_CHARS):
            raise InvalidLease(f"owner must be text of 1 to {MAX_OWNER_CHARS} characters")
        runtime = self._runtime
        started = runtime.monotonic()
        deadline = started + wait_seconds  # from the call: a slow first read spends the wait too
        device = self._store.get_live_state(device_id, runtime.clock())
        if credential is not None:
            credential.check(device_id, device, runtime.clock())
        if device is None:
            raise DeviceNotFound(device_id)
        created = device[schema.CREATED_AT]  # the incarnation queued on: only it can be taken
        since = stored_time(created)  # rows of an earlier incarnation of the device do not count
        ticket = self._draw(device_id)
        secret = secrets.token_hex(16)
        lease_id = f"{ticket}.{secret}"
        # A waiting row lives no longer than the lease would (a dead waiter holds the queue up no
        # longer than a dead holder), refreshed at each half of its life: a poll's sleep ends then.
        row_seconds = min(ttl_seconds, WAITING_ROW_SECONDS)
        refresh_at = runtime.monotonic() + row_seconds / 2
        waiting_until = lambda: runtime.clock() + row_seconds  # noqa: E731
        self._put_row(device_id, ticket, secret, owner, ttl_seconds, waiting_until(), first=True)
        try:
            while True:
                ahead = self._live_rows(device_id, since, below=ticket)
                holder_until = float(ahead[0][_UNTIL]["N"]) if ahead else None
                if not ahead:
                    try:
                        taken, holder_until = self._take(device_id, ticket, secret, owner, ttl_seconds, created,
                                                         credential)
                    except LeaseOvertaken:  # our row was put after a later ticket looked and took the lease
                        ticket = self._requeue(device_id, ticket, secret, owner, ttl_seconds, waiting_until())
                        lease_id = f"{ticket}.{secret}"
                        refresh_at = runtime.monotonic() + row_seconds / 2
                        continue
                    if taken is not None:
                        runtime.observer.lease_acquired(device_id, runtime.monotonic() - started)
                        return LeaseGrant(device_id, lease_id, ticket, taken, ttl_seconds)
                remaining = deadline - runtime.monotonic()
                if remaining <= 0:
                    runtime.observer.lease_busy(device_id)
                    raise LeaseBusy(device_id, holder_until, len(ahead))
                runtime.sleep(max(0.0, min(remaining, runtime.rng.uniform(*POLL_SECONDS),
                                           refresh_at - runtime.monotonic())))
                if runtime.monotonic() >= refresh_at:
                    refresh_at = runtime.monotonic() + row_seconds / 2
                    if self._incarnation(device_id) != since:  # deleted meanwhile: its queue ended with it
                        raise DeviceNotFound(device_id)
                    self._put_row(device_id, ticket, secret, owner, ttl_seconds, waiting_until())
        except BaseException as error:
            if isinstance(error, OutcomeUnknown):
                self._unseat(device_id, ticket)  # a take whose answer was lost may have landed
            try:
                self._withdraw(device_id, ticket, secret)
            except (StorageError, StorageUnavailable):
                pass  # the row runs out by itself; what the caller must hear is the first error
            raise

    def _incarnation(self, device_id: str) -> str:
        """When the device as it is now was created (the queue rows of an earlier one do not count):
        ``DeviceNotFound`` once it is deleted."""
        device = self._store.get_live_state(device_id, self._runtime.clock())
        if device is None:
            raise DeviceNotFound(device_id)
        return stored_time(device[schema.CREATED_AT])

    def _draw(self, device_id: str) -> int:
        """The next ticket. A resend after a lost answer may skip a number: harmless, tickets
        need only go up."""
        counter = Expression()
        return int(self._store.send(
            "update_item", IDEMPOTENT,
            Key={schema.PARTITION_KEY: {"S": device_id}, schema.SORT_KEY: {"S": table.LEASE_COUNTER_SK}},
            UpdateExpression=f"ADD {counter.name(_TICKET)} {counter.number(1)}", **counter.attributes(),
            ReturnValues="UPDATED_NEW",
        )["Attributes"][_TICKET]["N"])

    def _requeue(self, device_id, ticket, secret, owner, ttl_seconds, until) -> int:
        """An overtaken waiter's row swapped for one under a fresh ticket, behind every ticket
        granted, in one transaction under a ClientRequestToken: the store's resend after a lost
        answer whose first copy landed is dropped, not refused as if the old row had been ended.
        ``LeaseLost`` when it was (``end``); the ticket drawn for it then goes unused."""
        new = self._draw(device_id)
        swap = [{"Delete": self._delete_own_row(device_id, ticket, secret)},
                {"Put": {"TableName": self._store.table_name,
                         "Item": self._row(device_id, new, secret, owner, ttl_seconds, until)}}]
        try:
            self._transact(device_id, lambda planner: (new, None, swap))  # tried again after a conflict
        except Refusals as refused:
            if ROW in refused.refused:
                raise self._lost(device_id, f"{ticket}.{secret}") from None
            raise
        except (OutcomeUnknown, StorageError, StorageUnavailable):  # AnswerLost among them: it may have landed
            try:
                self._withdraw(device_id, new, secret)  # the caller withdraws the old row
            except (StorageError, StorageUnavailable):
                pass  # the row runs out by itself; what the caller must hear is the first error
            raise
        return new

    def _take(self, device_id, ticket, secret, owner, ttl_seconds, created: dict,
              credential: Holder | None = None) -> tuple[float | None, float | None]:
        """At the head: record this ticket as the holder unless another lease is active.
        Returns (our expiry, None) or (None, the active holder's expiry, if any);
        ``LeaseOvertaken`` when a later ticket was granted first; ``DeviceNotFound`` when the
        device the ticket queued on (created at ``created``) was deleted, even if created again."""
        planner = self._pipeline.planner(seen_by=device_id if credential else None, holder=credential)
        until = lease_instant(planner.now + ttl_seconds)  # as stored
        row = {"Put": {"TableName": self._store.table_name,
                       "Item": self._row(device_id, ticket, secret, owner, ttl_seconds, until),
                       **self._still_ours(secret)}}
        try:
            self._pipeline.send_together(planner, [planner.take_lease(device_id, ticket, lease_token_of(secret),
                                                                      until, created)], {ROW: [row]}, uuid.uuid4().hex)
        except Refusals as refused:
            if ROW in refused.refused:  # our ticket was ended while we waited
                raise self._lost(device_id, f"{ticket}.{secret}") from None
            [item] = refused.items
            if item is not None and item.get(schema.CREATED_AT) not in (None, created):
                raise DeviceNotFound(device_id) from None  # created again: the queue it waited in ended
            if isinstance(refused.refusal, DeviceLocked):
                return None, refused.refusal.lease_expires_at
            if refused.refusal is not None:
                raise refused.refusal from None  # DeviceNotFound, LeaseOvertaken
            return None, None  # someone else's heartbeat or write at that instant: poll again
        return until, None

    def _live_rows(self, device_id: str, since: str, below: int | None = None) -> list[dict]:
        """Live queue rows in ticket order (those before ticket ``below`` only, if given),
        strongly consistent and paginated; expired ones met on the way, and rows created
        before ``since`` (the device's creation: a deleted incarnation's queue), are deleted."""
        if below is not None and below <= 1:
            return []
        now = self._runtime.clock()
        high = _sort_key(below - 1) if below is not None else table.LEASE_SK_PREFIX + "9" * (TICKET_DIGITS + 1)
        expr = Expression()
        rows = self._store.query_all({
            "ConsistentRead": True,
            "KeyConditionExpression": (f"{expr.name(schema.PARTITION_KEY)} = {expr.value({'S': device_id})} AND "
                                       f"{expr.name(schema.SORT_KEY)} BETWEEN {expr.value({'S': _sort_key(0)})} AND "
                                       f"{expr.value({'S': high})}"),
            **expr.attributes(),
        })
        live, expired = [], []
        for row in rows:
            current = float(row[_UNTIL]["N"]) > now and row.get(_CREATED_AT, {}).get("S", since) >= since
            (live if current else expired).append(row)
        for row in expired[:MAX_REAPED_PER_POLL]:
            self._reap(row, now, since)
        if expired:
            self._runtime.observer.lease_reclaimed(device_id, min(len(expired), MAX_REAPED_PER_POLL))
        return live

    def _reap(self, row: dict, now: float, since: str) -> None:
        """Delete an expired or stale row, unless its holder heartbeated it meanwhile."""
        expr = Expression()
        condition = (f"{expr.name(_UNTIL)} <= {expr.number(lease_instant(now))} OR "
                     f"{expr.name(_CREATED_AT)} < {expr.value({'S': since})}")
        try:
            self._store.send("delete_item", IDEMPOTENT,
                             Key={schema.PARTITION_KEY: row[schema.PARTITION_KEY], schema.SORT_KEY: row[schema.SORT_KEY]},
                             ConditionExpression=condition, **expr.attributes())
        except ConditionNotMet:
            pass

    # ----------------------------------------------------- heartbeat, release

    def heartbeat(self, device_id: str, lease_id: str, ttl_seconds: float | None = None,
                  credential: Holder | None = None) -> LeaseGrant:
        """Extend a held lease by ``ttl_seconds`` (default: its own ttl) from now;
        ``LeaseLost`` when it expired, was released, or is not the holder. ``credential``: the
        device's own request, which extends it only while the device holds the credential (in
        the write's condition: ``CredentialRevoked``)."""
        validate_device_id(device_id)
        ticket, secret = parse_lease_id(lease_id)
        key = _row_key(device_id, ticket)
        if ttl_seconds is None:
            row = self._store.get(key)
            if row is None or row.get(_SECRET, {}).get("S") != secret:
                if credential is not None:  # what a revoked credential hears first, on this path too
                    credential.check(device_id, self._store.get_state(device_id), self._runtime.clock())
                raise self._lost(device_id, lease_id, row)
            ttl_seconds = float(row[_TTL]["N"])
        ttl_seconds = check_ttl(ttl_seconds)

        def extend(planner):
            until = lease_instant(planner.now + ttl_seconds)  # as stored
            row = Expression()
            row_until = row.name(_UNTIL)
            extend_row = {"Update": {
                "TableName": self._store.table_name, "Key": key,
                "UpdateExpression": (f"SET {row_until} = {row.number(until)}, {row.name(schema.TTL_ATTRIBUTE)} = "
                                     f"{row.number(math.ceil(until))}, {row.name(_TTL)} = {row.number(ttl_seconds)}"),
                "ConditionExpression": (f"{row.name(_SECRET)} = {row.value({'S': secret})} AND "
                                        f"{row_until} > {row.number(lease_instant(planner.now))}"),
                **row.attributes(),
            }}
            return until, planner.extend_lease(device_id, ticket, until), [extend_row]

        try:
            until = self._transact(device_id, extend, credential)
        except Refusals as refused:  # the holder or the row refused: the lease is no longer held
            _check_credential(device_id, refused, credential, self._runtime.clock())
            raise self._lost(device_id, lease_id) from None
        return LeaseGrant(device_id, lease_id, ticket, until, ttl_seconds)

    def release(self, device_id: str, lease_id: str, credential: Holder | None = None) -> bool:
        """Give the lease (or a waiting ticket) back: the row goes and, if it held the
        lease, the holder is cleared so the next waiter proceeds at once. True when
        something was released, False when it was already gone. ``credential``: the device's own
        request, which releases only while the device holds the credential (in the write's
        condition: ``CredentialRevoked``)."""
        validate_device_id(device_id)
        ticket, secret = parse_lease_id(lease_id)
        delete_row = {"Delete": self._delete_own_row(device_id, ticket, secret)}
        try:
            self._transact(device_id, lambda planner: (True, planner.clear_lease(device_id, ticket), [delete_row]),
                           credential)
            return True
        except Refusals as refused:
            _check_credential(device_id, refused, credential, self._runtime.clock())
            if ROW in refused.refused:
                if self._never_issued(device_id, lease_id, self._store.get(_row_key(device_id, ticket))):
                    raise UnknownLease(device_id, lease_id) from None
                return False  # released, reaped, or expired already
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
        drawn = Expression()
        delete_row = {"TableName": self._store.table_name, "Key": _row_key(device_id, ticket),
                      "ConditionExpression": f"attribute_exists({drawn.name(_TICKET)})", **drawn.attributes()}
        try:
            self._transact(device_id, lambda planner: (True, planner.clear_lease(device_id, ticket),
                                                       [{"Delete": delete_row}]))
            return True
        except Refusals as refused:
            row_gone, not_holder = ROW in refused.refused, refused.refusal is not None
        try:
            if not row_gone:  # a waiting ticket, or a holder already superseded: its row only
                self._store.send("delete_item", IDEMPOTENT, **delete_row)
                return True
            if not not_holder:  # the holder's row went (reaped at its expiry) but the item still names it
                self._clear_holder(device_id, ticket)
                return True
        except (ConditionNotMet, LeaseNotHeld):
            return False  # ended meanwhile
        if not self._drawn(device_id, ticket):
            raise UnknownLease(device_id, str(ticket))
        return False

    def _unseat(self, device_id: str, ticket: int) -> None:
        """Clear the holder if it is this ticket (best effort): nobody else knows its lease id,
        so a take that landed unanswered would otherwise lock the device for its whole ttl."""
        try:
            self._clear_holder(device_id, ticket)
        except (LeaseNotHeld, StorageError, StorageUnavailable, OutcomeUnknown):
            pass  # not the holder, or DynamoDB still silent: then the lease ends at its expiry

    def _clear_holder(self, device_id: str, ticket: int) -> None:
        """Clear the holder from the state item if it is ``ticket``; ``LeaseNotHeld`` if not."""
        planner = self._pipeline.planner()
        self._pipeline.send(planner, planner.clear_lease(device_id, ticket))

    def _withdraw(self, device_id: str, ticket: int, secret: str) -> bool:
        try:
            self._store.send("delete_item", IDEMPOTENT, **self._delete_own_row(device_id, ticket, secret))
            return True
        except ConditionNotMet:
            return False

    def _delete_own_row(self, device_id: str, ticket: int, secret: str) -> dict:
        """Deleting a queue row, only if it is still the one issued with ``secret``."""
        return {"TableName": self._store.table_name, "Key": _row_key(device_id, ticket), **self._still_ours(secret)}

    def status(self, device_id: str, credential: Holder | None = None) -> LeaseStatus:
        """The active holder (from the state item) and how many live tickets wait behind it.
        ``credential``: the device's own read, checked on its state item (``Holder.check``)."""
        validate_device_id(device_id)
        now = self._runtime.clock()
        state = self._store.get_live_state(device_id, now)
        if credential is not None:
            credential.check(device_id, state, now)
        if state is None:
            raise DeviceNotFound(device_id)
        token, until = active_holder(state, now)
        rows = self._live_rows(device_id, stored_time(state[schema.CREATED_AT]))
        holder_row = next((row for row in rows if token is not None and int(row[_TICKET]["N"]) == token), None)
        owner = holder_row.get(_OWNER, {}).get("S") if holder_row else None
        queue = tuple((int(row[_TICKET]["N"]), row.get(_OWNER, {}).get("S")) for row in rows if row is not holder_row)
        return LeaseStatus(token, until, owner, len(queue), queue)

    # ------------------------------------------------------------ internals

    def _row(self, device_id, ticket, secret, owner, ttl_seconds, until) -> dict:
        row = {
            **_row_key(device_id, ticket),
            _TICKET: number(ticket), _SECRET: {"S": secret}, _TTL: number(ttl_seconds),
            _CREATED_AT: {"S": timestamp(self._runtime.clock())},
            _UNTIL: number(until), schema.TTL_ATTRIBUTE: number(math.ceil(until)),
        }
        if owner:
            row[_OWNER] = {"S": owner}
        return row

    def _put_row(self, device_id, ticket, secret, owner, ttl_seconds, until, first: bool = False) -> None:
        """Put a waiting row: the first time as new, then only while it is still ours (not
        ended by ``end``, nor reaped after a pause): else ``LeaseLost``. The first put is a
        transaction of one item under a ClientRequestToken, so that the store's resend after a
        lost answer whose first copy landed is dropped by DynamoDB, not a second put bringing back
        a row a back-end ended in between (a plain put's condition cannot tell "never put" from
        "put and ended"); it bills 2 write units where the put billed 1."""
        row = self._row(device_id, ticket, secret, owner, ttl_seconds, until)
        try:
            if first:
                self._pipeline.send_together(self._pipeline.planner(), [], {ROW: [
                    {"Put": {"TableName": self._store.table_name, "Item": row}}]}, uuid.uuid4().hex)
            else:
                self._store.send("put_item", IDEMPOTENT, Item=row, **self._still_ours(secret))
        except (ConditionNotMet, Refusals):  # Refusals: a back-end ending the row at that very instant
            raise self._lost(device_id, f"{ticket}.{secret}") from None

    @staticmethod
    def _still_ours(secret: str) -> dict:
        """The condition that a queue row is still the one issued with ``secret``."""
        expr = Expression()
        return {"ConditionExpression": f"{expr.name(_SECRET)} = {expr.value({'S': secret})}", **expr.attributes()}

    def _transact(self, device_id: str, plan, credential: Holder | None = None):
        """One holder change (or none) and its queue-row items in one transaction, planned afresh
        (``plan(planner)`` → (result, planned holder change or None, row items)) and tried again
        after a TransactionConflict (another request on the same items at that instant, e.g.
        a waiter taking the lease), which is not an answer. Returns the plan's result;
        ``Refusals`` when a condition failed; ``StorageUnavailable`` when conflicts persist."""

        def attempt(_item, _number):
            planner = self._pipeline.planner(seen_by=device_id if credential else None, holder=credential)
            result, planned, rows = plan(planner)
            try:
                self._pipeline.send_together(planner, [planned] if planned else [], {ROW: rows}, uuid.uuid4().hex)
            except Refusals as refused:
                if refused.conflict and refused.refusal is None and not refused.refused:
                    raise Moved(None, reason="conflict") from None
                raise
            return result

        # Conflicts between lease requests are no update's contention: not observed as such.
        loop = RetryLoop(self.CONFLICT_ATTEMPTS, self.CONFLICT_BUDGET_SECONDS,
                         replace(self._runtime, observer=NULL_OBSERVER))
        try:
            return loop.run(device_id, attempt, None, count_success=False)
        except RetriesExhausted:
            raise StorageUnavailable(f"the lease transaction on {device_id} kept meeting other requests; "
                                     "nothing was written") from None

    def _lost(self, device_id: str, lease_id: str, row: dict | None = None) -> Exception:
        """``LeaseLost`` for a lease that was issued and has ended; ``UnknownLease`` for one
        that never was (its row has another secret, or its ticket was never drawn)."""
        if row is None:
            row = self._store.get(_row_key(device_id, parse_lease_id(lease_id)[0]))
        if self._never_issued(device_id, lease_id, row):
            return UnknownLease(device_id, lease_id)
        self._runtime.observer.lease_lost(device_id)
        return LeaseLost(device_id, lease_id)

    def _never_issued(self, device_id: str, lease_id: str, row: dict | None) -> bool:
        ticket, secret = parse_lease_id(lease_id)
        if row is not None:
            return row.get(_SECRET, {}).get("S") != secret
        return not self._drawn(device_id, ticket)

    def _drawn(self, device_id: str, ticket: int) -> bool:
        """Whether the device's counter has reached ``ticket`` (they start at 1)."""
        counter = self._store.get({schema.PARTITION_KEY: {"S": device_id},
                                   schema.SORT_KEY: {"S": table.LEASE_COUNTER_SK}})
        return 1 <= ticket <= (int(counter[_TICKET]["N"]) if counter else 0)


def _check_credential(device_id: str, refused: Refusals, credential: Holder | None, now: float) -> None:
    """For the device's own request whose holder change DynamoDB refused: ``CredentialRevoked``
    when the item it met no longer holds the credential, ``DeviceNotFound`` when it met no live
    device (what the request would have heard had it read the item first)."""
    [refusal], [item] = refused.refusals, refused.items
    if credential is not None and refusal is not None:
        if isinstance(refusal, CredentialRevoked):
            raise refusal from None
        if not schema.is_live_state(item, now):
            raise DeviceNotFound(device_id) from None


def check_ttl(ttl_seconds) -> float:
    try:
        ttl = float(ttl_seconds)
    except (TypeError, ValueError):
        raise InvalidLease("ttl_seconds must be a number") from None
    if not 1 <= ttl <= MAX_TTL_SECONDS:
        raise InvalidLease(f"ttl_seconds must be from 1 to {MAX_TTL_SECONDS}")
    return ttl
