"""The change log: one item per new version of a device's state (written by the stream
processor, encoded by ``change_items``), and the reads of the feed and of history over them.

The stream processor (``functions/changes``) turns every stream record of a state item
whose version went up into one change item in the device's partition,
``sk = rev#<zero-padded version>`` (sorting right before the state item), written once (a
redelivered record finds it there and changes nothing). Everything else the stream carries
(lease bookkeeping, the write journal and its trims, settle stubs, idempotency records, lease
rows, change items themselves) is no change: ``change_of`` returns None for it.

A change item holds the version, the previous version, the kind, the sections the write
changed, an RFC 6902 patch over the whole document ``{"state", "desired", "reported"}``
(paths ``/state/...``, ``/desired/...``, ``/reported/...``) from the previous version to
this one, the new version's per-leaf metadata, the device's timestamps, and ``expiresAt`` =
``updatedAt`` + retention. A *snapshot* (``is_snapshot``: every ``SNAPSHOT_EVERY``-th
version, a created or replaced one, a change to desired) also holds the new sections
themselves, as does any change whose item they leave in the same write units. History
rebuilds any other version from the snapshot before it and the patches since, so it cannot
show a version whose snapshot, or a change since, expired or was lost: it reaches back to
the retention less up to ``SNAPSHOT_EVERY - 1`` versions. When patch and sections do not
both fit in one item, the patch is left out and read back as one ``replace`` of the whole
document (``""``), which is equally exact.

A state write is refused unless its change item fits (``change_item_size``), so the
sections always fit. Should DynamoDB still refuse one, the sections are left out (the
metadata kept if it fits) and history rebuilds that version from the one before and the
patch; should even that be refused, or the processor give a record up, a *lost* marker
takes the version's place: followers that reach it get ``ChangesExpired`` (HTTP 410 with
the current version) at once, never a silent gap.
"""

from __future__ import annotations

import time
from typing import Callable

from ..errors import ConditionNotMet, DeviceNotFound, DeviceStateError, ItemTooLarge
from ..item import schema
from ..item.credentials import Holder
from ..model.device import Device
from ..model.times import epoch_of, stored_time
from ..model.values import MAX_PAGE_BYTES, item_size, validate_device_id
from ..runtime import Runtime
from ..write.expressions import Expression
from ..write.store import IDEMPOTENT, ONCE, Store
from .items import (
    CHANGE_SK_PREFIX,
    DELETED,
    LEGACY_CHANGE_SK_PREFIX,
    VERSION_WIDTH,
    Change,
    change_from_item,
    change_item,
    change_of,
    change_sk,
    device_after,
    is_snapshot,
    lost_marker,
    without_sections,
    write_units,
)

TRIES_SK_PREFIX = "change-tries#"  # the processor's failed tries at one version's change
TRIES = "tries"  # on that item: how many there were
DEFAULT_RETENTION_SECONDS = 7 * 24 * 60 * 60
MAX_FEED_LIMIT = 100
# The processor's event source mapping gives a record up once it is this old (to the
# on-failure queue; infra/changes.py). A device's last write older than that, plus a
# margin, with the change after ``since`` still missing: its record was given up, so the
# feed answers ChangesExpired rather than an empty page that would never fill.
MAX_RECORD_AGE_SECONDS = 6 * 60 * 60
GIVEN_UP_SECONDS = MAX_RECORD_AGE_SECONDS + 5 * 60
# The feed records a change within this of its write, failures aside: a change missing longer is
# also looked for under the legacy key (an older release recorded it before an upgrade).
RECORDED_WITHIN_SECONDS = 10
# Legacy change items are looked for until 2027-12-01 (UTC): those stored before 2026-12-01, when
# this release came, have expired by then, whatever the change retention (at most 366 days).
LEGACY_READ_UNTIL = 1_827_619_200
LAST_VERSION = 10 ** VERSION_WIDTH - 1  # the highest a change's sort key can hold
MAX_REBUILD_STEPS = 100  # versions history walks back to rebuild one stored without its state


