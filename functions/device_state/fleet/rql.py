"""Fleet filters in RQL (Eclipse Ditto's query language), parsed into a tree, and judged
against one device: ``eq``, ``ne``, ``gt``, ``ge``, ``lt``, ``le``, ``in``, ``like`` (a
prefix ending in ``*``), ``exists``, ``and``, ``or``, ``not``.

A path is a section (``state``, ``desired``, ``reported``; ``delta`` for ``exists``
only) and JSON-pointer segments without the leading slash, unquoted, so it holds no
``,``, ``(`` or ``)``. Values are JSON literals: a string in double quotes (JSON escapes),
a number, ``true`` or ``false``. A hand-written recursive descent parser (see
``docs/decisions.md``): the grammar is twelve operators, and it names the position of
every error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal

from ..errors import InvalidFilter, InvalidValue
from ..model.sections import delta, same_value
from ..model.values import check_number, check_text
from .index import MISSING, FleetIndexError, split_path, value_at
from .limits import MAX_FILTER_CHARS

MAX_NODES = 200
MAX_DEPTH = 32
MAX_IN_VALUES = 100
DELTA = "delta"
COMPARISONS = ("eq", "ne", "gt", "ge", "lt", "le")

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_PATH_END = re.compile(r"[,()]")
_OPERATOR = re.compile(r"[a-z]+")


@dataclass(frozen=True)
class Path:
    section: str
    parts: tuple[str, ...]
    text: str

    def value_in(self, documents: dict):
        return value_at(documents.get(self.section) or {}, self.parts)


@dataclass(frozen=True)
class Compare:
    op: str
    path: Path
    value: object


@dataclass(frozen=True)
class In:
    path: Path
    values: tuple


@dataclass(frozen=True)
class Like:
    path: Path
    prefix: str


@dataclass(frozen=True)
class Exists:
    path: Path


@dataclass(frozen=True)
class And:
    children: tuple


@dataclass(frozen=True)
class Or:
    children: tuple


@dataclass(frozen=True)
class Not:
    child: object


def parse(text: str):
    """The filter tree of ``text``; InvalidFilter naming the position of what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidFilter("filter is empty", 0)
    if len(text) > MAX_FILTER_CHARS:
        raise InvalidFilter(f"filter is longer than {MAX_FILTER_CHARS} characters", MAX_FILTER_CHARS)
    parser = _Parser(text)
    node = parser.expression(0)
    parser.space()
    if parser.at < len(text):
        raise InvalidFilter("unexpected text after the filter", parser.at)
    return node


