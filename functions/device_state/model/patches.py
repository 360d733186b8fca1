"""Patches as pure update functions of a device's state, so a write loop can re-apply
them to a newer state: RFC 7396 JSON Merge Patch and RFC 6902 JSON Patch (through the
``jsonpatch`` library) with one extension operation, ``increment``."""

from __future__ import annotations

import copy
import functools
from collections.abc import MutableMapping, MutableSequence
from decimal import Context, Decimal, Inexact, localcontext

import jsonpointer

from ..errors import InvalidPatch, InvalidValue, ItemTooLarge, PatchNotApplicable, PatchTestFailed
from .sections import pointer
from .values import (
    MAX_ITEM_BYTES,
    MAX_PATCH_OPERATIONS,
    MAX_SIGNIFICANT_DIGITS,
    canonical,
    check_member_name,
    check_number,
    dumps,
    significant_digits,
)

_SHOWN_CHARS = 200  # of a value quoted in an error's detail

# Wide enough that a sum or difference of any two numbers DynamoDB holds (exponents -167
# to 125, 38 digits) is exact; Inexact is trapped all the same, so nothing is ever rounded.
_EXACT = Context(prec=400, Emax=999999, Emin=-999999, traps=[Inexact])


def exact(operation, *operands, clamp=lambda result: result) -> Decimal:
    """``operation`` of ``operands`` computed exactly (then ``clamp``ed), or InvalidValue
    (limit ``precision``) when the result needs more significant digits than DynamoDB holds."""
    try:
        with localcontext(_EXACT):
            result = clamp(operation(*(canonical(Decimal(operand)) for operand in operands)))
    except Inexact:  # only for operands no stored state can hold (exponents past DynamoDB's)
        result = None
    if result is None or significant_digits(result) > MAX_SIGNIFICANT_DIGITS:
        raise InvalidValue(f"the exact result needs more than {MAX_SIGNIFICANT_DIGITS} significant digits",
                           limit="precision")
    return canonical(result)


class MergePatch:
    """RFC 7396: ``null`` removes a member, objects merge, anything else replaces."""

    def __init__(self, patch):
        if not isinstance(patch, dict):
            raise InvalidPatch("a merge patch of a device's state must be a JSON object")
        _check_merge_members(patch)
        self.patch = patch

    def __call__(self, state: dict) -> dict:
        return _merge(state, self.patch)

    def touched(self, document: dict | None = None) -> list[str]:
        """The pointers the patch sets or removes (its leaves). Given the ``document`` it
        applies to, those where it changes nothing are left out: an empty object merged
        into an object, a ``null`` for a member the object lacks."""
        return _merge_leaves(self.patch, (), document)


def _merge_leaves(patch: dict, parts: tuple, target) -> list[str]:
    """``target``: the object the patch merges into; anything else (None: unknown) is
    replaced by an object, so every member of the patch sets something."""
    found = []
    for key, value in patch.items():
        present = isinstance(target, dict) and key in target
        if isinstance(value, dict) and value:
            found.extend(_merge_leaves(value, parts + (key,), target[key] if present else None))
        elif isinstance(value, dict) and present and isinstance(target[key], dict):  # {}: merges nothing
            continue
        elif value is None and isinstance(target, dict) and not present:
            continue
        else:
            found.append(pointer(parts + (key,)))
    return found


def _check_merge_members(patch: dict) -> None:
    """Member names within the limit, and at most ``MAX_PATCH_OPERATIONS`` members at all depths."""
    count, stack = 0, [patch]
    while stack:
        node = stack.pop()
        for name, value in node.items():
            count += 1
            if count > MAX_PATCH_OPERATIONS:
                raise InvalidValue(f"a merge patch sets at most {MAX_PATCH_OPERATIONS} members (at all depths); "
                                   "replace the state with PUT instead", limit="patch-members")
            if isinstance(name, str):
                check_member_name(name)
            if isinstance(value, dict):
                stack.append(value)


