"""What happens to a desire after it is written: the device's acknowledgement (applied,
in progress, refused, failed), its expiry, and its removal once confirmed. All pure.

Each desired leaf may have a *status*, kept on the item in ``statusDesired``: a map from
the leaf's JSON Pointer to ``{"v": version, ...}`` where ``v`` is the version of the
desire it belongs to, with any of

- ``x``: the deadline (epoch milliseconds) after which the desire is no longer asked for
  (``?expiresIn=``), unless the device confirmed it;
- ``c``: true when the desire is removed from ``desired`` by the report that confirms it
  (``?clearOnConfirm=true``);
- ``a``, ``r``, ``t``: the device's acknowledgement, an HTTP-like code (200 applied, 202
  in progress, 400 refused, 500 failed: IoT Plug and Play's convention), its reason and
  its time (epoch milliseconds);
- ``k``: the version of the report that confirmed a cleared desire (the leaf has left
  ``desired``; the status keeps the confirmation, so that the app that asked can tell a
  desire its device confirmed from one removed unconfirmed: ``annotate``).

A status counts only while ``v`` is the version of the write that last set the leaf (its
metadata entry, ``sections.leaf_entries``): a write that sets the leaf again, however it
is sent (a compiled patch reads nothing and leaves the old status behind), starts a new
desire with no status. Every write that reads keeps only what ``kept`` says: the statuses
that count and, within ``MAX_CLEARED_KEPT`` and ``MAX_CLEARED_KEPT_BYTES``, the newest
confirmations of cleared desires (history, which a write that needs their room drops).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

from ..errors import DesireMoved, InvalidValue
from .sections import (
    DESIRED,
    MAX_POINTER_BYTES,
    REPORTED,
    STATUS,
    VERSION_SPAN,
    delta,
    leaf_entries,
    leaves,
    pointer_bytes,
    same_value,
    unpack,
)
from .times import timestamp
from .values import MAX_VERSION, item_size

MIN_EXPIRY_SECONDS, MAX_EXPIRY_SECONDS = 1, 30 * 24 * 60 * 60
MAX_ACKS = 100  # acknowledgements in one request
MAX_REASON_CHARS = 256
REFUSED_FROM = 400  # an acknowledgement at or above this code takes the leaf out of the delta
IN_PROGRESS = 202
_LARGEST_VERSION, _LARGEST_MILLISECONDS = {"N": str(VERSION_SPAN - 1)}, {"N": "9" * 13}
# What one status adds to the item beside its pointer and its ack's reason: its map slot and
# every member at its largest.
STATUS_BYTES = 1 + item_size({"": {"M": {"v": _LARGEST_VERSION, "x": _LARGEST_MILLISECONDS, "c": {"BOOL": True},
                                         "a": {"N": "599"}, "r": {"S": ""}, "t": _LARGEST_MILLISECONDS}}})
CONFIRMED = "k"  # a status's member: the version of the report that confirmed its cleared desire
MAX_CLEARED_KEPT = 100  # confirmations of cleared desires kept on the item, newest first
# ... and their bytes on the item: each its pointer plus CONFIRMATION_BYTES. Ordinary pointers
# (tens of bytes) meet the count first; of the longest (4,096 bytes) the newest one is kept.
MAX_CLEARED_KEPT_BYTES = 8192
# What one kept confirmation adds to the item beside its pointer: its map slot and
# ``{"v": version, "k": version}``, both at their largest.
CONFIRMATION_BYTES = 1 + item_size({"": {"M": {"v": _LARGEST_VERSION, "k": _LARGEST_VERSION}}})


@dataclass(frozen=True)
class DesireOptions:
    """How a desired write's leaves live on: ``expires_in`` seconds (None: until set
    again), and whether the confirming report removes them (``clear_on_confirm``)."""

    expires_in: int | None = None
    clear_on_confirm: bool = False

    def __post_init__(self):
        seconds = self.expires_in
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)
                                    or not MIN_EXPIRY_SECONDS <= seconds <= MAX_EXPIRY_SECONDS):
            raise InvalidValue(f"expiresIn must be a whole number of seconds from {MIN_EXPIRY_SECONDS} to "
                               f"{MAX_EXPIRY_SECONDS} (30 days)", limit="expires-in")

    def __bool__(self) -> bool:
        return self.expires_in is not None or self.clear_on_confirm

    def status(self, version: int, now: float) -> dict:
        entry = {"v": version}
        if self.expires_in is not None:
            entry["x"] = int(now * 1000) + self.expires_in * 1000
        if self.clear_on_confirm:
            entry["c"] = True
        return entry


@dataclass(frozen=True)
class Ack:
    """A device's answer to the desire of ``version`` at the desired leaf ``path``."""

    path: str
    version: int
    code: int
    reason: str | None = None

    def __post_init__(self):
        if not isinstance(self.path, str) or not self.path.startswith("/") or re.search(r"~(?![01])", self.path):
            raise ValueError("an ack's path is the JSON Pointer of a desired leaf, such as /brightness "
                             "('~' written ~0, '/' in a name ~1)")
        if pointer_bytes(self.path) > MAX_POINTER_BYTES:
            raise ValueError(f"an ack's path is at most {MAX_POINTER_BYTES} bytes, as a desired leaf's is")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or not 1 <= self.version <= MAX_VERSION:
            raise ValueError("an ack's version is the desired leaf's version (an integer from 1)")
        if (isinstance(self.code, bool) or not isinstance(self.code, int)
                or not (self.code in (200, IN_PROGRESS) or REFUSED_FROM <= self.code <= 599)):
            raise ValueError("an ack's code is 200 applied, 202 in progress, 400-499 refused or 500-599 failed")
        if self.reason is not None and (not isinstance(self.reason, str) or len(self.reason) > MAX_REASON_CHARS):
            raise InvalidValue(f"an ack's reason is a string of at most {MAX_REASON_CHARS} characters",
                               limit="ack-reason")


