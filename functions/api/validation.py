"""Checking a value against the JSON Schema a route declares (the subset of OpenAPI 3.0 the
declarations in ``routes`` use), so that what ``/openapi.json`` states and what a request is
held to are one text. Refusals are 400 problems naming where the value is wrong.

Two kinds of node stand beside plain schema dicts; both are dicts, so the document shows them
as the schema they are:

- ``Checked``: a schema whose values the service's own code checks too (a device id, a patch,
  a state document), for what JSON Schema cannot say or a problem type of its own;
- ``Ref``: a ``$ref`` to a component schema that is declared here (the document lists it under
  ``components``), followed when checking.

A ``$ref`` that is a plain dict (a component only the document holds) is not followed."""

from __future__ import annotations

import functools
import re
from decimal import Decimal
from typing import Callable

from .problems import BadRequest, HttpProblem

BODY = "the body"  # where a body's own members are named without a prefix: "the body needs state"


class Checked(dict):
    """``schema`` for the document; ``check(value, where)`` for the service: it returns the value
    the route takes (converted, e.g. a library object) or raises the problem. ``validate``: the
    schema's own keywords are checked first (else ``check`` does it all, as the library's
    checks of its own types do). ``problem``: what that first refusal raises, given its detail
    (BadRequest; a library error where the library's own check would name a limit)."""

    def __init__(self, schema: dict, check: Callable | None = None, *, validate: bool = True,
                 problem: Callable[[str], Exception] = BadRequest):
        super().__init__(schema)
        self.check, self.validate, self.problem = check, validate, problem


class Ref(dict):
    """``{"$ref": "#/components/schemas/<name>"}`` whose target is ``schema``."""

    def __init__(self, name: str, schema: dict):
        super().__init__({"$ref": f"#/components/schemas/{name}"})
        self.name, self.schema = name, schema


def validate(schema: dict, value, where: str = BODY):
    """``value`` held to ``schema``: the value the route takes, or a problem raised."""
    if isinstance(schema, Ref):
        schema = schema.schema
    if not isinstance(schema, Checked):
        return _validate(schema, value, where)
    if schema.validate:
        try:
            value = _validate(schema, value, where)
        except BadRequest as refused:
            if schema.problem is BadRequest:
                raise
            raise schema.problem(refused.detail) from None
    return value if schema.check is None else schema.check(value, where)


def from_text(schema: dict, raw: str, where: str):
    """A query, path or header value (text) held to ``schema``: integers and booleans read from
    their text first (an integer as decimal digits, leading zeros allowed)."""
    kind = schema.get("type")
    if kind == "integer":
        digits = raw.lstrip("0") or raw[:1]
        if not raw.isascii() or not raw.isdigit() or len(digits) > 18:  # every bound here has fewer digits
            raise BadRequest(_rule(schema, where, "an integer"))
        raw = int(digits)
    elif kind == "boolean":
        if raw not in ("true", "false"):
            raise BadRequest(f"{where} must be true or false")
        raw = raw == "true"
    return validate(schema, raw, where)


def within(check: Callable) -> Callable:
    """A check of one argument (the library's: ``JsonPatch``, ``validate_device_id``) as a
    ``Checked`` check; its refusal from inside the body says where it is ("operations[1]: ...")."""
    def checked(value, where: str):
        try:
            return check(value)
        except (HttpProblem, ValueError) as refused:
            if where != BODY:
                if isinstance(refused, HttpProblem):
                    refused.detail = f"{where}: {refused.detail}"
                refused.args = (f"{where}: {refused.args[0] if refused.args else refused}", *refused.args[1:])
            raise

    return checked


def _validate(schema: dict, value, where: str):
    if "anyOf" in schema:
        return _any_of(schema["anyOf"], value, where)
    if value is None and (schema.get("nullable") or schema.get("enum") == [None]):
        return None
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        options = [_shown(option) for option in schema["enum"]]
        raise BadRequest(f"{where} can only be {options[0]}" if len(options) == 1 else
                         f"{where} must be one of {', '.join(options)}")
    if "not" in schema and _valid(schema["not"], value, where):
        raise BadRequest(f"{where} may not be {_shown(value)}")
    kind = schema.get("type")
    return value if kind is None else _TYPES[kind](schema, value, where)


def _same(value, option) -> bool:
    """Equal and of the same JSON type (``True == 1`` in Python, not in JSON)."""
    return isinstance(value, bool) == isinstance(option, bool) and value == option


def _shown(value) -> str:
    return "true" if value is True else "false" if value is False else "null" if value is None else str(value)


def _valid(schema: dict, value, where: str) -> bool:
    try:
        validate(schema, value, where)
    except (HttpProblem, ValueError):
        return False
    return True