def _merge(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge(target.get(key), value)
    return target


@functools.cache
def _device_patch():
    """jsonpatch's patch class with ``increment``. Built on first use: jsonpatch (with
    difflib) is imported by the first JSON Patch, not by every cold start (a merge patch,
    the common request, does not need it)."""
    import jsonpatch

    class IncrementOperation(jsonpatch.PatchOperation):
        """``{"op": "increment", "path": ..., "value": n, "min": a, "max": b}``: add ``n``
        (which may be negative) to the number at ``path``, a missing member counting as 0,
        and clamp the result to ``[min, max]`` where given."""

        def _apply(self, obj, journal):
            subobj, part = self.pointer.to_last(obj)
            if part is None:
                raise PatchNotApplicable("increment needs a path to a member, not the whole state")
            if isinstance(subobj, MutableMapping):
                present = part in subobj
            elif isinstance(subobj, MutableSequence):
                if part != "-" and not 0 <= part < len(subobj):
                    raise PatchNotApplicable(f"increment: {self.location} is outside the array")
                present = part != "-"
            else:
                raise PatchNotApplicable(f"increment: the parent of {self.location} is not an object or array")
            current = subobj[part] if present else Decimal(0)
            if isinstance(current, bool) or not isinstance(current, (Decimal, int)):
                raise PatchNotApplicable(f"increment: {self.location} does not hold a number")
            result = exact(Decimal.__add__, current, self.operation["value"], clamp=self._clamp)
            if isinstance(subobj, MutableSequence) and part == "-":
                journal.append(subobj, result)
            else:
                journal.setitem(subobj, part, result)
            return obj


        def _clamp(self, result: Decimal) -> Decimal:
            """The exact sum clamped to [min, max] before it is checked against 38 digits."""
            if "min" in self.operation:
                result = max(result, Decimal(self.operation["min"]))
            if "max" in self.operation:
                result = min(result, Decimal(self.operation["max"]))
            return result


    class _DevicePatch(jsonpatch.JsonPatch):
        operations = {**jsonpatch.JsonPatch.operations, "increment": IncrementOperation}

    return _DevicePatch


_NEEDS_VALUE = {"add", "replace", "test", "increment"}
_NEEDS_FROM = {"move", "copy"}


class JsonPatch:
    """RFC 6902 with paths inside the state; checked whole when built, so a malformed
    document is refused before any read or write."""

    def __init__(self, operations):
        if not isinstance(operations, list):
            raise InvalidPatch("a JSON Patch must be an array of operations")
        if len(operations) > MAX_PATCH_OPERATIONS:
            raise InvalidValue(f"a JSON Patch has at most {MAX_PATCH_OPERATIONS} operations, not {len(operations)}",
                               limit="patch-members")
        for index, operation in enumerate(operations):
            _check_operation(index, operation)
        import jsonpatch

        device_patch = _device_patch()
        try:
            self._steps = [device_patch([operation]) for operation in operations]
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as error:
            raise InvalidPatch(str(error)) from None
        self.operations = operations

    def __call__(self, state: dict) -> dict:
        """The patched state; its errors say which operation failed and why, in the
        document's own terms (paths and JSON values), one operation applied at a time."""
        import jsonpatch

        result, copied = state, 0
        for index, (operation, step) in enumerate(zip(self.operations, self._steps)):
            if operation["op"] == "copy":  # each copy may double the document: 21 would make 2 million of it
                copied += len(dumps(_resolve(result, operation["from"])[0]))
                if copied > MAX_ITEM_BYTES:
                    raise ItemTooLarge(f"operation {index} (copy {operation['path']}): the patch's copies would add "
                                       f"more than {MAX_ITEM_BYTES} bytes, more than an item holds")
            try:
                result = step.apply(result, in_place=True)
            except PatchNotApplicable:
                raise
            except jsonpatch.JsonPatchTestFailed:
                raise PatchTestFailed(_test_failure(index, operation, result)) from None
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError, KeyError,
                    IndexError):
                raise PatchNotApplicable(_not_applicable(index, operation, result)) from None
        if not isinstance(result, dict):
            raise PatchNotApplicable("the patch would make the state something other than an object")
        return result

    def touched(self, document: dict | None = None) -> list[str]:
        """The pointers the patch may set or remove (a move's source too; a test's none)."""
        return [pointer for operation in self.operations if operation["op"] != "test"
                for pointer in (operation["path"], *((operation["from"],) if operation["op"] == "move" else ()))]


