"""Enrollments: a group of devices that provision themselves (``provisioning``), each proving
itself with a key derived at the factory from the enrollment's group key. All enrollments live
in one partition (``~enrollments``, never a device id: those have no ``~``), one item each
(``sk = "enrollment#<id>"``), so they list with one query; the group key is stored sealed by
the caller (``functions/auth``), never in the clear."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from re import _constants as sre, _parser  # the parser re.compile itself uses (Python 3.11+)

from ..errors import ConditionNotMet, DeviceStateError, EnrollmentNotFound
from ..item import schema
from ..model.sections import DEVICE_SECTIONS, STATE, check_sections
from ..model.times import timestamp
from ..model.values import MAX_PAGE_BYTES, check_new_id, check_state, from_attribute, item_size, to_attribute
from ..runtime import Runtime
from ..write.expressions import Expression
from ..write.store import IDEMPOTENT, Store

PARTITION = "~enrollments"
SK_PREFIX = "enrollment#"
ENROLLMENT_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_ID_PATTERN_CHARS = 256
MAX_DEVICES = 1_000_000
MAX_LIMIT = 100  # enrollments on a listed page
# A page reads on past deleted enrollments (they stay, so their ids are never used again) at most
# this often: it may then hold fewer than asked, with a cursor, rather than read them all at once.
MAX_READS_PER_PAGE = 10
# The enrollment item's attributes.
_PATTERN, _INITIAL, _MAX_DEVICES, _PROVISIONED, _GROUP_KEY, _CREATED_AT, _UNTIL, _DELETED_AT = (
    "idPattern", "initial", "maxDevices", "provisioned", "groupKey", "createdAt", "until", "endedAt")
# What makes a pattern's matching time grow faster than its input, in its parsed tree: inside a
# repetition (a repeat of more than once), another repetition or an alternation; a backreference.
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)
MAX_ID_PATTERN_REPETITIONS = 3  # a*a*a*b on an id of 128 characters that fails it: about 5 ms
_BACKREFERENCES = (sre.GROUPREF, sre.GROUPREF_EXISTS)


class InvalidEnrollment(DeviceStateError, ValueError):
    """An enrollment's settings cannot be used; the message says which and why."""


class EnrollmentExists(InvalidEnrollment):
    """An enrollment of that id exists, or did (an id names one enrollment for good)."""


@dataclass(frozen=True)
class Enrollment:
    enrollment_id: str
    id_pattern: str
    max_devices: int
    initial: dict = field(default_factory=dict)  # {"state"?, "desired"?} a device starts with
    group_key: bytes = b""  # sealed
    created_at: str = ""
    expires_at: int | None = None  # epoch seconds
    provisioned: int = 0
    deleted: bool = False

    def admits(self, device_id: str) -> bool:
        return re.fullmatch(self.id_pattern, device_id) is not None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def item(self) -> dict:
        stored = {**enrollment_key(self.enrollment_id), _PATTERN: {"S": self.id_pattern},
                  _INITIAL: to_attribute(self.initial), _MAX_DEVICES: {"N": str(self.max_devices)},
                  _PROVISIONED: {"N": str(self.provisioned)}, _GROUP_KEY: {"B": self.group_key},
                  _CREATED_AT: {"S": self.created_at}}
        if self.expires_at is not None:
            stored[_UNTIL] = {"N": str(self.expires_at)}
        return stored

    @classmethod
    def from_item(cls, item: dict) -> "Enrollment":
        return cls(item[schema.SORT_KEY]["S"][len(SK_PREFIX):], item[_PATTERN]["S"], int(item[_MAX_DEVICES]["N"]),
                   from_attribute(item[_INITIAL]), bytes(item[_GROUP_KEY]["B"]), item[_CREATED_AT]["S"],
                   int(item[_UNTIL]["N"]) if _UNTIL in item else None, int(item[_PROVISIONED]["N"]),
                   _DELETED_AT in item)


def enrollment_key(enrollment_id: str) -> dict:
    return {schema.PARTITION_KEY: {"S": PARTITION}, schema.SORT_KEY: {"S": SK_PREFIX + enrollment_id}}


