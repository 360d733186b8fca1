"""Change items: what changed between two images of a device's state item (``change_of``,
an RFC 6902 patch over the whole document by ``diff``), and how a change is stored as an
item of the device's partition and read back (``change_item``, ``change_from_item``). See
``changes`` for the log they make."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from ..item import schema
from ..model.connectivity import counted_connections
from ..model.device import Device
from ..model.sections import DESIRED, REPORTED, SECTIONS, STATE, STATUS, VERSION_SPAN, entries_of
from ..model.times import epoch_of, stored_time, timestamp
from ..model.values import MAX_ITEM_BYTES, dumps, from_attribute, item_size, loads
from ..write.expressions import number

# A change item's sort key sorts right before the state item's ("rev#..." < "state", and no other
# item of a device's partition sorts between them: tests/unit/test_item_schema.py checks), so one
# Query reads a page of changes and the state item after them (``ChangeLog.read``).
CHANGE_SK_PREFIX = "rev#"
# Change items were keyed "change#<version>" before; those an older release stored are still read
# where today's key has none (``ChangeLog``), until LEGACY_READ_UNTIL.
LEGACY_CHANGE_SK_PREFIX = "change#"
VERSION_WIDTH = 20  # zero-padded, so sort keys sort as versions do
CREATED, UPDATED, REPLACED, DELETED = "created", "updated", "replaced", "deleted"

# Attributes of a change item (besides deviceId, sk, version, state, createdAt, updatedAt, expiresAt).
PREVIOUS_VERSION = "previousVersion"
KIND = "kind"
PATCH = "patch"  # RFC 6902, as JSON text (no nesting limit to meet)
SECTIONS_CHANGED = "sections"  # the sections the write changed (a list of names)
LOST = "lost"  # true on the marker of a version whose change could not be recorded
ACKS = "acks"  # the device's acknowledgements of desires this write recorded, as JSON text
ACKS_OMITTED = "acksOmitted"  # true when they were more than MAX_ACKS_BYTES (read them in the metadata)
# On a delete's change: the connections the device counted (a string set), which the fan-out closes
# (a delete removes them from the state item; those that follow nothing are found nowhere else).
CLOSING = "closing"
# The most a change carries of its acknowledgements, as JSON: what every form of its item, a
# push message and an event can hold beside the rest (100 acks of long paths and reasons would
# not fit; then the change says acksOmitted and the version's metadata has them).
MAX_ACKS_BYTES = 8192
# The device attributes a change item copies from the new image (besides state).
_COPIED = (schema.DESIRED, schema.REPORTED, schema.META_DESIRED, schema.META_REPORTED, schema.STATUS_DESIRED)
_METADATA = (schema.META_DESIRED, schema.META_REPORTED, schema.STATUS_DESIRED)
SIZE_MARGIN_BYTES = 1024
# A change item carries its sections (a *snapshot*) at every SNAPSHOT_EVERY-th version, at a
# created or replaced version and at a change to desired; between snapshots only its patch
# and metadata, which keeps a device like the reference fleet's (about 530 bytes of values)
# in one write unit instead of two. History rebuilds such a version from the snapshot before
# it, reading at most SNAPSHOT_EVERY - 1 more items, and a change costs about
# 1 + 1 / SNAPSHOT_EVERY write units: at 16, 6 % over the least for at most 15 more reads
# (8 would cost 12 %, 32 would save 3 % for twice the reads).
SNAPSHOT_EVERY = 16
WRITE_UNIT_BYTES = 1024


def change_sk(version: int, prefix: str = CHANGE_SK_PREFIX) -> str:
    return f"{prefix}{version:0{VERSION_WIDTH}d}"


@dataclass(frozen=True)
class Change:
    device_id: str
    version: int
    previous_version: int
    kind: str
    patch: list | None  # None for a delete
    state: dict | None  # None for a delete (and when stored without it: see ``at_version``)
    created_at: str | None
    updated_at: str
    sections: tuple = SECTIONS  # the sections the write changed
    desired: dict | None = None  # None for a delete (and when stored without it)
    reported: dict | None = None
    entries: dict | None = None  # per-leaf entries: metadata of desired and reported, desired's statuses
    lost: bool = False  # its change could not be recorded
    # per section with a changed mark (desired, reported): the version that last changed it,
    # as of this change (empty when the item does not carry them)
    last_changed: dict = field(default_factory=dict)
    acks: tuple = ()  # the acknowledgements of desires this write recorded (``acks_between``)
    acks_omitted: bool = False  # it recorded more than MAX_ACKS_BYTES of them
    closing: tuple = ()  # a delete's: the ids of the connections the device counted until then

    def as_dict(self) -> dict:
        shown = {"deviceId": self.device_id, "version": self.version, "previousVersion": self.previous_version,
                 "kind": self.kind, "sections": list(self.sections), "patch": self.patch,
                 "updatedAt": self.updated_at}
        if self.acks:
            shown["acks"] = list(self.acks)
        if self.acks_omitted:
            shown[ACKS_OMITTED] = True
        return shown

    def device(self) -> Device:
        """The device as it was at this change (not for a delete)."""
        return Device(self.device_id, self.version, self.state, self.created_at or "", self.updated_at,
                      desired=self.desired or {}, reported=self.reported or {}, entries=self.entries or {})


def _version(image: dict | None) -> int:
    return schema.StateItem.of(image).version if image and schema.VERSION in image else 0


def change_of(old: dict | None, new: dict | None) -> Change | None:
    """The change a stream record's images (low-level form) describe, or None when the
    record is not a new version of a device's state item."""
    if not new or new.get(schema.SORT_KEY, {}).get("S") != schema.STATE_SK or schema.VERSION not in new:
        return None
    version, previous = _version(new), _version(old)
    if version <= previous:
        return None  # lease bookkeeping, the journal, a trim: the version did not move
    if schema.DELETED_AT in new:
        kind = DELETED
    elif not old or schema.VERSION not in old or schema.DELETED_AT in old:
        kind = CREATED
    else:
        kind = REPLACED if new.get(schema.LAST_WRITE, {}).get("S") == REPLACED else UPDATED
    before = document(old) if kind != CREATED else {}
    after = document(new) if kind != DELETED else None
    return Change(
        device_id=schema.StateItem.of(new).device_id, version=version, previous_version=version - 1, kind=kind,
        patch=None if after is None else diff(before, after), state=None if after is None else after[STATE],
        created_at=stored_time(new[schema.CREATED_AT]) if schema.CREATED_AT in new else None,
        updated_at=stored_time(new[schema.UPDATED_AT]) if schema.UPDATED_AT in new else new[schema.DELETED_AT]["S"],
        sections=SECTIONS if kind in (CREATED, DELETED) else changed_sections(before, after, new, version),
        desired=after and after[DESIRED], reported=after and after[REPORTED], entries=after and entries_of(new),
        last_changed=_last_changed(new), **_acks(acks_between(old, new) if kind == UPDATED else ()),
        closing=tuple(sorted(counted_connections(old))) if kind == DELETED else ())