class ChangesExpired(DeviceStateError):
    """The changes after ``since`` are past the retention: re-read the device and go on
    from its version."""

    def __init__(self, device_id: str, since: int, current_version: int):
        super().__init__(f"the changes of {device_id} after version {since} are past the retention; "
                         f"read the device and continue from its version ({current_version})")
        self.device_id = device_id
        self.current_version = current_version


class InvalidSince(DeviceStateError, ValueError):
    pass


class VersionNotRecorded(DeviceStateError):
    """The version was written but the feed has not recorded it yet: ask again shortly."""

    def __init__(self, device_id: str, version: int):
        super().__init__(f"{device_id} version {version} is written but not yet in its history; "
                         "ask again after Retry-After")
        self.device_id = device_id


class VersionNotFound(DeviceStateError):
    def __init__(self, device_id: str, version: int, why: str):
        super().__init__(f"{device_id} has no version {version} to show: {why}")
        self.device_id = device_id


def _version_and_time(state: dict) -> tuple[int, str | None]:
    """A state item's version and when it was last written (None: never stamped)."""
    return schema.StateItem.of(state).version, (stored_time(state[schema.UPDATED_AT])
                                                if schema.UPDATED_AT in state else None)


def _past_current(since: int, current: int) -> InvalidSince:
    return InvalidSince(f"since ({since}) is past the device's current version ({current})")


def _legacy_read(now: float) -> bool:
    """Whether the legacy change items are still looked for (``LEGACY_READ_UNTIL``)."""
    return now < LEGACY_READ_UNTIL


def _contiguous(items: list[dict], since: int, now: float) -> tuple[list[Change], bool]:
    """The changes of ``items`` contiguous from ``since + 1``, and whether the first one is a
    lost marker (the change right after ``since`` could not be recorded)."""
    changes: list[Change] = []
    for item in items:
        if schema.is_expired(item, now) or schema.StateItem.of(item).version != since + 1 + len(changes):
            break
        change = change_from_item(item)
        if change.lost:
            return changes, not changes
        changes.append(change)
    return changes, False


def _within_page_bytes(items: list[dict]) -> list[dict]:
    """The first of ``items`` whose sizes as stored sum to at most ``MAX_PAGE_BYTES`` (the first
    always): a page of large changes holds fewer, and the next page starts at the one left out."""
    size = 0
    for taken, item in enumerate(items):
        size += item_size(item)
        if taken and size > MAX_PAGE_BYTES:
            return items[:taken]
    return items


def _device(expr: Expression, device_id: str) -> str:
    """The key condition on the device's partition."""
    return f"{expr.name(schema.PARTITION_KEY)} = {expr.value({'S': device_id})}"


