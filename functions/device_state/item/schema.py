"""The device's state item: every attribute name and every group of them, declared once, and
a typed reader of a raw (low-level) item. No other module spells one of these names
(``tests/unit/test_item_schema.py`` reads the code for it).

Every item lives in a device's partition (``deviceId``); the sort key ``sk`` says what it is.
The device's own state item is ``sk = "state"``. ``expiresAt`` (epoch seconds) is the table's
TTL attribute: an item whose ``expiresAt`` has passed is treated as absent by every read,
whatever DynamoDB's TTL has deleted yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

PARTITION_KEY = "deviceId"
SORT_KEY = "sk"
STATE_SK = "state"
TTL_ATTRIBUTE = "expiresAt"

# The versioned device: its version, documents and times.
VERSION = "version"
STATE = "state"
DESIRED = "desired"  # what apps want the device to be
REPORTED = "reported"  # what the device says it is
CREATED_AT = "createdAt"
UPDATED_AT = "updatedAt"
DELETED_AT = "deletedAt"  # set on a tombstone: the device was deleted at this time
LAST_WRITE = "lastWrite"  # set only by a replacing write: the stream processor tells replaced from updated
# Per-leaf metadata of desired and reported (model/sections.py): pointer -> packed version and time.
META_DESIRED = "metaDesired"
META_REPORTED = "metaReported"
# Per desired leaf: the device's acknowledgement, the desire's expiry, clear on confirm (model/desires.py).
STATUS_DESIRED = "statusDesired"
CLEAR_PENDING = "clearPending"  # set while a desire is to be cleared by its confirming report
# Set while a kept confirmation of a cleared desire is below an object: a read-free write,
# which cannot list statusDesired, then reads first before it sets a member of desired.
CLEARED_NESTED = "clearedNested"
CHANGED_DESIRED = "changedDesired"  # the version of the last write to desired (what a delta waiter waits for)
CHANGED_REPORTED = "changedReported"

# The device's connectivity, beside its versioned sections (model/connectivity.py).
CONNECTIONS = "connections"  # a string set: one member per open WebSocket connection
CONNECTED_SINCE = "connectedSince"  # ms
LAST_SEEN = "lastSeen"  # ms
# Contention marks (item/contention.py), epoch ms: racedUntil, then contendedUntil.
RACED_UNTIL = "racedUntil"
CONTENDED_UNTIL = "contendedUntil"
# An upper estimate of the item's size: set by every read-modify-write, raised by each
# compiled patch by the most it can add (item/room.py).
ITEM_BYTES = "itemBytes"

# The write journal (item/journal.py): one attribute per recent write, named by its write id,
# holding the version that write produced (0: settled as never applied).
JOURNAL_PREFIX = "w:"
JOURNAL_TRIMMED = "journalTrimmed"  # the newest write-id stamp (ms) trimmed by a write that read the item
JOURNAL_TRIMMED_STAMPS = "journalTrimmedStamps"  # number set: the newest stamps compiled patches dropped

# The active lease holder, recorded on the state item so every write can be fenced (item/fencing.py).
LEASE_TOKEN = "leaseToken"  # the holder's fencing token (its ticket): ordering, never a credential
LEASE_KEY = "leaseKey"  # a digest of the holder's secret lease token: what a write must present
LEASE_UNTIL = "leaseUntil"  # epoch seconds (to the millisecond) when the holder's lease ends
# The last ticket granted, kept when the lease ends, the device is deleted or created again: no
# lower ticket is granted after it (leases/queue.py), so fencing tokens go up in grant order.
LEASE_LAST = "leaseLast"

# The device's credentials (item/credentials.py), billed on every write of the item, so named in one
# letter: a map of each registered, unrevoked credential's id to its expiry (epoch seconds; 0:
# none), what every request of the device's own must find; set once the device has registered a
# certificate: from then on only registered ones open it; the mark of the enrollment that
# provisioned the device, if one did (identity/).
CREDENTIALS = "C"
CERTIFICATE_REQUIRED = "R"
ENROLLMENT = "E"

# The jobs whose desired write reached the device (item/job_marks.py): a map of each job's id to
# its mark, the version that write made and the execution's deadline packed in one number. A
# job's write requires its id absent, so the device gets each job's write at most once.
JOB_MARKS = "jobs"

# Fleet index attributes (fleet/index.py): ``ix:<field>`` per declared field, and the shard.
INDEX_ATTRIBUTE_PREFIX = "ix:"
SHARD_ATTRIBUTE = "ixShard"

# ------------------------------------------------------------------------- groups

SECTIONS = (STATE, DESIRED, REPORTED)  # each section is stored under its own name
META_ATTRIBUTES = {DESIRED: META_DESIRED, REPORTED: META_REPORTED}
CHANGED_ATTRIBUTES = {DESIRED: CHANGED_DESIRED, REPORTED: CHANGED_REPORTED}
# What a state write stores and its change record copies: the sections and their metadata.
SECTION_ATTRIBUTES = (STATE, DESIRED, REPORTED, META_DESIRED, META_REPORTED, STATUS_DESIRED)
LEASE_ATTRIBUTES = (LEASE_TOKEN, LEASE_KEY, LEASE_UNTIL)
CONNECTIVITY_ATTRIBUTES = (CONNECTIONS, CONNECTED_SINCE, LAST_SEEN)
CONTENTION_MARKS = (RACED_UNTIL, CONTENDED_UNTIL)
IDENTITY_ATTRIBUTES = (CREDENTIALS, CERTIFICATE_REQUIRED, ENROLLMENT)
# Kept only in the room the state leaves (item/room.py), beside the journal's entries.
BOOKKEEPING_ATTRIBUTES = frozenset({JOURNAL_TRIMMED, JOURNAL_TRIMMED_STAMPS, *LEASE_ATTRIBUTES, LEASE_LAST,
                                    *CONNECTIVITY_ATTRIBUTES, *CONTENTION_MARKS, *IDENTITY_ATTRIBUTES})
# What a delete takes from the item (its index attributes too): a tombstone keeps its version.
DELETED_WITH_THE_DEVICE = (STATE, *LEASE_ATTRIBUTES, DESIRED, REPORTED, META_DESIRED, META_REPORTED,
                           CHANGED_DESIRED, CHANGED_REPORTED, STATUS_DESIRED, CLEAR_PENDING, CLEARED_NESTED,
                           *CONNECTIVITY_ATTRIBUTES, *IDENTITY_ATTRIBUTES, JOB_MARKS)
# What a create over a tombstone or a settle stub removes.
GONE_ON_CREATE = (DELETED_AT, TTL_ATTRIBUTE, *LEASE_ATTRIBUTES)
# The journal as a compiled patch's view of it keeps it (item/journal.py).
JOURNAL_VIEW = (VERSION, JOURNAL_TRIMMED, JOURNAL_TRIMMED_STAMPS)


def state_key(device_id: str) -> dict:
    return {PARTITION_KEY: {"S": device_id}, SORT_KEY: {"S": STATE_SK}}


def is_expired(item: dict, now_epoch: float) -> bool:
    """True when a raw (low-level) item carries an ``expiresAt`` that has passed."""
    expires = item.get(TTL_ATTRIBUTE)
    return expires is not None and "N" in expires and float(expires["N"]) <= now_epoch


def is_live_state(item: dict | None, now_epoch: float) -> bool:
    """True for a device's live state item: it has a version, is no tombstone, and has not
    expired (tombstones and settle stubs read as absent everywhere)."""
    return item is not None and VERSION in item and DELETED_AT not in item and not is_expired(item, now_epoch)


def is_journal_entry(name: str) -> bool:
    return name.startswith(JOURNAL_PREFIX)


def is_index_attribute(name: str) -> bool:
    return name.startswith(INDEX_ATTRIBUTE_PREFIX) or name == SHARD_ATTRIBUTE


@dataclass(frozen=True)
class StateItem:
    """A raw state item read by name: numbers as ``int``, absent attributes as None."""

    raw: dict

    @classmethod
    def of(cls, raw: dict | None) -> "StateItem":
        return cls(raw or {})

    def __contains__(self, attribute: str) -> bool:
        return attribute in self.raw

    def number(self, attribute: str) -> int | None:
        value = self.raw.get(attribute)
        return int(value["N"]) if value and "N" in value else None

    def text(self, attribute: str) -> str | None:
        value = self.raw.get(attribute)
        return value["S"] if value and "S" in value else None

    def strings(self, attribute: str) -> list[str]:
        return list((self.raw.get(attribute) or {}).get("SS", []))

    @property
    def device_id(self) -> str | None:
        return self.text(PARTITION_KEY)

    @property
    def version(self) -> int | None:
        return self.number(VERSION)

    @property
    def is_versioned(self) -> bool:
        return VERSION in self.raw

    def is_live(self, now_epoch: float) -> bool:
        return is_live_state(self.raw or None, now_epoch)

    def changed(self, section: str) -> int:
        """The version of the last write to ``section`` (desired or reported; 0: none)."""
        return self.number(CHANGED_ATTRIBUTES[section]) or 0

    @cached_property
    def index_attributes(self) -> list[str]:
        """The index attributes the item holds (declared now or once)."""
        return [name for name in self.raw if is_index_attribute(name)]

    def journal_entries(self) -> dict[str, dict]:
        return {name: value for name, value in self.raw.items() if is_journal_entry(name)}

    def present(self, attributes) -> list[str]:
        return [attribute for attribute in attributes if attribute in self.raw]