def _shown(value) -> str:
    text = dumps(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


def _kind(value) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return "a boolean" if isinstance(value, bool) else "a number"


def _resolve(document, pointer: str, *, parent_only: bool = False):
    """(value, None) at ``pointer``, or (None, why it cannot be reached)."""
    parts = jsonpointer.JsonPointer(pointer).parts
    node, walked = document, ""
    for part in parts[:-1] if parent_only else parts:
        here = walked or "the state"
        walked += "/" + part.replace("~", "~0").replace("/", "~1")
        if isinstance(node, dict):
            if part not in node:
                return None, f"{walked} does not exist"
            node = node[part]
        elif isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node) or (part != "0" and part.startswith("0")):
                return None, f"{walked} is not an element of the array at {here} ({len(node)} elements)"
            node = node[int(part)]
        else:
            return None, f"{here} holds {_kind(node)}, not an object or array"
    if parent_only and parts and not isinstance(node, (dict, list)):
        return None, f"{walked or 'the state'} holds {_kind(node)}, not an object or array"
    return node, None


def _not_applicable(index: int, operation: dict, document) -> str:
    op, path = operation["op"], operation["path"]
    checks = [(operation["from"], False)] if op in _NEEDS_FROM else []
    checks.append((path, op in ("add", "copy", "move")))
    for path_checked, parent_only in checks:
        _, why = _resolve(document, path_checked, parent_only=parent_only)
        if why:
            return f"operation {index} ({op} {path}): {why}"
    if op in ("add", "copy", "move") and path:
        parent, _ = _resolve(document, path, parent_only=True)
        if isinstance(parent, list):
            return f"operation {index} ({op} {path}): not a position in the array ({len(parent)} elements)"
    if op == "move" and (path + "/").startswith(operation["from"] + "/"):
        return f"operation {index} (move {path}): a member cannot move into itself"
    return f"operation {index} ({op} {path}) cannot be applied to the state"


def _test_failure(index: int, operation: dict, document) -> str:
    path = operation["path"]
    found, why = _resolve(document, path)
    found_text = why if why else _shown(found)
    return f"operation {index} (test {path}): expected {_shown(operation['value'])}, found {found_text}"


def _check_operation(index: int, operation) -> None:
    where = f"operation {index}"
    if not isinstance(operation, dict):
        raise InvalidPatch(f"{where} is not an object")
    op = operation.get("op")
    operations = _device_patch().operations
    if not isinstance(op, str) or op not in operations:
        raise InvalidPatch(f"{where}: 'op' must be one of {', '.join(sorted(operations))}")
    for member in ("path", *(("from",) if op in _NEEDS_FROM else ())):
        pointer = operation.get(member)
        if not isinstance(pointer, str) or (pointer and not pointer.startswith("/")):
            raise InvalidPatch(f"{where}: '{member}' must be a JSON Pointer string ('' or starting with '/')")
        try:
            parts = jsonpointer.JsonPointer(pointer).parts
        except jsonpointer.JsonPointerException as error:
            raise InvalidPatch(f"{where}: '{member}': {error}") from None
        for part in parts:
            check_member_name(part)
    if op in _NEEDS_VALUE and "value" not in operation:
        raise InvalidPatch(f"{where}: '{op}' needs a 'value'")
    if op == "increment":
        bounds = {}
        for member in ("value", "min", "max"):
            if member in operation:
                try:
                    bounds[member] = check_number(operation[member])
                except InvalidValue:
                    raise InvalidPatch(f"{where}: increment '{member}' must be a number DynamoDB can hold") from None
        if "min" in bounds and "max" in bounds and bounds["min"] > bounds["max"]:
            raise InvalidPatch(f"{where}: increment 'min' is greater than 'max'")


SET, INCREMENT, REMOVED = "set", "increment", "removed"  # what a compiled patch does to a member