def _any_of(branches: list, value, where: str):
    """The first branch ``value`` meets. When it meets none: for an object, the refusal of the
    branch whose required members it has most of, of those it has all of; when it has all of
    none, what it lacks of the branches it lacks least of."""
    refusals = []
    for branch in branches:
        try:
            return validate(branch, value, where)
        except (HttpProblem, ValueError) as refused:
            required = (branch.schema if isinstance(branch, Ref) else branch).get("required", ())
            refusals.append(([name for name in required if name not in value] if isinstance(value, dict) else [],
                             len(required), refused))
    if not isinstance(value, dict):
        raise refusals[0][2]
    complete = [(size, refused) for missing, size, refused in refusals if not missing]
    clash = _clash([branch for branch, (missing, _, _) in zip(branches, refusals) if not missing], value)
    if clash:
        raise BadRequest(f"{where} may hold {' or '.join(clash)}, not both" if len(clash) == 2 else
                         f"{where} may hold only one of {', '.join(clash)}")
    if complete:
        raise max(complete, key=lambda pair: pair[0])[1]
    fewest = min(len(missing) for missing, _, _ in refusals)
    options = list(dict.fromkeys(" and ".join(missing) for missing, _, _ in refusals if len(missing) == fewest))
    raise BadRequest(f"{where} needs {options[0]}" if len(options) == 1 else
                     f"{where} needs one of {', '.join(options)}")


def _clash(complete: list, value: dict) -> list[str]:
    """The members of ``value`` that belong to different forms, when it holds all a form needs of
    two forms or more and each refuses a member another takes (``mergePatch`` beside ``delete``,
    ``ifMatch`` beside ``ifNoneMatch``): said as such, not as an unknown member. Else none."""
    known = [set((branch.schema if isinstance(branch, Ref) else branch).get("properties", {})) for branch in complete]
    strays = [set(value) - members for members in known]
    if len(complete) < 2 or not all(strays) or set(value) - set().union(*known):  # one no form takes: unknown
        return []
    return sorted(set().union(*strays))


def _object(schema: dict, value, where: str):
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be a JSON object")
    missing = [name for name in schema.get("required", ()) if name not in value]
    if missing:
        raise BadRequest(f"{where} needs {', '.join(missing)}")
    properties, extra = schema.get("properties", {}), schema.get("additionalProperties", True)
    unknown = sorted(set(value) - set(properties)) if extra is False else ()
    if unknown:
        raise BadRequest(f"{where} has unknown members: {', '.join(unknown)}")
    if len(value) > schema.get("maxProperties", len(value)):
        raise BadRequest(f"{where} must be empty" if schema["maxProperties"] == 0 else
                         f"{where} has more than {schema['maxProperties']} members")
    extra = extra if isinstance(extra, dict) else None
    prefix = "" if where == BODY else f"{where}."
    return {name: member if properties.get(name, extra) is None else
            validate(properties.get(name, extra), member, prefix + name) for name, member in value.items()}


def _array(schema: dict, value, where: str):
    low, high = schema.get("minItems", 0), schema.get("maxItems")
    if not isinstance(value, list) or len(value) < low or (high is not None and len(value) > high):
        raise BadRequest(f"{where} must be an array" + (f" of {low} to {high} items" if high is not None else ""))
    items = schema.get("items")
    return value if items is None else [validate(items, item, f"{where}[{index}]") for index, item in enumerate(value)]


def _string(schema: dict, value, where: str):
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string")
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    if len(value) < low or (high is not None and len(value) > high):
        raise BadRequest(f"{where} must be {low} to {high} characters" if high is not None else
                         f"{where} must be at least {low} characters")
    if "pattern" in schema and not _pattern(schema["pattern"]).search(value):
        raise BadRequest(f"{where} must match {schema['pattern']}")
    return value


@functools.lru_cache(maxsize=None)
def _pattern(pattern: str) -> re.Pattern:
    """An ECMA-262 pattern as Python reads it: ``$`` at the end is the end of the text (Python's
    also matches before a final newline)."""
    return re.compile(pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern)


def _number(schema: dict, value, where: str, what: str = "a number"):
    """A JSON number (the service reads every number as a Decimal); for ``integer``, a whole one
    (``3`` or ``3.0``, as JSON Schema counts it), taken as an int."""
    # adjusted(), not abs(): abs() rounds to the context, and 1e1000000 is past its exponents (an Overflow, a 500)
    if what == "an integer" and isinstance(value, Decimal) and value.is_finite() \
            and (value.is_zero() or value.adjusted() < 18) \
            and value == value.to_integral_value():
        value = int(value)
    wrong_type = isinstance(value, bool) or not isinstance(value, (int, Decimal) if what == "a number" else int)
    low, high = schema.get("minimum"), schema.get("maximum")
    if wrong_type or (isinstance(value, Decimal) and not value.is_finite()) or \
            (low is not None and value < low) or (high is not None and value > high):
        raise BadRequest(_rule(schema, where, what))
    return value


def _rule(schema: dict, where: str, what: str) -> str:
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and high is not None:
        return f"{where} must be {what} from {low} to {high}"
    return f"{where} must be {what}" + (f" of at least {low}" if low is not None else "")


def _boolean(schema: dict, value, where: str):
    if not isinstance(value, bool):
        raise BadRequest(f"{where} must be true or false")
    return value


_TYPES = {"object": _object, "array": _array, "string": _string, "number": _number, "boolean": _boolean,
          "integer": functools.partial(_number, what="an integer")}
