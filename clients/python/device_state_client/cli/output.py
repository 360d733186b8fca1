"""What the command prints: JSON (one document, or one array streamed a page at a time), YAML,
or tables on a terminal, and problems on stderr. Rich and PyYAML are imported only when a
table or YAML is printed."""

from __future__ import annotations

import json
import re
import sys
from contextlib import contextmanager

from ..values import dumps

FORMATS = ("table", "json", "yaml")


def default_format() -> str:
    """A table on a terminal, JSON when piped."""
    return "table" if sys.stdout.isatty() else "json"


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# --- one document ------------------------------------------------------------------------------


def show(document, output: str, kind: str = "document") -> None:
    """Prints one answer: as JSON, YAML, or the table for its ``kind``."""
    if output == "json":
        _write(_json(document, indent=2) + "\n")
    elif output == "yaml":
        _write(_yaml(document))
    else:
        _console().print(TABLES.get(kind, _fields_table)(document))


def _json(document, indent: int | None = None) -> str:
    """``document`` as JSON, what a terminal would act on (``shown``) in JSON's own escapes
    (``\\u202e``; past U+FFFF a surrogate pair): the same document to any parser."""
    return _UNSHOWABLE.sub(lambda found: json.dumps(found.group())[1:-1], dumps(document, indent=indent))


def _yaml(document) -> str:
    """``document`` as YAML; a string holding what a terminal would act on is double-quoted, where
    PyYAML escapes controls and ``\\uXXXX`` (``\\UXXXXXXXX``) stands for the rest."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def decimal(dumper, number):  # exact digits, as a YAML float
        return dumper.represent_scalar("tag:yaml.org,2002:float", str(number))

    def text(dumper, value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value,
                                       style='"' if _UNSHOWABLE.search(value) else None)

    from decimal import Decimal

    Dumper.add_representer(Decimal, decimal)
    Dumper.add_representer(str, text)
    return shown(yaml.dump(document, Dumper=Dumper, sort_keys=False, allow_unicode=True))


_live = None  # the console a progress display is drawn on, while one is: tables are printed through it


def _console(stderr: bool = False):
    if _live is not None and not stderr:
        return _live
    from rich.console import Console

    class PipedConsole(Console):
        def on_broken_pipe(self) -> None:  # Rich would exit 1 ("refused"): the command's handler decides
            self.quiet = True
            raise BrokenPipeError

    return PipedConsole(stderr=stderr, highlight=False, soft_wrap=False)


def _text(value) -> str:
    if isinstance(value, str):
        return value
    return "-" if value is None else dumps(value)


# What a terminal would act on, reorder or not show at all: C0 and C1 controls (a device's value
# could clear the screen or retitle the window), line and paragraph separators, bidirectional
# marks, embeddings, overrides and isolates, zero-width spaces and invisible tags. Zero-width
# (non-)joiners stay: Persian and Indic words and emoji sequences are spelled with them.
_UNSHOWABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028-\u202e"
                         "\u2060-\u2069\ufeff\U000e0000-\U000e007f]")


def shown(text: str) -> str:
    """``text`` as a terminal shows it, what it would act on written as ``\\uXXXX`` (``\\UXXXXXXXX``)."""
    return _UNSHOWABLE.sub(lambda found: _escape(ord(found.group())), text)


def _escape(code: int) -> str:
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _cell(text: str) -> str:
    """A table cell: shown as it is (``shown``), Rich's markup escaped."""
    from rich.markup import escape

    return escape(shown(text))


def _table(*columns, **options):
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold", **options)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def _fields_table(document):
    """Any object as rows of member and value."""

    table = _table("FIELD", "VALUE")
    if not isinstance(document, dict):
        table.add_row("value", _cell(_text(document)))
        return table
    for name, value in document.items():
        table.add_row(_cell(name), _cell(_text(value)))
    return table


def _device_table(device):
    table = _table("FIELD", "VALUE")
    for name in ("deviceId", "version", "updatedAt"):
        table.add_row(name, _cell(_text(device.get(name))))
    connectivity = device.get("connectivity")
    if connectivity:
        table.add_row("connected", _cell(_text(connectivity.get("connected"))))
    for name in ("state", "desired", "reported", "delta", "metadata"):
        if name in device:
            table.add_row(name, _cell(dumps(device[name], indent=2)))
    return table


def _count_table(answer):
    table = _table("VALUE", "COUNT")
    for group in answer.get("groups") or []:
        table.add_row(_cell(_text(group["value"])), str(group["count"]))
    table.add_row("[bold]total[/bold]", f"[bold]{answer['count']}[/bold]")
    return table