def check_acks(acks: list[Ack]) -> list[Ack]:
    """1 to ``MAX_ACKS`` acknowledgements; of two for one path, the later is recorded."""
    if not 1 <= len(acks) <= MAX_ACKS:
        raise InvalidValue(f"acks holds 1 to {MAX_ACKS} acknowledgements", limit="acks")
    return acks


def leaf_versions(desired: dict, entries: dict) -> dict[str, int]:
    """The version of the write that last set each desired leaf."""
    return {leaf: unpack(packed)[0] for leaf, packed in leaf_entries(desired, entries.get(DESIRED, {})).items()}


def current(desired: dict, entries: dict) -> dict[str, dict]:
    """The status of each desired leaf that has one that counts (``v`` is its version)."""
    statuses = entries.get(STATUS) or {}
    if not statuses:
        return {}
    versions = leaf_versions(desired, entries)
    return {leaf: status for leaf, status in statuses.items()
            if leaf in versions and int(status.get("v", 0)) == versions[leaf]}


def cleared(desired: dict, entries: dict) -> dict[str, dict]:
    """The confirmations of cleared desires that no desire since has superseded: desired
    holds nothing at their leaf, below it or above it."""
    confirmations = {leaf: status for leaf, status in (entries.get(STATUS) or {}).items() if CONFIRMED in status}
    if not confirmations:
        return {}
    present = leaves(desired)
    held = {above for leaf in present for above in superseded_by(leaf)}  # each leaf and the objects above it
    return {leaf: status for leaf, status in confirmations.items()
            if leaf not in held and not any(above in present for above in _above(leaf))}


def superseded_by(leaf: str) -> list[str]:
    """The pointers whose confirmations a desired leaf at ``leaf`` supersedes from above or at
    it: each object above it and the leaf (``cleared`` checks those below it apart)."""
    return [*_above(leaf), leaf]