def check_id_pattern(pattern) -> str:
    """A pattern a device id must match whole: a regular expression of at most
    ``MAX_ID_PATTERN_CHARS`` without nested repetition, alternation inside a repetition or
    backreferences (``_runaway``), so matching a 128-character id cannot run away."""
    if not isinstance(pattern, str) or not 1 <= len(pattern) <= MAX_ID_PATTERN_CHARS:
        raise InvalidEnrollment(f"idPattern is a regular expression of 1 to {MAX_ID_PATTERN_CHARS} characters")
    try:
        parsed = _parser.parse(pattern)
        re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as error:  # a repetition past re's bound, {4294967295}
        raise InvalidEnrollment(f"idPattern is not a regular expression: {error}") from None
    found = _runaway(parsed)
    if not found and _choices(parsed) > MAX_ID_PATTERN_REPETITIONS:
        found = (f"more than {MAX_ID_PATTERN_REPETITIONS} repetitions or alternations (each ?, *, +, {{m,n}} "
                 "and a|bc counts: a*a*a*a*b matches in time growing as the id's length to the power of "
                 "their number, a?a?a?...aaa... as 2 to it)")
    if found:
        raise InvalidEnrollment(f"idPattern may not hold {found}: its matching time must not grow "
                                "faster than the id")
    return pattern


def _sub_patterns(av):
    """A parsed node's sub-patterns: a group's, a repetition's, each of a branch's."""
    for arg in av if isinstance(av, tuple) else (av,):
        for part in arg if isinstance(arg, list) else (arg,):
            if isinstance(part, _parser.SubPattern):
                yield part


def _choices(parsed) -> int:
    """How many places the parsed pattern holds, at any depth, where matching chooses and may come
    back to choose again: a repetition whose count varies (``?`` too; a fixed ``{4}`` chooses
    nothing) and an alternation (one of single characters the parser has made a set already)."""
    return sum((op in _REPEATS and av[0] != av[1]) + (op is sre.BRANCH and len(av[1]) > 1)
               + sum(map(_choices, _sub_patterns(av))) for op, av in parsed)


def _runaway(parsed, repeated: bool = False) -> str | None:
    """What in a parsed pattern (``re._parser``) could make matching backtrack without bound, or
    None: any backreference; inside a repetition of more than once (``+``, ``*``, ``{2,}``), at any
    depth, another repetition, ``?`` too (``(a?a?)+`` is as slow as ``(a+)+``), or an alternation
    (``(a|aa)+``; one of single characters the parser has made a character set already)."""
    for op, av in parsed:
        if op in _BACKREFERENCES:
            return "a backreference (such as \\1 or (?P=name))"
        if repeated and op in _REPEATS:
            return "a repetition inside a repeated group (such as (a+)+ or (a?a?)+)"
        if repeated and op is sre.BRANCH and len(av[1]) > 1:
            return "an alternation inside a repeated group (such as (a|aa)+)"
        inner = repeated or (op in _REPEATS and av[1] > 1)
        for part in _sub_patterns(av):
            found = _runaway(part, inner)
            if found:
                return found
    return None


def provisioned_counter(expr: Expression, enrollment_id: str, table_name: str, now: float) -> dict:
    """The part of a provisioning transaction that counts the device against its enrollment:
    only while the enrollment is there, not deleted or expired, and not full."""
    provisioned = expr.name(_PROVISIONED)
    until = expr.name(_UNTIL)
    return {"Update": {
        "TableName": table_name, "Key": enrollment_key(enrollment_id),
        "UpdateExpression": f"ADD {provisioned} {expr.number(1)}",
        "ConditionExpression": (f"attribute_exists({provisioned}) AND attribute_not_exists({expr.name(_DELETED_AT)})"
                                f" AND {provisioned} < {expr.name(_MAX_DEVICES)}"
                                f" AND (attribute_not_exists({until}) OR {until} > {expr.number(int(now))})"),
        **expr.attributes(), "ReturnValuesOnConditionCheckFailure": "ALL_OLD"}}


