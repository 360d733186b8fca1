"""Patches as pure update functions of a device's state, so a write loop can re-apply
them to a newer state: RFC 7396 JSON Merge Patch and RFC 6902 JSON Patch (through the
``jsonpatch`` library) with one extension operation, ``increment``."""

from __future__ import annotations

import copy
from collections.abc import MutableMapping, MutableSequence
from decimal import Decimal

import jsonpatch
import jsonpointer

from .errors import InvalidPatch, InvalidValue, PatchNotApplicable, PatchTestFailed
from .values import check_number


class MergePatch:
    """RFC 7396: ``null`` removes a member, objects merge, anything else replaces."""

    def __init__(self, patch):
        if not isinstance(patch, dict):
            raise InvalidPatch("a merge patch of a device's state must be a JSON object")
        self.patch = patch

    def __call__(self, state: dict) -> dict:
        return _merge(state, self.patch)


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
        result = current + self.operation["value"]
        if "min" in self.operation:
            result = max(result, self.operation["min"])
        if "max" in self.operation:
            result = min(result, self.operation["max"])
        if isinstance(subobj, MutableSequence) and part == "-":
            journal.append(subobj, result)
        else:
            journal.setitem(subobj, part, result)
        return obj


class _DevicePatch(jsonpatch.JsonPatch):
    operations = {**jsonpatch.JsonPatch.operations, "increment": IncrementOperation}


_NEEDS_VALUE = {"add", "replace", "test", "increment"}
_NEEDS_FROM = {"move", "copy"}


class JsonPatch:
    """RFC 6902 with paths inside the state; checked whole when built, so a malformed
    document is refused before any read or write."""

    def __init__(self, operations):
        if not isinstance(operations, list):
            raise InvalidPatch("a JSON Patch must be an array of operations")
        for index, operation in enumerate(operations):
            _check_operation(index, operation)
        try:
            self._patch = _DevicePatch(operations)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as error:
            raise InvalidPatch(str(error)) from None
        self.operations = operations

    def __call__(self, state: dict) -> dict:
        try:
            result = self._patch.apply(state, in_place=True)
        except jsonpatch.JsonPatchTestFailed as error:
            raise PatchTestFailed(f"test failed: {error}") from None
        except jsonpatch.InvalidJsonPatch as error:
            raise InvalidPatch(str(error)) from None
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as error:
            raise PatchNotApplicable(str(error)) from None
        if not isinstance(result, dict):
            raise PatchNotApplicable("the patch would make the state something other than an object")
        return result


def _check_operation(index: int, operation) -> None:
    where = f"operation {index}"
    if not isinstance(operation, dict):
        raise InvalidPatch(f"{where} is not an object")
    op = operation.get("op")
    if op not in _DevicePatch.operations:
        raise InvalidPatch(f"{where}: 'op' must be one of {', '.join(sorted(_DevicePatch.operations))}")
    for member in ("path", *(("from",) if op in _NEEDS_FROM else ())):
        pointer = operation.get(member)
        if not isinstance(pointer, str) or (pointer and not pointer.startswith("/")):
            raise InvalidPatch(f"{where}: '{member}' must be a JSON Pointer string ('' or starting with '/')")
        try:
            jsonpointer.JsonPointer(pointer)
        except jsonpointer.JsonPointerException as error:
            raise InvalidPatch(f"{where}: '{member}': {error}") from None
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
