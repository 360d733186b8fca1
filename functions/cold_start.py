"""Imported first by the API's handler module: the garbage collector stays off while the
handler's modules import, and ``done()``, at the end of the handler module, freezes what
was imported and turns the collector back on (as it was: a process that had it off keeps
it off).

Importing a handler creates tens of thousands of objects that live as long as the process
(modules, classes, functions, botocore's service model); with the collector on, its
collections keep walking them as they pile up: about 100 collections and 15-20 ms of the
API's cold start (``bench/results/journal-costs.md``). ``gc.freeze()`` moves them into the
permanent generation, so no later collection walks them either (each request's
collections get cheaper), nor writes to their pages after a fork or a SnapStart restore.
What import left as cyclic garbage (little) is frozen with them, once."""

from __future__ import annotations

import gc

_was_enabled = gc.isenabled()
gc.disable()


def done() -> None:
    gc.freeze()
    if _was_enabled:
        gc.enable()