class ChangeLog:
    """Writes change items (the stream processor) and reads them (the feed, history)."""

    def __init__(self, client, table_name: str, *, retention_seconds: int = DEFAULT_RETENTION_SECONDS,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.store = Store(client, table_name, Runtime(clock=clock, monotonic=monotonic, sleep=sleep))
        self.retention_seconds = retention_seconds
        self.clock, self.monotonic, self.sleep = clock, monotonic, sleep

    # ------------------------------------------------------------------ writes

    def record(self, old_image: dict | None, new_image: dict | None, on_lost=None) -> Change | None:
        """Write the change a stream record describes, once; None when it is no change.
        A record seen again finds its item there and changes nothing. Where no form of the
        change fits an item, its version is marked lost instead, and ``on_lost(change)`` is
        called (the processor counts it: nothing else tells an operator)."""
        change = change_of(old_image, new_image)
        if change is None:
            return None
        forms = [change_item(change, new_image, self.retention_seconds)]
        if change.state is not None:
            forms += [without_sections(change, new_image, self.retention_seconds, metadata=True),
                      without_sections(change, new_image, self.retention_seconds, metadata=False)]
            if not is_snapshot(change) and write_units(forms[1]) < write_units(forms[0]):
                forms.pop(0)  # between snapshots, the sections are left out where that saves a write unit
        forms.append(lost_marker(change, self.retention_seconds))
        for form in forms:
            try:
                self._put_once(form)
            except ItemTooLarge:
                continue  # a smaller form next; the last (the lost marker) always fits
            if form is forms[-1] and on_lost is not None:
                on_lost(change)
            return change
        return change

    def record_lost(self, new_image: dict | None) -> Change | None:
        """Mark the version a stream record describes as lost (its change could not be
        written): followers that reach it learn so at once."""
        change = change_of(None, new_image) if new_image else None
        if change is None:
            return None
        self._put_once(lost_marker(change, self.retention_seconds))
        return change

    def count_try(self, new_image: dict | None) -> int:
        """Counts one failed try at recording the version a stream record describes and
        answers how many there were (an item beside the changes, expiring with them)."""
        change = change_of(None, new_image) if new_image else None
        if change is None:
            return 0
        expr = Expression()
        update = (f"ADD {expr.name(TRIES)} {expr.number(1)} SET {expr.name(schema.TTL_ATTRIBUTE)} = "
                  f"{expr.number(int(self.clock()) + self.retention_seconds)}")
        answer = self.store.send(
            "update_item", ONCE, Key={schema.PARTITION_KEY: {"S": change.device_id},
                                      schema.SORT_KEY: {"S": f"{TRIES_SK_PREFIX}{change.version:020d}"}},
            UpdateExpression=update, **expr.attributes(), ReturnValues="UPDATED_NEW")
        return int(answer["Attributes"][TRIES]["N"])

    def _put_once(self, item: dict) -> None:
        """Puts the change unless it is there; one past its expiry (TTL deletes late) counts as gone:
        a former device's, under an id created again once its tombstone (which outlives its
        changes) had expired, which the new device's change replaces."""
        expr = Expression()
        expires = expr.name(schema.TTL_ATTRIBUTE)
        try:
            self.store.send("put_item", IDEMPOTENT, Item=item,
                            ConditionExpression=f"attribute_not_exists({expr.name(schema.SORT_KEY)}) OR "
                                                f"{expires} <= {expr.number(int(self.clock()))}",
                            **expr.attributes())
        except ConditionNotMet:
            pass  # written before: by an earlier delivery of this record

    # ------------------------------------------------------------------- reads

    def read(self, device_id: str, since: int, limit: int = MAX_FEED_LIMIT,
             holder: Holder | None = None) -> list[Change]:
        """Up to ``limit`` changes after version ``since``, oldest first and contiguous
        from ``since + 1`` (an empty list when none is recorded yet), at most ``MAX_PAGE_BYTES``
        of them as stored (the first always). ``holder``: the device's
        own read, with the credential it comes with, checked on its state item
        (``Holder.check``) before anything is answered.

        A holder's Query reads the state item with the changes, since it sorts right after
        them: one request, and a device caught up with its feed reads its state item alone. Its
        page that stops short of the newest change reads the state item on its own. Any other
        caller's Query reads the changes alone (a fan-out, a catch-up: pages that find changes
        need no state item), and the state item only when it finds none."""
        validate_device_id(device_id)
        if not 1 <= limit <= MAX_FEED_LIMIT:
            raise ValueError(f"limit must be 1..{MAX_FEED_LIMIT}")
        if since < 0:
            raise InvalidSince("since must be 0 or more")
        now = self.clock()
        with_state = holder is not None
        change_items, complete = self._items_after(device_id, since, limit + with_state,
                                                   schema.STATE_SK if with_state else change_sk(LAST_VERSION))
        state = (change_items.pop() if change_items and change_items[-1][schema.SORT_KEY]["S"] == schema.STATE_SK
                 else None)
        state_read = state is not None or (with_state and complete)  # found, or known absent
        if holder is not None:
            if not state_read:
                state, state_read = self.store.get_state(device_id), True
            holder.check(device_id, state, now)
        known = (_version_and_time(state) if state is not None and schema.VERSION in state
                 and not schema.is_expired(state, now) else None)
        if known is not None and since >= known[0]:
            if since > known[0]:
                raise _past_current(since, known[0])
            return []
        changes, lost = _contiguous(_within_page_bytes(change_items[:limit]), since, now)
        if changes:
            return changes
        current, updated_at = known or self._current(device_id, now, state_read=state_read)
        if change_items or lost:  # the change right after `since` is gone (or lost) while later ones exist
            if not lost and (legacy := self._legacy_page(device_id, since, limit, now, current)):
                return legacy
            raise ChangesExpired(device_id, since, current)
        if since > current:
            raise _past_current(since, current)
        if since < current and updated_at is not None:
            written = epoch_of(updated_at)
            if written + RECORDED_WITHIN_SECONDS <= now and (
                    legacy := self._legacy_page(device_id, since, limit, now, current)):
                return legacy
            if written + min(self.retention_seconds, GIVEN_UP_SECONDS) <= now:
                # Past the retention, or a record the processor gave up (on AWS, to the
                # on-failure queue) long ago: the next change will not come.
                raise ChangesExpired(device_id, since, current)
        return []  # caught up, or the processor has not written the next change yet

    def _legacy_page(self, device_id: str, since: int, limit: int, now: float, current: int) -> list[Change]:
        """The changes after ``since`` that an older release stored under the legacy key, read
        only where today's key holds none (the feed would answer them past the retention, or
        missing longer than the feed takes to record a change) and until ``LEGACY_READ_UNTIL``;
        ChangesExpired when the change after ``since`` is a lost marker there."""
        if not _legacy_read(now):
            return []
        items, _ = self._items_after(device_id, since, limit, change_sk(LAST_VERSION, LEGACY_CHANGE_SK_PREFIX),
                                     LEGACY_CHANGE_SK_PREFIX)
        changes, lost = _contiguous(_within_page_bytes(items), since, now)
        if lost:
            raise ChangesExpired(device_id, since, current)
        return changes

    def _items_after(self, device_id: str, since: int, limit: int, upper: str,
                     prefix: str = CHANGE_SK_PREFIX) -> tuple[list[dict], bool]:
        """Up to ``limit`` items of the device's partition from the change after ``since``
        through the sort key ``upper``, and whether the Query read to ``upper`` (it also stops at
        ``limit`` items and at 1 MB read)."""
        expr = Expression()
        in_range = (f"{_device(expr, device_id)} AND {expr.name(schema.SORT_KEY)} BETWEEN "
                    f"{expr.value({'S': change_sk(since + 1, prefix)})} AND {expr.value({'S': upper})}")
        answer = self.store.send("query", ConsistentRead=True, Limit=limit, KeyConditionExpression=in_range,
                                 **expr.attributes())
        return answer.get("Items", []), "LastEvaluatedKey" not in answer

    def wait(self, device_id: str, since: int, limit: int = MAX_FEED_LIMIT, wait_seconds: float = 0.0,
             first_delay: float = 0.05, max_delay: float = 1.0, holder: Holder | None = None) -> list[Change]:
        """``read``, polled with backoff until a change arrives or ``wait_seconds`` pass."""
        deadline = self.monotonic() + max(wait_seconds, 0.0)
        delay = first_delay
        while True:
            changes = self.read(device_id, since, limit, holder)
            left = deadline - self.monotonic()
            if changes or left <= 0:
                return changes
            self.sleep(min(delay, left))
            delay = min(delay * 2, max_delay)

    def at_version(self, device_id: str, version: int, wait_seconds: float = 0.0,
                   holder: Holder | None = None) -> Device:
        """The device as it was at ``version``, within the retention. The current version
        is the state item's; an older one that the feed has not recorded yet (it trails the
        writes by the stream's delay) is waited for up to ``wait_seconds``, then
        ``VersionNotRecorded``. ``holder``: the device's own read, checked on its state item
        (``Holder.check``)."""
        validate_device_id(device_id)
        deadline = self.monotonic() + wait_seconds
        delay = 0.05
        while True:
            state = self.store.get_state(device_id)
            if holder is not None:
                holder.check(device_id, state, self.clock())
            if schema.is_live_state(state, self.clock()) and schema.StateItem.of(state).version == version:
                return Device.from_item(state)
            try:
                return self._rebuilt(device_id, version)
            except VersionNotRecorded:
                left = deadline - self.monotonic()
                if left <= 0:
                    raise
                self.sleep(min(delay, left))
                delay = min(delay * 2, 0.5)

    def _rebuilt(self, device_id: str, version: int) -> Device:
        pending: list[Change] = []  # versions stored without their sections, newest first
        for at in range(version, max(version - MAX_REBUILD_STEPS, 0), -1):
            item = self._change_item(device_id, at)
            if item is None:
                if self._recording(device_id, at):
                    raise VersionNotRecorded(device_id, version)
                item = self._change_item(device_id, at)  # the feed may have recorded it since the first read
            if item is None and _legacy_read(self.clock()):
                item = self._change_item(device_id, at, LEGACY_CHANGE_SK_PREFIX)
            if item is None:
                why = ("never written, or past the retention" if at == version
                       else f"version {at}, which it is rebuilt from, is missing or past the retention")
                raise VersionNotFound(device_id, version, why)
            change = change_from_item(item)
            if change.lost:
                why = ("its change could not be recorded" if at == version
                       else f"the change of version {at}, which it is rebuilt from, was lost")
                raise VersionNotFound(device_id, version, why)
            if change.kind == DELETED:
                raise VersionNotFound(device_id, version, "the device was deleted at this version")
            if change.state is not None:
                device = change.device()
                for later in reversed(pending):  # rebuilt from the version before and each patch
                    device = device_after(device, later)
                return device
            pending.append(change)
        raise VersionNotFound(device_id, version, "too far from a version stored with its sections")

    def _change_item(self, device_id: str, version: int, prefix: str = CHANGE_SK_PREFIX) -> dict | None:
        item = self.store.get({schema.PARTITION_KEY: {"S": device_id},
                               schema.SORT_KEY: {"S": change_sk(version, prefix)}})
        return None if item is None or schema.is_expired(item, self.clock()) else item

    def _recording(self, device_id: str, version: int) -> bool:
        """True when ``version`` was written but the feed has not recorded it yet: no change
        item at or after it, the device at or past it, and its processing not given up; not
        when, written longer ago than the feed takes to record it, the legacy key holds it or a
        later version."""
        now = self.clock()
        latest = self._latest_change(device_id, (CHANGE_SK_PREFIX,))  # what is being recorded goes under today's key
        if latest is not None and schema.StateItem.of(latest).version >= version:
            return False
        try:
            current, updated_at = self._current(device_id, now)
        except DeviceNotFound:
            return False
        if version > current or updated_at is None or epoch_of(updated_at) + GIVEN_UP_SECONDS <= now:
            return False
        if epoch_of(updated_at) + RECORDED_WITHIN_SECONDS > now or not _legacy_read(now):
            return True
        legacy = self._latest_change(device_id, (LEGACY_CHANGE_SK_PREFIX,))  # an older release recorded past it
        return legacy is None or schema.StateItem.of(legacy).version < version

    def _latest_change(self, device_id: str, prefixes: tuple[str, ...] | None = None) -> dict | None:
        """The newest change item the feed holds for the device (expired or not): under the
        first of ``prefixes`` (by default today's key, then the legacy one) that holds one."""
        if prefixes is None:
            prefixes = (CHANGE_SK_PREFIX,) + ((LEGACY_CHANGE_SK_PREFIX,) if _legacy_read(self.clock()) else ())
        for prefix in prefixes:
            expr = Expression()
            changes = (f"{_device(expr, device_id)} AND "
                       f"begins_with({expr.name(schema.SORT_KEY)}, {expr.value({'S': prefix})})")
            latest = self.store.send("query", ConsistentRead=True, Limit=1, ScanIndexForward=False,
                                     KeyConditionExpression=changes, **expr.attributes()).get("Items", [])
            if latest:
                return latest[0]
        return None

    def _current(self, device_id: str, now: float, state_read: bool = False) -> tuple[int, str | None]:
        """The device's current version (a tombstone's too) and when it was last written;
        DeviceNotFound when there is no device, tombstone or change at all. ``state_read``:
        the caller read the state item and found none (or none alive)."""
        item = None if state_read else self.store.get_state(device_id)
        if item is not None and schema.VERSION in item and not schema.is_expired(item, now):
            return _version_and_time(item)
        latest = self._latest_change(device_id)
        if latest is not None and not schema.is_expired(latest, now):
            return schema.StateItem.of(latest).version, stored_time(latest[schema.UPDATED_AT])
        raise DeviceNotFound(device_id)