class _Parser:
    def __init__(self, text: str):
        self.text, self.at, self.nodes = text, 0, 0

    def space(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in " \t\r\n":
            self.at += 1

    def expect(self, char: str) -> None:
        self.space()
        if not self.text.startswith(char, self.at):
            found = repr(self.text[self.at]) if self.at < len(self.text) else "the end"
            raise InvalidFilter(f"expected {char!r}, found {found}", self.at)
        self.at += 1

    def peek(self, char: str) -> bool:
        self.space()
        return self.text.startswith(char, self.at)

    def expression(self, depth: int):
        if depth >= MAX_DEPTH:
            raise InvalidFilter(f"filter nests deeper than {MAX_DEPTH}", self.at)
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise InvalidFilter(f"filter has more than {MAX_NODES} operators", self.at)
        self.space()
        start = self.at
        match = _OPERATOR.match(self.text, self.at)
        operator = match.group() if match else ""
        if operator not in (*COMPARISONS, "in", "like", "exists", "and", "or", "not"):
            raise InvalidFilter("expected one of eq, ne, gt, ge, lt, le, in, like, exists, and, or, not", start)
        self.at = match.end()
        self.expect("(")
        if operator in ("and", "or"):
            children = [self.expression(depth + 1)]
            while self.peek(","):
                self.at += 1
                children.append(self.expression(depth + 1))
            node = (And if operator == "and" else Or)(tuple(children))
        elif operator == "not":
            node = Not(self.expression(depth + 1))
        else:
            node = self.predicate(operator, start)
        self.expect(")")
        return node

    def predicate(self, operator: str, start: int):
        path = self.path(allow_delta=operator == "exists")
        if operator == "exists":
            return Exists(path)
        self.expect(",")
        if operator == "in":
            values = [self.literal()]
            while self.peek(","):
                self.at += 1
                values.append(self.literal())
            if len(values) > MAX_IN_VALUES:
                raise InvalidFilter(f"in takes at most {MAX_IN_VALUES} values", start)
            return In(path, tuple(values))
        where = self.at
        value = self.literal()
        if operator == "like":
            if not isinstance(value, str) or not value.endswith("*") or "*" in value[:-1] or "?" in value:
                raise InvalidFilter('like takes a string prefix ending in *, e.g. like(state/site,"berlin-*")',
                                    where)
            return Like(path, value[:-1])
        return Compare(operator, path, value)

    def path(self, allow_delta: bool) -> Path:
        self.space()
        start = self.at
        end = _PATH_END.search(self.text, start)
        end = end.start() if end else len(self.text)
        text = self.text[start:end].strip()
        if allow_delta and (text == DELTA or text.startswith(DELTA + "/")):
            section, parts = DELTA, ()
            if text != DELTA:
                try:
                    _, parts = split_path("state" + text[len(DELTA):])
                except FleetIndexError:
                    raise InvalidFilter(f"{text!r} is not a path", start) from None
        else:
            try:
                section, parts = split_path(text)
            except FleetIndexError:
                hint = " (delta only in exists)" if text.startswith(DELTA) else ""
                raise InvalidFilter(f"{text!r} is not a path: state/, desired/ or reported/ and a member{hint}",
                                    start) from None
        self.at = end
        return Path(section, parts, text)

    def literal(self):
        self.space()
        start = self.at
        text = self.text
        if text.startswith('"', start):
            decoder = json.JSONDecoder()
            try:
                value, end = decoder.raw_decode(text, start)
                check_text(value)
            except InvalidValue as error:
                raise InvalidFilter(f"the string is not storable text: {error}", start) from None
            except ValueError:
                raise InvalidFilter("unterminated or malformed string", start) from None
            self.at = end
            return value
        for word, value in (("true", True), ("false", False)):
            if text.startswith(word, start):
                self.at = start + len(word)
                return value
        match = _NUMBER.match(text, start)
        if not match:
            raise InvalidFilter('expected a value: a "string", a number, true or false', start)
        self.at = match.end()
        try:
            return check_number(Decimal(match.group()))
        except (InvalidValue, ArithmeticError):
            raise InvalidFilter("the number is outside what a device can hold (38 significant digits, "
                                "1E-130 to 9.99E+125)", start) from None


# --------------------------------------------------------------------- judging


def paths_of(node) -> list[Path]:
    """Every path the filter names, in order."""
    if isinstance(node, (And, Or)):
        return [path for child in node.children for path in paths_of(child)]
    if isinstance(node, Not):
        return paths_of(node.child)
    return [node.path]


def matches(node, documents: dict, holds=lambda path, value: True) -> bool:
    """Whether a device (``{section: document}``) matches the filter. ``holds(path, value)``
    says whether a value counts at that path (a declared field holds only its type): a
    value that does not is treated as absent, as the index treats it."""
    if isinstance(node, And):
        return all(matches(child, documents, holds) for child in node.children)
    if isinstance(node, Or):
        return any(matches(child, documents, holds) for child in node.children)
    if isinstance(node, Not):
        return not matches(node.child, documents, holds)
    path = node.path
    if path.section == DELTA:
        difference = documents[DELTA] if DELTA in documents else delta(documents.get("desired") or {},
                                                                       documents.get("reported") or {})
        return bool(difference) if not path.parts else Path(DELTA, path.parts, "").value_in(
            {DELTA: difference}) is not MISSING
    value = path.value_in(documents)
    if value is MISSING or not holds(path, value):
        return False
    if isinstance(node, Exists):
        return True
    if isinstance(node, In):
        return any(_equal(value, candidate) for candidate in node.values)
    if isinstance(node, Like):
        return isinstance(value, str) and value.startswith(node.prefix)
    if node.op == "eq":
        return _equal(value, node.value)
    if node.op == "ne":
        return not _equal(value, node.value)
    order = _order(value, node.value)
    if order is None:
        return False
    return {"gt": order > 0, "ge": order >= 0, "lt": order < 0, "le": order <= 0}[node.op]


def _kind(value) -> str | None:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float, Decimal)):
        return "number"
    if isinstance(value, str):
        return "string"
    return None


def _equal(value, literal) -> bool:
    return _kind(value) is not None and _kind(value) == _kind(literal) and same_value(value, literal)


def _order(value, literal) -> int | None:
    kind = _kind(value)
    if kind is None or kind != _kind(literal):
        return None
    if kind == "string":  # DynamoDB compares strings by their UTF-8 bytes
        value, literal = value.encode(), literal.encode()
    return (value > literal) - (value < literal)