def _acks(acks: tuple) -> dict:
    """A change's ``acks``, or ``acks_omitted`` when they are more than ``MAX_ACKS_BYTES``."""
    if acks and len(dumps(list(acks)).encode()) > MAX_ACKS_BYTES:
        return {"acks": (), "acks_omitted": True}
    return {"acks": acks}


def acks_between(old: dict | None, new: dict) -> tuple:
    """The acknowledgements of desires recorded between two images of a state item:
    ``{"path", "version", "code", "reason", "at"}`` for each status whose ack is new."""
    before = entries_of(old or {}).get(STATUS, {})
    found = []
    for leaf, status in sorted(entries_of(new).get(STATUS, {}).items()):
        if "a" in status and {key: status.get(key) for key in "vart"} != {key: before.get(leaf, {}).get(key)
                                                                         for key in "vart"}:
            found.append({"path": leaf, "version": int(status["v"]), "code": int(status["a"]),
                          "reason": status.get("r"), "at": timestamp(int(status["t"]) / 1000)})
    return tuple(found)


def _last_changed(item: dict) -> dict:
    """Per section with a changed mark on ``item`` (a state or change item), its version."""
    return {section: int(item[name]["N"]) for section, name in schema.CHANGED_ATTRIBUTES.items() if name in item}


