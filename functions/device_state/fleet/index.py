"""The fleet index: which device fields are queryable, how each is stored on the state
item, and the DynamoDB global secondary indexes that find devices by them.

A field is declared as ``path:type`` (``FLEET_INDEX``, CDK context ``fleetIndex``), the
path starting with its section (``state/``, ``desired/`` or ``reported/``) and going on as
JSON-pointer segments without the leading slash. Every write that sets a field's section
also sets the field's *index attribute* on the state item, in the same request, when the
value is of the declared type, and removes it otherwise: a value of another type (or an
object, an array, a string over ``MAX_STRING_BYTES``) is not indexed under the field.

Each field has its own sparse index: partition key ``ixShard`` (one of ``SHARDS``, from the
device id, so that ``online = true`` on a million devices spreads over ``SHARDS``
partitions) and sort key the field's index attribute; only devices holding the field are
in it. The index projects keys only: a query reads the devices it finds from the table,
strongly consistent (``fleet_query``).
"""

from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass
from decimal import Decimal

from ..item import schema
from ..model.connectivity import CONNECTED_FIELD, CONNECTIVITY
from ..model.patches import INCREMENT, SET
from ..model.sections import SECTIONS

QUERYABLE = (*SECTIONS, CONNECTIVITY)  # what a path may start with (connectivity: see model/connectivity.py)

SHARDS = 16
# The longest string indexed, in bytes of UTF-8 (DynamoDB takes sort keys up to 1,024): a
# query's cursor carries a value per shard, and 16 of these, with their device ids, stay
# under the 8,192 characters a cursor may have.
MAX_STRING_BYTES = 100
# A table holds at most 20 global secondary indexes; the fleet takes at most this many.
MAX_FIELDS = 10
TYPES = {"string": "S", "number": "N", "boolean": "N"}
MISSING = object()  # a field a document does not hold with its declared type

_STRING_MARK = "="  # DynamoDB keys hold no empty string: every indexed string starts with it
_INDEX_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class FleetIndexError(ValueError):
    """A ``FLEET_INDEX`` declaration that cannot be used, with the reason."""


def shard_of(device_id: str) -> int:
    return zlib.crc32(device_id.encode()) % SHARDS


def split_path(path: str) -> tuple[str, tuple[str, ...]]:
    """``reported/a~1b/c`` → (``reported``, (``a/b``, ``c``)); FleetIndexError unless it
    names a member inside a section."""
    section, _, rest = path.partition("/")
    if section not in QUERYABLE or not rest:
        raise FleetIndexError(f"{path!r}: a path starts with state/, desired/, reported/ or connectivity/ and "
                              "names a member")
    parts = tuple(part.replace("~1", "/").replace("~0", "~") for part in rest.split("/"))
    if any(not part for part in parts) or re.search(r"~(?![01])", rest):
        raise FleetIndexError(f"{path!r}: segments are non-empty, '~' escaped as ~0 and '/' as ~1")
    return section, parts


@dataclass(frozen=True)
class Field:
    """One declared field."""

    section: str
    parts: tuple[str, ...]
    type: str

    @property
    def path(self) -> str:
        return "/".join([self.section, *(part.replace("~", "~0").replace("/", "~1") for part in self.parts)])

    @property
    def attribute(self) -> str:
        """The state item's attribute holding the field's indexed value (the index's sort key):
        ``ix:`` and a digest of the declaration (``type:path``), short because every write of
        the item pays for its name's bytes."""
        return f"{schema.INDEX_ATTRIBUTE_PREFIX}{self._digest}"

    @property
    def index_name(self) -> str:
        return f"ix-{_INDEX_NAME_UNSAFE.sub('_', f'{self.type}-{self.path}')[:200]}-{self._digest}"

    @property
    def _digest(self) -> str:
        return hashlib.sha256(f"{self.type}:{self.path}".encode()).hexdigest()[:8]

    @property
    def key_type(self) -> str:
        return TYPES[self.type]

    def holds(self, value) -> bool:
        """True when ``value`` is of the declared type (and storable as an index key)."""
        if self.type == "boolean":
            return isinstance(value, bool)
        if self.type == "number":
            return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)
        return isinstance(value, str) and len(value.encode()) <= MAX_STRING_BYTES

    def encode(self, value) -> dict | None:
        """The index attribute for ``value``, or None when it is not indexed."""
        if not self.holds(value):
            return None
        if self.type == "boolean":
            return {"N": "1" if value else "0"}
        if self.type == "number":
            return {"N": str(value)}
        return {"S": _STRING_MARK + value}

    def decode(self, attribute: dict):
        if self.type == "boolean":
            return attribute["N"] == "1"
        if self.type == "number":
            number = Decimal(attribute["N"])
            return int(number) if number == number.to_integral_value() else number
        return attribute["S"][len(_STRING_MARK):]

    def value_in(self, documents: dict):
        """The field's value in ``{section: document}``, or MISSING when it is absent or
        not of the declared type."""
        value = value_at(documents.get(self.section) or {}, self.parts)
        return value if value is not MISSING and self.holds(value) else MISSING


