"""JSON with exact numbers: what the service stores is what the client reads and sends back.
A number with a fraction or an exponent is read as ``Decimal`` (the service keeps 38
significant digits exactly; a float would round them) and written back digit for digit."""

from __future__ import annotations

import json
import re
import uuid
from decimal import Decimal

# The standard library writes no Decimal, and no number text of one's own: each Decimal goes in
# as a string holding this process's random mark and its index, and the quoted mark is then
# replaced by the number's digits. Marks are letters, digits and colons, which JSON writes
# unescaped; a string of the document can hold one only by knowing the mark.
_MARK = f"decimal:{uuid.uuid4().hex}:"
_MARKED = re.compile(f'"{_MARK}(\\d+)"')


def loads(text: str | bytes, exact: bool = True):
    """A JSON document; with ``exact``, numbers with a fraction or an exponent as ``Decimal``.
    ``NaN`` and ``Infinity``, which Python's reader takes but JSON has not, are ``ValueError``."""
    if exact:
        return json.loads(text, parse_float=Decimal, parse_constant=_no_constant)
    return json.loads(text, parse_constant=_no_constant)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def dumps(value, indent: int | None = None, ascii_only: bool = False) -> str:
    """JSON text of ``value`` (as ``json.dumps`` writes it), a ``Decimal`` with its own digits;
    ``ascii_only`` escapes every other character (what a request body is sent as: any string,
    a lone surrogate too, goes out as bytes and the service judges it). NaN and infinities,
    which JSON cannot hold, are refused with ``ValueError``."""
    numbers: list[str] = []

    def number(value):
        if not isinstance(value, Decimal):
            raise TypeError(f"{type(value).__name__} is not a JSON value")
        if not value.is_finite():
            raise ValueError(f"{value} is not a JSON number")
        numbers.append(str(value))
        return f"{_MARK}{len(numbers) - 1}"

    text = json.dumps(value, default=number, indent=indent, ensure_ascii=ascii_only, allow_nan=False)
    return _MARKED.sub(lambda found: numbers[int(found.group(1))], text) if numbers else text
