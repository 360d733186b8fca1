"""Sending a subscriber its changes: every version after its ``delivered``, oldest first,
each posted before ``delivered`` moves past it. Catch-up on subscribe and the stream's
fan-out run the same ``advance``; when two run at once for one subscriber a version may go
out twice, but a version is posted only once every earlier one was, so a client that drops
versions it has already seen gets each version after its ``since`` exactly once, in order."""

from __future__ import annotations

import itertools
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Callable, Sequence

from functions.device_state import (DELETED, Change, ChangeLog, ChangesExpired, Device, DeviceNotFound,
                                    VersionNotFound, device_after, dumps)
from functions.problem_details import problem

from .subscriptions import Subscription, Subscriptions

logger = logging.getLogger("device_state.push")
MAX_MESSAGE_BYTES = 128 * 1024  # API Gateway's WebSocket message limit
PAGE = 100
CATCH_UP_VERSIONS = 64  # a subscriber is moved on through changes it does not follow at least this often
CATCH_UP_SECONDS = 15.0  # of a subscribe's catch-up, well inside the push function's 28 s
FAN_OUT_THREADS = 16  # subscribers of one device posted to side by side


class Gone(Exception):
    """The connection no longer exists (@connections answered 410)."""


class PostFailed(Exception):
    """A post to one connection failed otherwise (throttled, timed out): that subscriber stays
    where it was. The fan-out raises it once the device's other subscribers had their turn, so
    the device's records are sent again (retried by the mapping); a catch-up tells the client to
    subscribe again from the last version it kept."""


class CatchUpStopped(Exception):
    """A catch-up ran out of its time (``CATCH_UP_SECONDS``) before the subscriber had every
    change: the client subscribes again from the last version it kept, and gets the rest."""


def change_message(change: Change, delta: dict | None) -> dict:
    """The feed's change plus the delta after it; too large for one message, it says so and
    where the version is."""
    message = {"type": "change", **change.as_dict(), "delta": delta}
    if len(dumps(message).encode()) <= MAX_MESSAGE_BYTES:
        return message
    slim = {key: value for key, value in message.items() if key not in ("patch", "delta")}
    return {**slim, "tooLarge": True,
            "detail": f"over {MAX_MESSAGE_BYTES} bytes: GET /devices/{change.device_id}/versions/{change.version}"}