@dataclass(frozen=True)
class FleetIndex:
    """The declared fields (none: no index attribute is written, no index exists)."""

    fields: tuple[Field, ...] = ()

    @classmethod
    def parse(cls, declaration: str | None) -> "FleetIndex":
        """``path:type,path:type`` (whitespace around items ignored)."""
        fields = []
        for item in (declaration or "").split(","):
            item = item.strip()
            if not item:
                continue
            path, colon, type_ = item.rpartition(":")
            if not colon or type_ not in TYPES:
                raise FleetIndexError(f"{item!r}: declare a field as path:type, type one of {', '.join(TYPES)}")
            section, parts = split_path(path)
            if section == CONNECTIVITY and (parts != CONNECTED_FIELD or type_ != "boolean"):
                raise FleetIndexError(f"{path!r}: of connectivity, only connectivity/connected:boolean is declarable")
            field = Field(section, parts, type_)
            if any(known.section == section and known.parts == parts for known in fields):
                raise FleetIndexError(f"{path!r} is declared twice")
            fields.append(field)
        if len(fields) > MAX_FIELDS:
            raise FleetIndexError(f"at most {MAX_FIELDS} fields can be declared, not {len(fields)}")
        return cls(tuple(fields))

    def __bool__(self) -> bool:
        return bool(self.fields)

    @property
    def declaration(self) -> str:
        return ",".join(f"{field.path}:{field.type}" for field in self.fields)

    def field(self, section: str, parts: tuple) -> Field | None:
        return next((field for field in self.fields if field.section == section and field.parts == tuple(parts)),
                    None)

    def in_sections(self, sections) -> tuple[Field, ...]:
        return tuple(field for field in self.fields if field.section in sections)

    def attributes(self, device_id: str, documents: dict, sections=SECTIONS) -> tuple[dict, list[str]]:
        """What a write leaving ``documents`` (by section) sets and removes for the fields
        of ``sections``: ``({attribute: value}, [attribute, …])``; the shard goes with
        any value set."""
        sets, removes = {}, []
        for field in self.in_sections(sections):
            value = field.value_in(documents)
            if value is MISSING:
                removes.append(field.attribute)
            else:
                sets[field.attribute] = field.encode(value)
        if sets:
            sets[schema.SHARD_ATTRIBUTE] = {"N": str(shard_of(device_id))}
        return sets, removes

    # ------------------------------------------------------------- the table

    def attribute_definitions(self) -> list[dict]:
        definitions = [{"AttributeName": field.attribute, "AttributeType": field.key_type} for field in self.fields]
        return [{"AttributeName": schema.SHARD_ATTRIBUTE, "AttributeType": "N"}, *definitions] if definitions else []

    def global_secondary_indexes(self) -> list[dict]:
        return [{"IndexName": field.index_name,
                 "KeySchema": [{"AttributeName": schema.SHARD_ATTRIBUTE, "KeyType": "HASH"},
                               {"AttributeName": field.attribute, "KeyType": "RANGE"}],
                 "Projection": {"ProjectionType": "KEYS_ONLY"}} for field in self.fields]


def connectivity_attributes(fleet_index: FleetIndex, device_id: str, connected: bool) -> dict:
    """The index attributes a connectivity change sets where ``connectivity/connected`` is declared."""
    indexed, _ = fleet_index.attributes(device_id, {CONNECTIVITY: {"connected": connected}}, (CONNECTIVITY,))
    return indexed


def compiled_attributes(fields, effects) -> tuple[dict, dict, list[str]]:
    """What a compiled patch with ``effects`` (``CompiledUpdate.effects``) sets and removes
    for ``fields`` (those of its section): ``({attribute: value}, {attribute: SET operand},
    [attribute, …])``. An increment indexes a number field with the patch's own operand
    (DynamoDB evaluates both against the item before the update); any member it sets at
    or above a field gives the field's value, and a removal there, or a member set below
    it (the field becomes an object), removes it."""
    values, operands, removes = {}, {}, []
    for field in fields:
        for parts, kind, payload in effects:
            if parts == field.parts and kind == INCREMENT:
                if field.type == "number":
                    operands[field.attribute] = payload
                else:
                    removes.append(field.attribute)
            elif field.parts[:len(parts)] == parts:
                value = value_at(payload, field.parts[len(parts):]) if kind == SET else MISSING
                encoded = field.encode(value) if value is not MISSING else None
                if encoded is None:
                    removes.append(field.attribute)
                else:
                    values[field.attribute] = encoded
            elif parts[:len(field.parts)] == field.parts:
                removes.append(field.attribute)
    return values, operands, list(dict.fromkeys(removes))  # two members below a field remove it once


def value_at(value, parts: tuple):
    """The member of ``value`` at ``parts`` (object members only), or MISSING."""
    for part in parts:
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value
