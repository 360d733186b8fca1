"""The sections of a device (``state``, ``desired``, ``reported``), the delta between
desired and reported, and per-leaf metadata with confirmation. All pure.

A *leaf* is a scalar, an array (taken whole) or an empty object; it is named by its JSON
Pointer inside its section. ``desired`` and ``reported`` keep per-leaf metadata on the
item (``metaDesired``/``metaReported``): a map from a pointer to one number packing the
device version of the write that set it and that write's time,
``updatedAt_ms * VERSION_SPAN + version``. One number lets a compiled patch, which reads
nothing, set it in its own UpdateItem as ``#version + :stamp`` (DynamoDB evaluates SET
operands against the item before the update; it can add, but cannot build a list).

A compiled patch sets the entry of each member it sets (an object set whole has one entry,
at its own pointer) and removes the entry of each member it removes; it compiles only
where no other entry would outlive a leaf (``write.compiled._one_entry_per_leaf``). A leaf's
metadata is the entry of the newest write among entries at its pointer, at an ancestor (a
write that set a whole object set every leaf in it) and at a descendant (a member removed
from it, which left it an empty object, as items written before that rule may hold): a
stale entry is always older than the write that made it stale, so the newest wins: by
version, not by time (writers' clocks may disagree). Every write that reads stores exactly
one entry per leaf of both sections (``write.versioned._held_sets``): what the size formula counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import jsonpointer

from ..errors import InvalidValue
from ..item import schema
from .times import timestamp
from .updates import Touching
from .values import check_state, from_attribute

STATE, DESIRED, REPORTED = "state", "desired", "reported"
SECTIONS = (STATE, DESIRED, REPORTED)
DEVICE_SECTIONS = (DESIRED, REPORTED)  # the sections with per-leaf metadata
STATUS = "status"  # the key of desired's statuses among a device's entries (model/desires.py)
# The stored per-leaf entries of an item: desired's and reported's metadata, desired's statuses.
ENTRY_ATTRIBUTES = {**schema.META_ATTRIBUTES, STATUS: schema.STATUS_DESIRED}
VERSION_SPAN = 10 ** 16  # versions below this pack with a millisecond time into 29 digits
# The longest JSON Pointer of a desired or reported leaf, escaped, in bytes: it keys the
# leaf's metadata entry, a map key (DynamoDB Local fails past 50,000 bytes with an
# InternalFailure, DynamoDB documents names under 64 KB), and bounds what one leaf's
# metadata adds to the item.
MAX_POINTER_BYTES = 4096
# What one leaf's metadata entry adds to the item beside its pointer: its map slot and a
# number of up to 29 digits (item_size counts 18 bytes for it).
METADATA_ENTRY_BYTES = 19

ALL = ""  # the touched pointer of a write that sets a whole section


def check_section(section) -> str:
    if section not in SECTIONS:
        raise ValueError(f"section must be one of {', '.join(SECTIONS)}")
    return section


def pack(version: int, epoch: float) -> int:
    return int(epoch * 1000) * VERSION_SPAN + version


def unpack(packed) -> tuple[int, str]:
    """(version, updatedAt) of one stored entry."""
    milliseconds, version = divmod(int(packed), VERSION_SPAN)
    return version, timestamp(milliseconds / 1000)


def pointer(parts) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def _parts(path: str) -> list[str]:
    return jsonpointer.JsonPointer(path).parts if path else []


# ------------------------------------------------------------------------- delta


def is_leaf(value) -> bool:
    return not isinstance(value, dict) or not value


def same_value(left, right) -> bool:
    """JSON equality with numbers by exact value (1.0 equals 1) and booleans apart from numbers."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, (int, Decimal)) and isinstance(right, (int, Decimal)):
        return Decimal(left) == Decimal(right)
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same_value(left[key], right[key]) for key in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(same_value(a, b) for a, b in zip(left, right))
    return type(left) is type(right) and left == right


def delta(desired: dict, reported: dict) -> dict:
    """Every desired leaf that ``reported`` lacks or holds differently, at its full path
    with the desired value; ``{}`` when there is no difference."""
    result = {}
    for key, want in desired.items():
        have = reported.get(key) if isinstance(reported, dict) else None
        if not is_leaf(want) and isinstance(have, dict):
            inner = delta(want, have)
            if inner:
                result[key] = inner
        elif not is_leaf(want):
            result[key] = want
        elif not (isinstance(reported, dict) and key in reported and same_value(want, have)):
            result[key] = want
    return result


def leaves(document: dict) -> dict[str, object]:
    """Every leaf of a section by its pointer."""
    found, stack = {}, [((), document)]
    while stack:
        parts, value = stack.pop()
        if parts and is_leaf(value):
            found[pointer(parts)] = value
        elif isinstance(value, dict):
            stack.extend((parts + (key,), member) for key, member in value.items())
    return found


# ---------------------------------------------------------------------- metadata


def leaf_entries(document: dict, entries: dict) -> dict[str, int]:
    """The packed entry of every leaf of ``document`` (0 when none is known): the newest
    entry at the leaf, at an ancestor (looked up on the way down) or at a descendant
    (``_newest_below``). Linear in the leaves and the entries."""
    below = _newest_below(entries)
    found, stack = {}, [(ALL, document, int(entries.get(ALL, 0)))]
    while stack:
        path, value, above = stack.pop()
        if path and is_leaf(value):
            found[path] = max(above, below.get(path, 0), key=version_of)
        elif isinstance(value, dict):
            for key, member in value.items():
                member_path = path + "/" + key.replace("~", "~0").replace("/", "~1")
                stack.append((member_path, member, max(above, int(entries.get(member_path, 0)), key=version_of)))
    return found


