"""How much of DynamoDB's 400 KB item a device's state may take: the room every state write
leaves for what later requests add without a state change (the journal, the lease holder,
connectivity, contention marks), and the sizes the planner checks a write against."""

from __future__ import annotations

from ..errors import ItemTooLarge
from ..feed.items import change_item_size
from ..model.device import Device
from ..model.sections import VERSION_SPAN
from ..model.values import MAX_ITEM_BYTES, item_size
from . import schema

# Room a state write leaves on the item for what later requests add without a state change:
# journal entries (up to 16, ~25 bytes each) and the trimmed stamps, settle marks, the lease
# holder and the last ticket granted (~140), connectivity (up to 4 connections of ~31 bytes,
# connectedSince and lastSeen, and where connectivity/connected is declared its index attribute
# and the shard), and the device's credentials (up to 5 of 17 bytes, the certificate flag, its
# enrollment's mark).
BOOKKEEPING_BYTES = 1024
MAX_STATE_ITEM_BYTES = MAX_ITEM_BYTES - BOOKKEEPING_BYTES  # the most a state write may leave on the item
COMPILED_EXTRA_BYTES = 8  # a compiled patch's version gaining a digit
LARGEST_VERSION = {"N": str(VERSION_SPAN - 1)}  # a version or changed mark, as sized for the item's budget
LONGEST_NUMBER_BYTES = 21  # DynamoDB's size of a 38-digit number


def without_bookkeeping(item: dict | None, connectivity_attribute: str | None = None) -> dict:
    """The item without what ``BOOKKEEPING_BYTES`` keeps room for (journal, lease holder,
    connectivity, with its index attribute and, when no other index holds the device, the
    shard)."""
    kept = {name: value for name, value in (item or {}).items()
            if not name.startswith(schema.JOURNAL_PREFIX) and name not in schema.BOOKKEEPING_ATTRIBUTES
            and name != connectivity_attribute}
    if not any(name.startswith(schema.INDEX_ATTRIBUTE_PREFIX) for name in kept):
        kept.pop(schema.SHARD_ATTRIBUTE, None)
    return kept


def checked_size(item: dict, device: Device) -> int:
    """The state item's size after a write, bookkeeping aside; ItemTooLarge unless it
    leaves the bookkeeping room and its change item (what the feed writes for this
    version) fits too."""
    size = item_size(item)
    if size > MAX_STATE_ITEM_BYTES:
        raise ItemTooLarge(f"the device item would be about {size} bytes; the limit is {MAX_STATE_ITEM_BYTES} "
                           f"(DynamoDB's {MAX_ITEM_BYTES} less {BOOKKEEPING_BYTES} kept for leases, the write "
                           "journal and its change record)")
    change_size = change_item_size(device, {name: item[name] for name in schema.SECTION_ATTRIBUTES if name in item})
    if change_size > MAX_ITEM_BYTES:
        raise ItemTooLarge(f"the change record of this version would be about {change_size} bytes; DynamoDB's "
                           f"limit is {MAX_ITEM_BYTES}")
    return size


def most_added(compiled) -> int:
    """The most a compiled patch can add to the item, bookkeeping aside (its journal entry
    is in ``BOOKKEEPING_BYTES``): every member it names and every value it sets, as if all
    were new."""
    added = sum(1 + len(member.encode()) for member in compiled.members)
    added += sum(1 + value_size(value) for value in compiled.attribute_values)
    return added + COMPILED_EXTRA_BYTES


def value_size(attribute: dict) -> int:
    return item_size({"": attribute})