def nested_confirmations(statuses: dict) -> bool:
    """Whether a kept confirmation of a cleared desire is below an object (a write setting the
    object, read-free, could not see that it supersedes it)."""
    return any(CONFIRMED in status and _above(leaf) for leaf, status in statuses.items())


def _above(leaf: str) -> list[str]:
    parts = leaf.split("/")
    return ["/".join(parts[:end]) for end in range(2, len(parts))]


def is_expired(status: dict, now: float) -> bool:
    return "x" in status and int(status["x"]) <= now * 1000


def is_refused(status: dict) -> bool:
    return int(status.get("a", 0)) >= REFUSED_FROM


def open_delta(desired: dict, reported: dict, entries: dict, now: float) -> dict:
    """The delta the device is asked to act on: ``sections.delta`` without the leaves it
    refused (an ack of 400 or more) and those whose desire expired (the deadline passed;
    a confirmed leaf is in no delta anyway)."""
    closed = [leaf for leaf, status in current(desired, entries).items()
              if is_refused(status) or is_expired(status, now)]
    return delta(without_leaves(desired, closed) if closed else desired, reported)


def expired_since(desired: dict, entries: dict, since: float, now: float) -> bool:
    """Whether a desire's deadline fell after ``since`` and by ``now`` (epoch seconds): the
    delta changed with no write, under the same version."""
    return any("x" in status and since * 1000 < int(status["x"]) <= now * 1000
               for status in current(desired, entries).values())


def without_leaves(document: dict, pointers) -> dict:
    """A copy of ``document`` without the leaves at ``pointers``, and without the objects
    that removing them left empty (an empty object would be a leaf of its own)."""
    document = copy.deepcopy(document)
    for pointer in pointers:
        parts = _parts(pointer)
        trail, node = [], document
        for part in parts[:-1]:
            trail.append((node, part))
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or parts[-1] not in node:
            continue
        del node[parts[-1]]
        while trail and not node:
            parent, name = trail.pop()
            del parent[name]
            node = parent
    return document


def annotate(metadata: dict, desired: dict, reported: dict, entries: dict, now: float) -> None:
    """Adds to desired's metadata (``sections.metadata``, nested like the section) what
    each leaf's status says, and the confirmations of cleared desires. A leaf reported holds
    at its value is not shown expired: nothing is left undone (it is in no delta either)."""
    desired_values, reported_values = leaves(desired), leaves(reported)
    for leaf, status in current(desired, entries).items():
        entry = _at(metadata, leaf)
        if entry is not None:
            met = leaf in reported_values and same_value(desired_values.get(leaf), reported_values[leaf])
            entry.update(leaf_status(status, "confirmedVersion" in entry or met, now))
    for leaf, status in cleared(desired, entries).items():
        parts = _parts(leaf)
        node = metadata
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if isinstance(node.get("version"), int):  # a leaf of desired holds this path: the cleared one is
                # history (a member named "version" has its own metadata object there, not a number)
                break
        else:
            node.setdefault(parts[-1], {"version": int(status["v"]), "confirmedVersion": int(status[CONFIRMED]),
                                        "cleared": True})


def _parts(pointer: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer.split("/")[1:]]


def _at(tree: dict, pointer: str) -> dict | None:
    for part in _parts(pointer):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def leaf_status(status: dict, met: bool, now: float) -> dict:
    """What a desired leaf's metadata shows of its status (``met``: confirmed, or reported holds
    its value, so it is never ``expired``)."""
    shown = {}
    if "x" in status:
        shown["expiresAt"] = timestamp(int(status["x"]) / 1000)
        if not met and is_expired(status, now):
            shown["expired"] = True
    if status.get("c"):
        shown["clearOnConfirm"] = True
    if "a" in status:
        ack = {"code": int(status["a"]), "version": int(status["v"]), "at": timestamp(int(status["t"]) / 1000)}
        if status.get("r") is not None:
            ack["reason"] = status["r"]
        shown["ack"] = ack
    return shown


# ----------------------------------------------------------------- what writes do