def version_of(packed) -> int:
    """The version a packed entry names: entries are ordered by it, never by their time
    (two writers' clocks may disagree; versions never do)."""
    return int(packed) % VERSION_SPAN


def _newest_below(entries: dict) -> dict[str, int]:
    """For every pointer that holds an entry or lies above one, the newest entry at it
    or under it. An entry climbs its ancestors only while it is the newest seen there:
    above a pointer that holds a newer or equal one, every ancestor already does too."""
    newest: dict[str, int] = {}
    for entry, value in entries.items():
        value, end = int(value), len(entry)
        while end > 0 and (entry[:end] not in newest or version_of(newest[entry[:end]]) < version_of(value)):
            newest[entry[:end]] = value
            end = entry.rfind("/", 0, end)
    return newest


def next_entries(document: dict, entries: dict, touched: tuple[str, ...], stamp: int) -> dict[str, int]:
    """The entries after a read-modify-write that set the pointers ``touched``: one per
    leaf, the new ``stamp`` for every leaf a touched pointer covers, lies under or lies
    above. ``InvalidValue`` when a leaf's pointer, the key of its entry, is longer than
    ``MAX_POINTER_BYTES``."""
    current = leaf_entries(document, entries)
    renewed = leaf_entries(document, dict.fromkeys(touched, 1))
    for leaf in current:
        check_pointer(leaf)
    return {leaf: stamp if renewed[leaf] else value for leaf, value in current.items()}


def pointer_bytes(leaf: str) -> int:
    return len(leaf.encode("utf-8", "surrogatepass"))


def longest_leaf_pointer(value) -> int:
    """The bytes of the longest leaf pointer inside ``value`` (0 for a leaf itself)."""
    return max((pointer_bytes(leaf) for leaf in leaves(value)), default=0) if isinstance(value, dict) else 0


def check_pointer(leaf: str) -> str:
    """Refuse a leaf whose JSON Pointer (its metadata entry's key) is longer than ``MAX_POINTER_BYTES``."""
    size = pointer_bytes(leaf)
    if size > MAX_POINTER_BYTES:
        raise InvalidValue(f"a leaf of desired or reported is named by its JSON Pointer, which keys its metadata: "
                           f"at most {MAX_POINTER_BYTES} bytes ('~' and '/' in names count 2 bytes each); "
                           f"one has {size}", limit="leaf-pointer")
    return leaf


@dataclass(frozen=True)
class SectionWrite:
    """A change to one section: the pure ``update_fn`` of its document, and the pointers
    inside the section it sets (its metadata is renewed there); None: the pointers the
    update function says it sets in the document it is applied to (``touched_by``)."""

    section: str
    update_fn: object
    touched: tuple[str, ...] | None = (ALL,)
    options: object = None  # a desired write's ``desires.DesireOptions`` (expiry, clear on confirm)


def replacing(state: dict, sections: dict | None) -> list[SectionWrite]:
    """Section writes replacing the state and the ``sections`` given, each whole."""
    documents = {STATE: state, **(sections or {})}
    return [SectionWrite(section, lambda _, document=document: document) for section, document in documents.items()]


def check_sections(sections: dict | None) -> None:
    """``sections`` names only desired and reported, each a storable object whose leaves'
    pointers (the keys of their metadata) fit ``MAX_POINTER_BYTES``."""
    for section, document in (sections or {}).items():
        if section not in DEVICE_SECTIONS:
            raise InvalidValue(f"sections are {', '.join(DEVICE_SECTIONS)}, not {section!r}", limit="section")
        check_state(document, section)
        for leaf in leaves(document):
            check_pointer(leaf)


def touched_by(update_fn, document: dict | None = None) -> tuple[str, ...]:
    """The pointers a patch sets in ``document`` (``touched()``), or the whole section."""
    return tuple(update_fn.touched(document)) if isinstance(update_fn, Touching) else (ALL,)


def entries_of(item: dict) -> dict:
    """The stored per-leaf entries of an item: metadata of desired and reported, and
    desired's statuses (under ``STATUS``)."""
    return {key: from_attribute(item[attribute]) for key, attribute in ENTRY_ATTRIBUTES.items()
            if attribute in item}


def metadata(desired: dict, reported: dict, entries: dict) -> dict:
    """``{"desired": {...}, "reported": {...}}``: per leaf, nested like the section,
    ``version`` and ``updatedAt``; a desired leaf the device has confirmed (an equal
    reported value set at or after the desire) also carries ``confirmedVersion``."""
    desired_leaves = leaf_entries(desired, entries.get(DESIRED, {}))
    reported_leaves = leaf_entries(reported, entries.get(REPORTED, {}))
    reported_values = leaves(reported)
    desired_values = leaves(desired)
    result = {DESIRED: {}, REPORTED: {}}
    for leaf, packed in desired_leaves.items():
        version, updated_at = unpack(packed)
        entry = {"version": version, "updatedAt": updated_at}
        if leaf in reported_values and same_value(desired_values[leaf], reported_values[leaf]):
            confirmed, _ = unpack(reported_leaves[leaf])
            if confirmed >= version:
                entry["confirmedVersion"] = confirmed
        _place(result[DESIRED], leaf, entry)
    for leaf, packed in reported_leaves.items():
        version, updated_at = unpack(packed)
        _place(result[REPORTED], leaf, {"version": version, "updatedAt": updated_at})
    return result


def _place(tree: dict, leaf: str, entry: dict) -> None:
    *parents, last = _parts(leaf)
    for part in parents:
        tree = tree.setdefault(part, {})
    tree[last] = entry