def document(image: dict | None) -> dict:
    """The whole document of a state image: every section, ``{}`` where it has none."""
    return {section: from_attribute(image[section]) if image and section in image else {}
            for section in SECTIONS}


def changed_sections(before: dict, after: dict, new: dict, version: int) -> tuple:
    """The sections a write changed: those it wrote (desired and reported mark the
    version that last wrote them) or whose document differs; a write that names no
    section wrote the state."""
    written = {section for section in (DESIRED, REPORTED)
               if new.get(schema.CHANGED_ATTRIBUTES[section], {}).get("N") == str(version)}
    differ = {section for section in SECTIONS if not _same(before[section], after[section])}
    changed = written | differ or {STATE}
    return tuple(section for section in SECTIONS if section in changed)


def diff(before, after, path: str = "") -> list[dict]:
    """An RFC 6902 patch that turns ``before`` into ``after``: objects member by member,
    anything else replaced whole when it differs (true and 1 differ)."""
    if isinstance(before, dict) and isinstance(after, dict):
        operations = []
        for name in before:
            if name not in after:
                operations.append({"op": "remove", "path": f"{path}/{_escape(name)}"})
        for name, value in after.items():
            member = f"{path}/{_escape(name)}"
            if name not in before:
                operations.append({"op": "add", "path": member, "value": value})
            else:
                operations.extend(diff(before[name], value, member))
        return operations
    return [] if _same(before, after) else [{"op": "replace", "path": path, "value": after}]


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def apply_patch(state: dict, patch: list) -> dict:
    """``patch`` (as ``diff`` makes it) applied to a copy of ``state``."""
    import jsonpatch  # only a history read needs it; kept off the cold start

    return jsonpatch.apply_patch(copy.deepcopy(state), patch)


def _change_base(change: Change, retention_seconds: int) -> dict:
    item = {
        schema.PARTITION_KEY: {"S": change.device_id}, schema.SORT_KEY: {"S": change_sk(change.version)},
        schema.VERSION: number(change.version), PREVIOUS_VERSION: number(change.previous_version),
        KIND: {"S": change.kind}, schema.UPDATED_AT: {"S": change.updated_at},
        schema.TTL_ATTRIBUTE: number(int(epoch_of(change.updated_at)) + retention_seconds),
    }
    if change.created_at:
        item[schema.CREATED_AT] = {"S": change.created_at}
    item[SECTIONS_CHANGED] = {"L": [{"S": section} for section in change.sections]}
    if change.acks:
        item[ACKS] = {"S": dumps(list(change.acks))}
    if change.acks_omitted:
        item[ACKS_OMITTED] = {"BOOL": True}
    if change.closing:
        item[CLOSING] = {"SS": list(change.closing)}
    return item


def _changed_marks(new_image: dict) -> dict:
    """The state item's changed marks, as the change item carries them: a follower of a section
    learns from any later change whether that section changed since it last heard."""
    return {name: new_image[name] for name in schema.CHANGED_ATTRIBUTES.values() if name in new_image}


def is_snapshot(change: Change) -> bool:
    """Whether ``change``'s item carries its sections whatever they cost (see ``SNAPSHOT_EVERY``).
    A change to desired does: devices follow desired over push, and each message's delta is
    then computed from the item alone; desired writes are an app's, few beside reports."""
    return (change.kind in (CREATED, REPLACED) or change.version % SNAPSHOT_EVERY == 0
            or DESIRED in change.sections)