def _delta_table(answer):
    table = _table("DEVICE", "VERSION", "DELTA")
    table.add_row(_cell(answer["deviceId"]), str(answer["version"]), _cell(dumps(answer["delta"], indent=2)))
    return table


FINAL_STATES = ("SUCCEEDED", "FAILED", "TIMED_OUT", "SUPERSEDED", "REMOVED", "CANCELED")


def _job_table(job):
    table = _table("FIELD", "VALUE")
    for name, value in job.items():
        if name == "counts":
            value = "  ".join(f"{state} {count}" for state, count in value.items())
        table.add_row(_cell(name), _cell(_text(value)))
    return table


TABLES = {"device": _device_table, "count": _count_table, "delta": _delta_table, "job": _job_table}


# --- many documents ----------------------------------------------------------------------------


def _device_row(device) -> list[str]:
    if device is None:  # a transaction's delete
        return ["-", "-", "-", "-", "(deleted)"]
    connectivity = device.get("connectivity") or {}
    return [device["deviceId"], str(device["version"]), device.get("updatedAt", "-"),
            _text(connectivity.get("connected")), _text(device.get("state"))]


def _change_row(change) -> list[str]:
    return [change["deviceId"], str(change["version"]), change["kind"], ",".join(change.get("sections") or []),
            _text(change.get("patch"))]


def _event_row(event) -> list[str]:
    return [event["deviceId"], str(event["version"]), event["kind"], ",".join(event.get("sections") or []),
            _text(event.get("delta"))]


def _job_row(job) -> list[str]:
    final = sum(job["counts"].get(state, 0) for state in FINAL_STATES)
    return [job["jobId"], job["status"], f"{final}/{job['total']}", job.get("createdAt", "-"),
            job.get("filter") or f"{job.get('deviceIdCount', '-')} devices"]


def _execution_row(execution) -> list[str]:
    reason = " ".join(str(part) for part in (execution.get("code"), execution.get("reason")) if part is not None)
    return [execution["deviceId"], execution["state"], _text(execution.get("version")),
            _text(execution.get("updatedAt")), reason or "-"]


# kind: (its columns, a document's cells). The last column takes what the terminal has left, one line each.
def _credential_row(credential) -> list[str]:
    return [credential["credentialId"], credential["type"], credential["createdAt"],
            credential.get("expiresAt") or "-", credential.get("thumbprint") or credential.get("enrollmentId") or ""]


def _enrollment_row(enrollment) -> list[str]:
    return [enrollment["enrollmentId"], f"{enrollment['provisioned']}/{enrollment['maxDevices']}",
            enrollment["createdAt"], enrollment.get("expiresAt") or "-", enrollment["idPattern"]]


ROWS = {"devices": (("DEVICE", "VERSION", "UPDATED", "CONNECTED", "STATE"), _device_row),
        "credentials": (("CREDENTIAL", "TYPE", "CREATED", "EXPIRES", "THUMBPRINT / ENROLLMENT"), _credential_row),
        "enrollments": (("ENROLLMENT", "PROVISIONED", "CREATED", "EXPIRES", "ID PATTERN"), _enrollment_row),
        "changes": (("DEVICE", "VERSION", "KIND", "SECTIONS", "PATCH"), _change_row),
        "events": (("DEVICE", "VERSION", "KIND", "SECTIONS", "DELTA"), _event_row),
        "jobs": (("JOB", "STATUS", "DONE", "CREATED", "TARGETS"), _job_row),
        "executions": (("DEVICE", "STATE", "VERSION", "UPDATED", "REASON"), _execution_row)}


class Rows:
    """Rows printed a batch at a time under one header, the columns sized by the first batch
    (so that every later batch lines up under it)."""

    def __init__(self, kind: str):
        self.columns, self.cells = ROWS[kind]
        self.widths: list[int] | None = None

    def print(self, documents: list) -> None:
        from rich.table import Table

        rows = [self.cells(document) for document in documents]
        header = self.widths is None
        if header:
            self.widths = [min(max(len(column), *(len(row[number]) for row in rows)), 40)
                           for number, column in enumerate(self.columns[:-1])]
        table = Table(box=None, pad_edge=False, header_style="bold", show_header=header, expand=True)
        for column, width in zip(self.columns, self.widths):
            table.add_column(column, width=width, min_width=width, no_wrap=True, overflow="ellipsis")
        table.add_column(self.columns[-1], no_wrap=True, overflow="ellipsis", ratio=1)
        for row in rows:
            table.add_row(*map(_cell, row))
        _console().print(table)