def after_desired_write(desired: dict, entries: dict, options: DesireOptions, version: int, now: float,
                        replaced: bool = False) -> dict:
    """Desired's statuses after a read-modify-write of it at ``version``: the leaves it set
    (their entry is ``version``) take ``options``' status, if any; the others keep theirs
    while it counts; confirmations of cleared desires stay for leaves still absent, unless
    the write ``replaced`` the section whole (they go with it)."""
    statuses = {leaf: status for leaf, status in current(desired, entries).items() if int(status["v"]) != version}
    if options:
        for leaf, leaf_version in leaf_versions(desired, entries).items():
            if leaf_version == version:
                statuses[leaf] = options.status(version, now)
    return statuses if replaced else {**cleared(desired, entries), **statuses}


def after_acks(desired: dict, entries: dict, acks: list[Ack], now: float) -> dict:
    """Desired's statuses once ``acks`` are recorded; ``DesireMoved`` when a path is not a
    desired leaf at the version its ack answers."""
    versions = leaf_versions(desired, entries)
    statuses = {**cleared(desired, entries), **current(desired, entries)}
    for ack in acks:
        if versions.get(ack.path) != ack.version:
            raise DesireMoved(ack.path, ack.version, versions.get(ack.path))
        status = {key: value for key, value in statuses.get(ack.path, {}).items() if key not in "art"}
        status.update({"v": ack.version, "a": ack.code, "t": int(now * 1000)})
        if ack.reason is not None:
            status["r"] = ack.reason
        statuses[ack.path] = status
    return statuses


def after_report(desired: dict, reported: dict, entries: dict, version: int) -> tuple[dict, dict] | None:
    """(desired, statuses) once a report at ``version`` confirmed desires marked clear on
    confirm (reported holds an equal value, set at or after the desire): each such leaf
    leaves desired and its status keeps the confirmation. None when none is confirmed."""
    statuses = current(desired, entries)
    reported_versions = {leaf: unpack(packed)[0]
                         for leaf, packed in leaf_entries(reported, entries.get(REPORTED, {})).items()}
    reported_values, desired_values = leaves(reported), leaves(desired)
    confirmed = [leaf for leaf, status in statuses.items()
                 if status.get("c") and leaf in reported_values
                 and same_value(desired_values[leaf], reported_values[leaf])
                 and reported_versions.get(leaf, 0) >= int(status["v"])]
    if not confirmed:
        return None
    remaining = without_leaves(desired, confirmed)
    kept_statuses = {leaf: status for leaf, status in statuses.items() if leaf not in confirmed}
    done = {leaf: {"v": int(statuses[leaf]["v"]), CONFIRMED: version} for leaf in confirmed}
    return remaining, {**cleared(desired, entries), **done, **kept_statuses}


def kept(desired: dict, entries: dict, keep_cleared: bool = True) -> dict:
    """Desired's statuses as a write that reads leaves them on the item: those that count
    and, with ``keep_cleared``, the newest confirmations of cleared desires, as many as fit
    in ``MAX_CLEARED_KEPT`` and ``MAX_CLEARED_KEPT_BYTES``."""
    statuses = current(desired, entries)
    if not keep_cleared:
        return statuses
    newest, room = {}, MAX_CLEARED_KEPT_BYTES
    newest_first = sorted(cleared(desired, entries).items(), key=lambda item: (int(item[1][CONFIRMED]), item[0]),
                          reverse=True)
    for leaf, status in newest_first:
        room -= pointer_bytes(leaf) + CONFIRMATION_BYTES
        if len(newest) == MAX_CLEARED_KEPT or room < 0:
            break
        newest[leaf] = status
    return {**newest, **statuses}


def clear_pending(desired: dict, entries: dict) -> bool:
    """Whether a report may have to clear a desire (a compiled report, which reads
    nothing, cannot: it is refused and read-modify-write decides)."""
    return any(status.get("c") for status in current(desired, entries).values())
