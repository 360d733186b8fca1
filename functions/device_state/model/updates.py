"""What an update function may declare beyond being one. Every write method takes an
``UpdateFn``: a pure function of a section's document returning the new document. The
library's patches (``patches.MergePatch``, ``patches.JsonPatch``) name the leaves they set
(``Touching``) and compile where they can (``write.compiled.compile_patch``); any caller's
update function may declare either capability below."""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

UpdateFn = Callable[[dict], dict]


@runtime_checkable
class Compilable(Protocol):
    """Compiles to one UpdateItem that needs no read: ``compile()`` returns the compiled
    update (``write.compiled.CompiledUpdate``: its expression parts, the members and values it
    names), or None when it cannot, and the write reads and applies the function instead.
    ``section``: the section it applies to; ``nested``: objects in it may compile to
    member-wise sets."""

    def __call__(self, document: dict) -> dict: ...

    def compile(self, section: str = ..., nested: bool = ...) -> Any: ...


@runtime_checkable
class Touching(Protocol):
    """Names the leaves it sets in a document (JSON pointers), so desired and reported
    renew the metadata of those leaves only (without it, of the whole section)."""

    def __call__(self, document: dict) -> dict: ...

    def touched(self, document: dict | None = None) -> list[str]: ...