class Delivery:
    def __init__(self, subscriptions: Subscriptions, log: ChangeLog, post: Callable[[str, dict], None],
                 forget: Callable[[str], object] | None = None):
        """``forget(connection_id)``: what a connection API Gateway answers gone leaves behind
        (its subscriptions, a device's connectivity); by default its subscriptions."""
        self.subscriptions, self.log, self.post = subscriptions, log, post
        self.forget = forget or subscriptions.close

    def advance(self, subscription: Subscription, up_to: int | None = None,
                known: Sequence[Change] = (), until: float | None = None) -> Subscription | None:
        """Sends the subscriber the changes after its ``delivered`` (up to ``up_to``, or all
        recorded yet), starting from ``known`` (changes already read, oldest first) where they
        reach. Raises ChangesExpired when the next one is past the retention, Gone when the
        connection is, CatchUpStopped when a post would begin at or after ``until`` (monotonic
        seconds); returns the subscription as it ends (None if it ended, or its connection is
        past its expiry)."""
        device = None  # the device as the change before the one in hand left it, where known
        while subscription is not None and (up_to is None or subscription.delivered < up_to):
            _in_time(until, subscription)  # at a page's start: those it passed over are recorded
            changes = [change for change in known if change.version > subscription.delivered]
            known = ()
            if not changes or changes[0].version != subscription.delivered + 1:
                try:
                    changes = self.log.read(subscription.device_id, subscription.delivered, PAGE)
                except DeviceNotFound:
                    return subscription  # nothing written yet: the device's first change comes by fan-out
            if not changes:
                return subscription
            for change in changes:
                if set(subscription.sections).intersection(change.sections) or change.kind == DELETED:
                    _in_time(until, subscription)
                    device = self._device(change, device)
                    if not self._post(subscription, change_message(change, device and device.delta())):
                        return None
                else:
                    device = device_after(device, change)  # no read: None where it would take one
                    if change is not changes[-1]:
                        continue  # nothing sent: the next write records past it (one a page, not a change)
                if not self.subscriptions.advance(subscription, change.version):
                    subscription = self.subscriptions.current(subscription)  # another sender moved it
                    break
                subscription = replace(subscription, delivered=change.version)
        return subscription

    def _post(self, subscription: Subscription, message: dict) -> bool:
        """Posts to the subscriber's connection, or returns False, posting nothing, when the
        connection is past its expiry: checked at each post, since a sender may have read the
        subscription before the expiry (a fan-out's read stalled, a long catch-up), and a
        stored item past its expiresAt lingers until TTL deletes it."""
        if subscription.expired(self.subscriptions.clock()):
            return False
        try:
            self.post(subscription.connection_id, message)
            return True
        except Gone:
            raise
        except Exception as error:  # noqa: BLE001 - one connection's trouble, not the stream's
            raise PostFailed(f"post to {subscription.connection_id} failed: {error}") from error

    def _device(self, change: Change, before: Device | None) -> Device | None:
        """The device as ``change`` left it (None for a delete): from the change's item and
        the device before it where they hold it, else read (``at_version``: the state item
        while the device is still at that version, a rebuild from the feed once it moved on)."""
        if change.kind == DELETED or change.lost:
            return None
        device = device_after(before, change)
        if device is not None:
            return device
        try:
            return self.log.at_version(change.device_id, change.version)
        except VersionNotFound:
            return None

    def fan_out(self, device_id: str, version: int, last_changed: dict | None = None,
                streamed: Sequence[Change] = ()) -> int:
        """Brings every subscriber of the device up to ``version``, side by side (the changes
        read once for all); how many were sent to. A failure other than a gone connection or
        an expired ``since`` (a post that failed too) is raised once every subscriber has had
        its turn: the mapping sends the device's records again, and those brought up already
        are left where they are.

        ``last_changed``: per section, the version that last changed it as of ``version``
        (``fanout.changed_since``; None: not known). A subscriber with nothing it follows
        changed since it last heard is left where it is, unread and unwritten, until it has or
        falls ``CATCH_UP_VERSIONS`` behind (so its catch-up stays a page or two, far inside the
        feed's retention). A change it follows that it has not heard (a post that failed, a
        batch given up) keeps it in at every fan-out until it has.

        ``streamed``: the change items the stream brought, oldest first, what subscribers start
        from where the feed's read finds none (one an older release recorded, under the legacy
        key, the moment before an upgrade), up to a lost one (which the feed answers)."""
        behind = [subscription for subscription in self.subscriptions.of_device(device_id)
                  if subscription.delivered < version and (
                      last_changed is None or version - subscription.delivered >= CATCH_UP_VERSIONS
                      or any(last_changed.get(section, version) > subscription.delivered
                             for section in subscription.sections))]
        if not behind:
            return 0
        try:
            known = self.log.read(device_id, min(subscription.delivered for subscription in behind), PAGE) \
                or list(itertools.takewhile(lambda change: not change.lost, streamed))
        except (ChangesExpired, DeviceNotFound):
            known = []  # each subscriber finds out on its own read
        with ThreadPoolExecutor(max_workers=min(FAN_OUT_THREADS, len(behind))) as pool:
            outcomes = list(pool.map(lambda subscription: self._bring_up(subscription, version, known), behind))
        failures = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
        if failures:
            raise failures[0]
        return len(behind)

    def _bring_up(self, subscription: Subscription, version: int, known: list) -> Exception | None:
        try:
            self.advance(subscription, version, known)
        except Gone:
            self.forget(subscription.connection_id)
        except ChangesExpired as expired:
            self._expired(subscription, expired)
        except Exception as error:  # noqa: BLE001 - raised by fan_out after the others had their turn
            return error
        return None

    def _expired(self, subscription: Subscription, expired: ChangesExpired) -> None:
        try:
            if not subscription.expired(self.subscriptions.clock()):  # as _post: nothing past the connection's end
                self.post(subscription.connection_id, error_message(
                    "changes-expired", "Changes past the retention", str(expired), 410,
                    deviceId=subscription.device_id, currentVersion=expired.current_version))
        except Gone:
            self.forget(subscription.connection_id)
            return
        self.subscriptions.unsubscribe(subscription.connection_id, subscription.device_id)


def _in_time(until: float | None, subscription: Subscription) -> None:
    if until is not None and time.monotonic() >= until:
        raise CatchUpStopped(f"sent up to version {subscription.delivered}")


def error_message(slug: str, title: str, detail: str, status: int = 400, **members) -> dict:
    """An error to the client: ``{"type": "error", "problem": <problem details>}``."""
    return json.loads(dumps({"type": "error", "problem": problem(status, slug, title, detail, **members)}))
