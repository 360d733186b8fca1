"""JSON with exact numbers: what the service stores is what the client reads and sends back.
A number with a fraction or an exponent is read as ``Decimal`` (the service keeps 38
significant digits exactly; a float would round them) and written back digit for digit."""

from __future__ import annotations

import json
from decimal import Decimal


def loads(text: str | bytes, exact: bool = True):
    """A JSON document; with ``exact``, numbers with a fraction or an exponent as ``Decimal``."""
    return json.loads(text, parse_float=Decimal) if exact else json.loads(text)


def dumps(value, indent: int | None = None, ascii_only: bool = False) -> str:
    """JSON text of ``value`` (separators as ``json.dumps``'), a ``Decimal`` with its own digits;
    ``ascii_only`` escapes every other character (what a request body is sent as: any string,
    a lone surrogate too, goes out as bytes and the service judges it). NaN and infinities,
    which JSON cannot hold, are refused with ``ValueError``."""
    out: list[str] = []
    _write(value, out, indent, 0, ascii_only)
    return "".join(out)


def _write(value, out: list, indent: int | None, level: int, ascii_only: bool) -> None:
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{value} is not a JSON number")
        out.append(str(value))
    elif isinstance(value, dict):
        _write_members(list(value.items()), "{}", out, indent, level, ascii_only)
    elif isinstance(value, (list, tuple)):
        _write_members(list(value), "[]", out, indent, level, ascii_only)
    else:
        out.append(json.dumps(value, ensure_ascii=ascii_only, allow_nan=False))


def _write_members(members: list, brackets: str, out: list, indent: int | None, level: int, ascii_only: bool) -> None:
    opening, closing = brackets
    if not members:
        out.append(opening + closing)
        return
    inner = "" if indent is None else "\n" + " " * (indent * (level + 1))
    out.append(opening)
    for number, member in enumerate(members):
        if number:
            out.append("," if indent is not None else ", ")
        out.append(inner)
        if opening == "{":
            name, member = member
            if not isinstance(name, str):
                raise TypeError(f"an object member name must be a string, not {type(name).__name__}")
            out.append(json.dumps(name, ensure_ascii=ascii_only) + ": ")
        _write(member, out, indent, level + 1, ascii_only)
    out.append("" if indent is None else "\n" + " " * (indent * level))
    out.append(closing)