def _transaction_table(answer):
    from rich.table import Table

    columns, cells = ROWS["devices"]
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=column != columns[-1], overflow="fold")
    for device in answer["devices"]:
        table.add_row(*map(_cell, cells(device)))
    return table


TABLES["transaction"] = _transaction_table


class Stream:
    """Documents printed as they come: JSON as one array (``lines``: one JSON document a line
    instead, for streams without end), YAML as one sequence (``lines``: one document each), a
    table a batch of rows at a time. Nothing is printed before the first document, and a JSON
    array is closed only when the stream ends well: a listing that failed half way never
    parses as a whole one."""

    def __init__(self, output: str, kind: str, lines: bool = False):
        self.output, self.kind, self.lines = output, kind, lines
        self.count = 0
        self._rows = Rows(kind) if output == "table" else None

    def __enter__(self) -> Stream:
        return self

    def add(self, document) -> None:
        self.add_page([document])

    def add_page(self, documents: list) -> None:
        """A page: on a terminal, a batch of rows; otherwise each document as it is printed."""
        if self._rows is not None and documents:
            self._rows.print(documents)
            self.count += len(documents)
            return
        for document in documents:
            if self.output == "json" and self.lines:
                _write(_json(document) + "\n")
            elif self.output == "json":
                _write(("," if self.count else "[") + "\n" + _json(document))
            else:
                _write("---\n" + _yaml(document) if self.lines else _yaml([document]))
            self.count += 1

    def __exit__(self, failed, *exc_info) -> None:
        if failed is not None or self.lines:
            return
        if self.output == "json":
            _write("\n]\n" if self.count else "[]\n")
        elif self.output == "yaml" and not self.count:
            _write("[]\n")


@contextmanager
def progress(enabled: bool, description: str):
    """A spinner counting what is done (``advance(n)``), or nothing: it shows only when both
    stdout and stderr are terminals, so nothing of it reaches a pipe or a file. It is drawn on
    the console the tables are printed with, which prints them above it."""
    global _live
    if not (enabled and sys.stdout.isatty() and sys.stderr.isatty()):
        yield lambda amount=1: None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = _console()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TextColumn("{task.completed:,} done"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task(description, total=None)
        _live = console
        try:
            yield lambda amount=1: bar.advance(task, amount)
        finally:
            _live = None


@contextmanager
def job_progress(output: str):
    """A callable to show each state of a followed job: on a terminal with a table's output, a
    live progress bar (executions final of the total) over the count of each execution state,
    redrawn in place; otherwise each state printed as it comes (JSON: one document a line)."""
    if output != "table":
        with Stream(output, "job", lines=True) as stream:
            yield stream.add
        return
    if not sys.stdout.isatty():
        yield lambda job: show(job, "table", "job")
        return
    from rich.live import Live

    with Live(console=_console(), auto_refresh=False) as live:
        yield lambda job: live.update(_job_progress(job), refresh=True)


def _job_progress(job):
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    total, counts = job.get("total") or 0, job.get("counts") or {}
    final = sum(counts.get(state, 0) for state in FINAL_STATES)
    head = Table.grid(padding=(0, 1))
    head.add_row(f"[bold]{_cell(job['jobId'])}[/bold]", _cell(job["status"]),
                 ProgressBar(total=total or 1, completed=final, width=40),
                 f"{final}/{total} final" + (", finding devices" if job.get("targeting") else ""))
    states = _table(*counts)
    states.add_row(*(str(count) for count in counts.values()))
    return Group(head, states)


# --- problems ----------------------------------------------------------------------------------


SHOWN_ELSEWHERE = ("type", "title", "status", "detail", "instance", "operations")


def problem_lines(status: int, problem: dict, slug: str) -> list[str]:
    """A problem as a person reads it: status, type and title, the detail, then its other members."""
    lines = [f"error: {status} {slug or 'error'}: {problem.get('title') or ''}".rstrip(": ")]
    if problem.get("detail"):
        lines.append(f"  {problem['detail']}")
    for name, value in problem.items():
        if name not in SHOWN_ELSEWHERE and value is not None:
            lines.append(f"  {name}: {_text(value)}")
    for operation in problem.get("operations") or []:
        lines.append(f"  operations[{operation.get('index')}] {operation.get('deviceId')}: "
                     f"{operation.get('status')} {operation.get('reason')}: {operation.get('detail')}")
    return [shown(line) for line in lines]