def write_units(item: dict) -> int:
    return -(-item_size(item) // WRITE_UNIT_BYTES)


def change_item(change: Change, new_image: dict, retention_seconds: int) -> dict:
    """The change item (low-level form): the sections and metadata copied from the stream
    image as they are."""
    item = {**_change_base(change, retention_seconds), **_changed_marks(new_image)}
    if change.state is not None:
        item[schema.STATE] = new_image[schema.STATE]
        item.update({name: new_image[name] for name in _COPIED if name in new_image})
        with_patch = {**item, PATCH: {"S": dumps(change.patch)}}
        if item_size(with_patch) <= MAX_ITEM_BYTES - SIZE_MARGIN_BYTES:
            item = with_patch
    return item


def change_item_size(device: Device, attributes: dict) -> int:
    """The size of the smallest change item that holds ``device``'s sections and metadata
    (``attributes``, low-level form; the most a retention can add to ``expiresAt`` and
    every section name in ``sections`` included): what a state write must leave room for."""
    change = Change(device.device_id, device.version, device.version - 1, REPLACED, None, device.state,
                    device.created_at or None, device.updated_at)
    marks = {name: number(VERSION_SPAN - 1) for name in schema.CHANGED_ATTRIBUTES.values()}
    return item_size({**_change_base(change, 10 ** 10), **marks, **attributes})


def without_sections(change: Change, new_image: dict, retention_seconds: int, metadata: bool) -> dict:
    """The change with its patch but not its sections (history rebuilds them from the
    version before), with the metadata of the new version if ``metadata``."""
    item = {**_change_base(change, retention_seconds), **_changed_marks(new_image), PATCH: {"S": dumps(change.patch)}}
    if metadata:
        item.update({name: new_image[name] for name in _METADATA if name in new_image})
    return item


def device_after(before: Device | None, change: Change) -> Device | None:
    """The device as ``change`` left it: from the sections its item carries, or else from
    ``before`` (the device at the version before it) and its patch, with the metadata its
    item carries. None when it has neither, and for a delete or a lost version."""
    if change.kind == DELETED or change.lost:
        return None
    if change.state is not None:
        return change.device()
    if before is None or before.version != change.previous_version:
        return None
    whole = apply_patch({STATE: before.state, DESIRED: before.desired, REPORTED: before.reported},
                        change.patch)
    return Device(change.device_id, change.version, whole[STATE], change.created_at or "", change.updated_at,
                  desired=whole[DESIRED], reported=whole[REPORTED], entries=change.entries or {})


def lost_marker(change: Change, retention_seconds: int) -> dict:
    return {**_change_base(change, retention_seconds), LOST: {"BOOL": True}}


def change_from_item(item: dict) -> Change:
    state = from_attribute(item[schema.STATE]) if schema.STATE in item else None
    if LOST in item:
        patch = None
    elif PATCH in item:
        patch = loads(item[PATCH]["S"])
    else:
        patch = None if state is None else [{"op": "replace", "path": "", "value": document(item)}]
    sections = tuple(from_attribute(item[SECTIONS_CHANGED])) if SECTIONS_CHANGED in item else SECTIONS
    whole = document(item)
    return Change(
        device_id=schema.StateItem.of(item).device_id, version=schema.StateItem.of(item).version,
        previous_version=int(item[PREVIOUS_VERSION]["N"]), kind=item[KIND]["S"], patch=patch, state=state,
        created_at=item.get(schema.CREATED_AT, {}).get("S"), updated_at=item[schema.UPDATED_AT]["S"],
        sections=sections, desired=whole[DESIRED], reported=whole[REPORTED], entries=entries_of(item),
        lost=LOST in item, last_changed=_last_changed(item),
        acks=tuple(loads(item[ACKS]["S"])) if ACKS in item else (), acks_omitted=ACKS_OMITTED in item,
        closing=tuple(sorted(item[CLOSING]["SS"])) if CLOSING in item else ())
