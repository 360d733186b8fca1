"""The command reference of docs/cli.md, written from the commands' own help:
``python -m device_state_client.cli.reference docs/cli.md`` rewrites everything after the
reference's heading, so the page cannot drift from the commands."""

from __future__ import annotations

import sys

import click

from . import CONTEXT, main

HEADING = "## Command reference"
# What Click fills on a terminal at least as wide as the help's widest (its max_content_width):
# that width less the 2 columns it keeps free.
WIDTH = CONTEXT["max_content_width"] - 2


def help_text(command: click.Command, path: list[str]) -> str:
    """``command --help`` as a terminal of ``max_content_width`` columns or more shows it
    (``path``: its names from the top)."""
    context, group = None, None
    for name in path[:-1]:  # the groups above it, whose contexts it inherits settings from
        group = main if group is None else group.commands[name]
        context = click.Context(group, info_name=name, parent=context, **_settings(group))
    return command.get_help(click.Context(command, info_name=path[-1], parent=context, **_settings(command)))


def _settings(command: click.Command) -> dict:
    return {**command.context_settings, "terminal_width": WIDTH}


def commands() -> list[tuple[list[str], click.Command]]:
    """Every command with its path of names, the top one first, groups before their commands."""
    found = [(["device-state"], main)]

    def walk(group: click.Group, path: list[str]) -> None:
        for name in sorted(group.commands):
            command = group.commands[name]
            found.append(([*path, name], command))
            if isinstance(command, click.Group):
                walk(command, [*path, name])

    walk(main, ["device-state"])
    return found


def reference() -> str:
    """The reference section: each command's help, in a block that says it is not run."""
    parts = [HEADING, "",
             "Each command's `--help`, as it prints it. Global options (`--endpoint`, `--token`,",
             "`--profile`, …) go before the command, the command's own after it.", ""]
    for path, command in commands():
        parts += [f"### `{' '.join(path)}`", "",
                  "<!-- not-run: the command's help text, written from the command itself -->",
                  "```text", help_text(command, path).rstrip(), "```", ""]
    return "\n".join(parts)


def rewrite(document: str) -> str:
    """``document`` with everything from the reference's heading on written afresh."""
    head, found, _ = document.partition(HEADING)
    if not found:
        raise ValueError(f"no {HEADING!r} heading in the document")
    return head + reference()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m device_state_client.cli.reference docs/cli.md")
    with open(sys.argv[1], encoding="utf-8") as file:
        text = file.read()
    with open(sys.argv[1], "w", encoding="utf-8") as file:
        file.write(rewrite(text))