class Enrollments:
    def __init__(self, store: Store, runtime: Runtime):
        self._store = store
        self._runtime = runtime

    def create(self, enrollment: Enrollment) -> Enrollment:
        """Stores a new enrollment (``created_at`` set now); ``EnrollmentExists`` when one of that
        id exists (deleted ones too: an id names one enrollment for good)."""
        check_new_id("enrollmentId", enrollment.enrollment_id, InvalidEnrollment)
        check_id_pattern(enrollment.id_pattern)
        # The initial documents, checked as a device's create checks its own (InvalidValue): or
        # every device provisioned by this enrollment would be refused.
        initial = enrollment.initial
        check_state(initial.get(STATE, {}))
        check_sections({section: initial[section] for section in DEVICE_SECTIONS if section in initial})
        enrollment = replace(enrollment, created_at=timestamp(self._runtime.clock()), provisioned=0, deleted=False)
        expr = Expression()
        # Only ever a new item: a resend after a lost answer whose first copy landed must not put
        # it again over what was written since (a device provisioned, the enrollment deleted).
        try:
            self._store.send("put_item", IDEMPOTENT, Item=enrollment.item(),
                             ConditionExpression=f"attribute_not_exists({expr.name(_PATTERN)})",
                             ReturnValuesOnConditionCheckFailure="ALL_OLD", **expr.attributes())
        except ConditionNotMet as refused:
            # This create's own first copy, if the item holds its time and its sealed group key (new each
            # create; one left empty marks nothing, and a create without one is never taken as its own).
            found = refused.item or {}
            if (not enrollment.group_key or found.get(_CREATED_AT, {}).get("S") != enrollment.created_at
                    or bytes(found.get(_GROUP_KEY, {}).get("B", b"")) != enrollment.group_key):
                raise EnrollmentExists(f"an enrollment {enrollment.enrollment_id!r} exists already (or did: an id "
                                       "names one enrollment for good)") from None
        return enrollment

    def get(self, enrollment_id: str) -> Enrollment:
        """The enrollment (deleted ones too, marked so); ``EnrollmentNotFound`` when there is none."""
        item = self._store.get(enrollment_key(enrollment_id))
        if item is None:
            raise EnrollmentNotFound(enrollment_id)
        return Enrollment.from_item(item)

    def page(self, limit: int, after: str | None = None) -> tuple[list[Enrollment], str | None]:
        """Enrollments not deleted, by id, after the one ``after`` names: at most ``limit``, whose
        items as stored take at most ``MAX_PAGE_BYTES`` (the first always: an enrollment's initial
        documents may take 64 KB, so a page of 100 could pass what a Lambda may answer). With the
        id the next page starts after, or None when there is no next page."""
        expr = Expression()
        request = {"KeyConditionExpression": f"{expr.name(schema.PARTITION_KEY)} = {expr.value({'S': PARTITION})}",
                   "FilterExpression": f"attribute_not_exists({expr.name(_DELETED_AT)})", "ConsistentRead": True,
                   **expr.attributes()}
        if after is not None:
            request["ExclusiveStartKey"] = enrollment_key(after)
        found: list[Enrollment] = []
        size = 0
        for _ in range(MAX_READS_PER_PAGE):
            answer = self._store.send("query", **request, Limit=limit - len(found))
            for item in answer.get("Items", []):
                size += item_size(item)
                if found and size > MAX_PAGE_BYTES:
                    return found, found[-1].enrollment_id
                found.append(Enrollment.from_item(item))
            if "LastEvaluatedKey" not in answer:
                return found, None
            request["ExclusiveStartKey"] = answer["LastEvaluatedKey"]
            if len(found) >= limit:
                break
        return found, request["ExclusiveStartKey"][schema.SORT_KEY]["S"][len(SK_PREFIX):]

    def delete(self, enrollment_id: str) -> None:
        """Ends an enrollment: no device provisions with it any more (the devices it provisioned
        keep their credentials). It stays, marked deleted, so its id is never used again and a
        device that tries it learns it ended. ``EnrollmentNotFound``."""
        expr, deleted_at = Expression(), timestamp(self._runtime.clock())
        deleted, ours = expr.name(_DELETED_AT), expr.value({"S": deleted_at})
        try:
            self._store.send("update_item", IDEMPOTENT, Key=enrollment_key(enrollment_id),
                             UpdateExpression=f"SET {deleted} = {ours}",
                             ConditionExpression=f"attribute_exists({expr.name(_PATTERN)}) AND "
                                                 f"(attribute_not_exists({deleted}) OR {deleted} = {ours})",
                             **expr.attributes())
        except ConditionNotMet:  # none, or deleted before (a resend of this one's own finds its time)
            raise EnrollmentNotFound(enrollment_id) from None
