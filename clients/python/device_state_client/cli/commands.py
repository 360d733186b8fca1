"""The device commands: each parses its input, makes one ``AppClient`` call (or a stream of
them) and prints the answer."""

from __future__ import annotations

import sys
import time

import click

from . import (ID, REFUSED, example, if_match_option, include_option, lease_token_for, main, output_option,
               write_options)


def read_json(value: str, what: str):
    """JSON from the argument itself, from a file (``@file.json``) or from stdin (``-``)."""
    from ..values import loads

    where = "stdin" if value == "-" else value[1:] if value.startswith("@") else "the argument"
    try:
        if value == "-":
            text = sys.stdin.buffer.read().decode("utf-8")  # strictly: the locale may let stray bytes through
        elif value.startswith("@"):
            with open(value[1:], encoding="utf-8") as file:
                text = file.read()
        else:
            text = value
    except OSError as error:
        raise click.BadParameter(f"cannot read {where}: {error.strerror}", param_hint=what) from None
    except UnicodeDecodeError:
        raise click.BadParameter(f"{where} is not UTF-8 text", param_hint=what) from None
    try:
        return loads(text)
    except ValueError as error:
        raise click.BadParameter(f"{where} is not JSON: {error}", param_hint=what) from None
    except RecursionError:
        raise click.BadParameter(f"{where} nests deeper than this program reads", param_hint=what) from None


def _object(value: str, what: str) -> dict:
    document = read_json(value, what)
    if not isinstance(document, dict):
        raise click.BadParameter("must be a JSON object", param_hint=what)
    return document


def _patch(value: str, what: str):
    """A merge patch (an object) or a JSON Patch (an array)."""
    document = read_json(value, what)
    if not isinstance(document, (dict, list)):
        raise click.BadParameter("must be a JSON object (merge patch) or array (JSON Patch)", param_hint=what)
    return document


def _session():
    return click.get_current_context().obj


# --- reading -----------------------------------------------------------------------------------


@main.command(epilog=example("device-state get lamp-1", "device-state get lamp-1 --include metadata -o yaml"))
@click.argument("device_id", metavar="ID", type=ID)
@include_option
@output_option
def get(device_id, include, output):
    """Show a device: its state, desired, reported and delta."""
    session = _session()
    from .output import show

    show(session.client().get(device_id, metadata=include == "metadata"), session.output(output), "device")


@main.command("list", epilog=example("device-state list --limit 20",
                                     "device-state list --filter 'lt(reported/battery,20)' --sort -reported/battery",
                                     "device-state list -o json > fleet.json"))
@click.option("--filter", "filter_", metavar="RQL", help="Only the devices this fleet query matches "
                                                         "(declared fields: docs/api/fleet-query.md).")
@click.option("--sort", metavar="±PATH", help="+path or -path: order by a declared field (needs --filter).")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="At most this many devices.")
@click.option("--page-size", "page_size", type=click.IntRange(1, 100), default=100, show_default=True, metavar="N",
              help="Devices per request.")
@include_option
@output_option
def list_devices(filter_, sort, limit, page_size, include, output):
    """List devices, or those a fleet query matches.

    The devices are read and printed a page at a time, in the memory of one page; piped, they
    form one JSON array."""
    session = _session()
    from .output import Stream, progress

    client, output = session.client(), session.output(output)
    remaining = limit
    with progress(True, "listing devices") as advance, Stream(output, "devices") as printed:
        for page in client.pages(filter_, sort, min(page_size, limit or page_size), include == "metadata"):
            items = page["items"] if remaining is None else page["items"][:remaining]
            printed.add_page(items)
            advance(len(items))
            if remaining is not None:
                remaining -= len(items)
                if remaining <= 0:
                    break


@main.command(epilog=example("device-state count --filter 'exists(reported/firmware)' --group-by reported/firmware"))
@click.option("--filter", "filter_", metavar="RQL", required=True, help="The fleet query to count.")
@click.option("--group-by", "group_by", metavar="PATH", help="Also count per value of this declared field.")
@output_option
def count(filter_, group_by, output):
    """Count the devices a fleet query matches, per value of a field if asked."""
    session = _session()
    from .output import show

    show(session.client().count(filter_, group_by), session.output(output), "count")


@main.command(epilog=example("device-state delta lamp-1", "device-state delta lamp-1 --since 4 --wait 20"))
@click.argument("device_id", metavar="ID", type=ID)
@click.option("--since", type=click.IntRange(min=0), metavar="VERSION",
              help="With --wait: answer once a write after this version changed desired or reported.")
@click.option("--wait", type=click.IntRange(0, 20), metavar="SECONDS", help="Long-poll up to this long.")
@output_option
def delta(device_id, since, wait, output):
    """Show what a device is asked to do: desired leaves it has not reported."""
    session = _session()
    from .output import show

    show(session.client().delta(device_id, since, wait), session.output(output), "delta")


@main.command(epilog=example("device-state changes lamp-1 --since 0",
                             "device-state changes lamp-1 --follow -o json | jq .version"))
@click.argument("device_id", metavar="ID", type=ID)
@click.option("--since", type=click.IntRange(min=0), default=0, show_default=True, metavar="VERSION",
              help="The changes after this version.")
@click.option("--follow", "-f", is_flag=True, help="Then wait for new ones and print each as it comes "
                                                   "(JSON: one change a line).")
@click.option("--sections", metavar="LIST", help="Only changes to these sections (state,desired,reported).")
@click.option("--count", "stop_after", type=click.IntRange(min=1), metavar="N", help="Stop after N changes.")
@output_option
def changes(device_id, since, follow, sections, stop_after, output):
    """Print a device's changes, oldest first; with --follow, without end."""
    session = _session()
    from .output import Stream

    printed = 0
    with Stream(session.output(output), "changes", lines=follow) as stream:
        for change in session.client().changes(device_id, since, follow=follow, sections=sections):
            stream.add(change)
            printed += 1
            if stop_after is not None and printed >= stop_after:
                break


@main.command(epilog=example("device-state history lamp-1 3"))
@click.argument("device_id", metavar="ID", type=ID)
@click.argument("version", type=click.IntRange(min=1))
@include_option
@output_option
def history(device_id, version, include, output):
    """Show a device as it was at a version (within the feed's retention)."""
    session = _session()
    from .output import show

    show(session.client().history(device_id, version, include == "metadata"), session.output(output), "device")


@main.command(epilog=example("device-state watch lamp-1 lamp-2", "device-state watch lamp-1 --since 0 -o json"))
@click.argument("device_ids", metavar="ID...", nargs=-1, required=True, type=ID)
@click.option("--since", type=click.IntRange(min=0), metavar="VERSION",
              help="Each device's changes after this version (default: from its version as read at start).")
@click.option("--sections", metavar="LIST", help="Only changes to these sections (state,desired,reported).")
@click.option("--count", "stop_after", type=click.IntRange(min=1), metavar="N", help="Stop after N changes.")
@output_option
def watch(device_ids, since, sections, stop_after, output):
    """Follow devices as they change, pushed over one WebSocket.

    At most 100 devices. Each version of each device comes once and in order, across
    reconnects. JSON: one change a line, with the delta after it; a line with "resynced": true carries the whole device when
    changes were past the feed's retention. Why a connection ended goes to stderr as it
    reconnects."""
    session = _session()
    from ..follow import Resynced
    from .output import Stream

    try:
        follower = session.client().follow(device_ids, since, sections.split(",") if sections else None,
                                           on_reconnect=_Reconnecting())
    except ValueError as error:  # too many devices, a section that is none
        raise click.UsageError(str(error)) from None
    printed = 0
    with Stream(session.output(output), "events", lines=True) as stream:
        for event in follower:
            if isinstance(event, Resynced):
                stream.add({"deviceId": event.device_id, "version": event.version, "kind": "resynced",
                            "resynced": True, "device": event.device, "delta": event.device.get("delta")})
            else:
                stream.add({"deviceId": event.device_id, "version": event.version,
                            "previousVersion": event.previous_version, "kind": event.kind,
                            "sections": list(event.sections), "patch": event.patch, "delta": event.delta,
                            "updatedAt": event.updated_at})
            printed += 1
            if stop_after is not None and printed >= stop_after:
                break


class _Reconnecting:
    """Says on stderr why the watch's connection ended and that it connects again: at once, then
    at most every ``EVERY_SECONDS`` (with how many more since), so a service down shows and a
    flapping one does not flood."""

    EVERY_SECONDS = 30

    def __init__(self, clock=time.monotonic):
        self.clock, self.said_at, self.unsaid = clock, None, 0

    def __call__(self, why: str) -> None:
        if self.said_at is not None and self.clock() - self.said_at < self.EVERY_SECONDS:
            self.unsaid += 1
            return
        from .output import shown

        more = f" ({self.unsaid} more since the last said)" if self.unsaid else ""
        click.echo(shown(f"reconnecting: {why}{more}"), err=True)
        self.said_at, self.unsaid = self.clock(), 0


# --- writing -----------------------------------------------------------------------------------


@main.command(epilog=example("device-state create lamp-1 '{\"state\": {\"power\": \"on\"}, \"desired\": "
                             "{\"brightness\": 80}}'", "device-state create lamp-2 @lamp.json"))
@click.argument("device_id", metavar="ID", type=ID)
@click.argument("body", metavar="[JSON]", default='{"state": {}}')
@click.option("--idempotency-key", "idempotency_key", metavar="KEY",
              help="The write's Idempotency-Key (default: a new one).")
@include_option
@output_option
def create(device_id, body, idempotency_key, include, output):
    """Create a device.

    JSON is the body of POST /devices less the id: {"state", "desired", "reported"}, each
    optional (default {"state": {}}). Like every JSON argument, it may be @file to read a file
    or - to read stdin."""
    session = _session()
    from .output import show

    document = _object(body, "JSON")
    answer = session.client().create(device_id, document, idempotency_key=session.write_key(idempotency_key),
                                     metadata=include == "metadata")
    show(answer, session.output(output), "device")


@main.command(epilog=example("device-state put lamp-1 '{\"state\": {\"power\": \"off\"}}' --if-match 3"))
@click.argument("device_id", metavar="ID", type=ID)
@click.argument("body", metavar="JSON")
@if_match_option
@click.option("--create-only", "create_only", is_flag=True, help="Only create (If-None-Match: *; 412 if it exists).")
@write_options
@output_option
def put(device_id, body, if_match, create_only, lease_token, idempotency_key, output):
    """Create or replace a device whole.

    JSON is {"state", "desired", "reported"}: state, which it needs, replaces the device's;
    desired and reported replace theirs when given and are kept as they are when left out."""
    session = _session()
    from .output import show

    answer = session.client().put(device_id, _object(body, "JSON"), if_match=if_match, create_only=create_only,
                                  lease_token=lease_token_for(device_id, lease_token),
                                  idempotency_key=session.write_key(idempotency_key))
    show(answer, session.output(output), "device")


@main.command(epilog=example("device-state patch lamp-1 --merge '{\"power\": \"off\"}' --if-match 4",
                             "device-state patch lamp-1 --json-patch "
                             "'[{\"op\": \"increment\", \"path\": \"/brightness\", \"value\": 10, \"max\": 100}]'"))
@click.argument("device_id", metavar="ID", type=ID)
@click.option("--merge", metavar="JSON", help="A JSON Merge Patch (RFC 7396) of state.")
@click.option("--json-patch", "json_patch", metavar="JSON",
              help="A JSON Patch (RFC 6902, with increment) of state.")
@if_match_option
@write_options
@output_option
def patch(device_id, merge, json_patch, if_match, lease_token, idempotency_key, output):
    """Change a device's state by a merge patch or a JSON Patch.

    Without --if-match the service applies the patch to the newest state, however many
    writers race it; with it, only at that version."""
    session = _session()
    from .output import show

    if (merge is None) == (json_patch is None):
        raise click.UsageError("give one of --merge and --json-patch")
    document = _object(merge, "--merge") if merge is not None else read_json(json_patch, "--json-patch")
    if json_patch is not None and not isinstance(document, list):
        raise click.BadParameter("must be a JSON array of operations", param_hint="--json-patch")
    answer = session.client().patch(device_id, document, if_match=if_match,
                                    lease_token=lease_token_for(device_id, lease_token),
                                    idempotency_key=session.write_key(idempotency_key))
    show(answer, session.output(output), "device")


@main.command(epilog=example("device-state desire lamp-1 '{\"brightness\": 80}' --expires-in 3600 "
                             "--clear-on-confirm"))
@click.argument("device_id", metavar="ID", type=ID)
@click.argument("body", metavar="JSON")
@click.option("--expires-in", "expires_in", type=click.IntRange(1, 2_592_000), metavar="SECONDS",
              help="The leaves it sets leave the delta after this long unless reported by then.")
@click.option("--clear-on-confirm", "clear_on_confirm", is_flag=True,
              help="The leaves it sets leave desired once the device reports them equal.")
@if_match_option
@write_options
@output_option
def desire(device_id, body, expires_in, clear_on_confirm, if_match, lease_token, idempotency_key, output):
    """Ask a device for something: merge-patch (or JSON Patch) its desired."""
    session = _session()
    from .output import show

    answer = session.client().desire(device_id, _patch(body, "JSON"), expires_in=expires_in,
                                     clear_on_confirm=clear_on_confirm, if_match=if_match,
                                     lease_token=lease_token_for(device_id, lease_token),
                                     idempotency_key=session.write_key(idempotency_key))
    show(answer, session.output(output), "device")


@main.command(epilog=example("device-state report lamp-1 '{\"brightness\": 80}'"))
@click.argument("device_id", metavar="ID", type=ID)
@click.argument("body", metavar="JSON")
@if_match_option
@write_options
@output_option
def report(device_id, body, if_match, lease_token, idempotency_key, output):
    """Say what a device is: merge-patch (or JSON Patch) its reported.

    Needs the devices.report scope (a gateway reporting for its devices)."""
    session = _session()
    from .output import show

    answer = session.client().report(device_id, _patch(body, "JSON"), if_match=if_match,
                                     lease_token=lease_token_for(device_id, lease_token),
                                     idempotency_key=session.write_key(idempotency_key))
    show(answer, session.output(output), "device")


@main.command(epilog=example("device-state delete lamp-1 --if-match 7", "device-state delete lamp-1 --yes"))
@click.argument("device_id", metavar="ID", type=ID)
@click.option("--yes", "-y", is_flag=True, help="Do not ask (nothing is asked when stdin is not a terminal).")
@if_match_option
@write_options
def delete(device_id, yes, if_match, lease_token, idempotency_key):
    """Delete a device (its versions go on if it is created again)."""
    session = _session()
    if not yes and sys.stdin.isatty() and not click.confirm(f"Delete {device_id}?", err=True):
        raise click.exceptions.Exit(REFUSED)
    session.client().delete(device_id, if_match=if_match, lease_token=lease_token_for(device_id, lease_token),
                            idempotency_key=session.write_key(idempotency_key))
    if sys.stdout.isatty():
        click.echo(f"deleted {device_id}")


@main.command(epilog=example("device-state tx operations.json",
                             "echo '[{\"deviceId\": \"lamp-1\", \"mergePatch\": {\"power\": \"off\"}}]' "
                             "| device-state tx -"))
@click.argument("file", metavar="FILE")
@click.option("--idempotency-key", "idempotency_key", metavar="KEY",
              help="The write's Idempotency-Key (default: a new one).")
@include_option
@output_option
def tx(file, idempotency_key, include, output):
    """Apply a transaction: all of its operations or none.

    FILE (a path, @path, - for stdin, or the JSON itself) holds {"operations": [...]} or the
    array of operations (docs/api/keys-transactions-leases.md)."""
    session = _session()
    from .output import show

    source = file if file == "-" or file.startswith(("@", "{", "[")) else "@" + file
    document = read_json(source, "FILE")
    operations = document.get("operations") if isinstance(document, dict) else document
    if not isinstance(operations, list):
        raise click.BadParameter('holds no list of operations (an array, or {"operations": [...]})',
                                 param_hint="FILE")
    operations = [{**operation, "leaseToken": token} if isinstance(operation, dict) and "leaseToken" not in operation
                  and (token := lease_token_for(str(operation.get("deviceId")), None)) else operation
                  for operation in operations]  # under device-state lease, those on its device carry its token
    answer = session.client().transaction(operations, metadata=include == "metadata",
                                          idempotency_key=session.write_key(idempotency_key))
    show(answer, session.output(output), "transaction")


@main.command(context_settings={"ignore_unknown_options": True},
              epilog=example("device-state lease lamp-1 --ttl 30 -- ./update-firmware.sh lamp-1",
                             "device-state lease lamp-1 -- device-state patch lamp-1 --merge '{\"firmware\": \"2.1\"}'"))
@click.argument("device_id", metavar="ID", type=ID)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- COMMAND...")
@click.option("--ttl", type=click.FloatRange(1, 900), default=60, show_default=True, metavar="SECONDS",
              help="The lease's time to live, renewed every half of it while the command runs.")
@click.option("--wait", type=click.FloatRange(0, 25), default=0, show_default=True, metavar="SECONDS",
              help="Queue this long for the lease (else 409 lease-busy at once).")
@click.option("--owner", metavar="NAME", help="Shown to others in the lease's status.")
def lease(device_id, command, ttl, wait, owner):
    """Run a command while holding a device's lease.

    The command gets DEVICE_STATE_LEASE_DEVICE, DEVICE_STATE_LEASE_TOKEN and
    DEVICE_STATE_FENCING_TOKEN; device-state writes it runs on that device carry the token. The
    lease heartbeats while the command runs and is released when it ends. Exit status: the
    command's, also when the release fails (a warning then says the lease ends by itself within
    its TTL); 1 when the lease is busy, or lost meanwhile (the command is then stopped)."""
    import os
    import subprocess
    import threading

    session = _session()
    client = session.client()
    running: dict = {}
    lock = threading.Lock()

    def lost(error):
        with lock:
            running["lost"] = error
            if "child" in running and running["child"].poll() is None:
                running["child"].terminate()

    session.unkeyed_write(f"a lease it took, whose token is lost with the answer, ends by itself within {ttl:g} s")
    held = client.lease(device_id, ttl_seconds=ttl, wait_seconds=wait, owner=owner, on_lost=lost)
    session.unkeyed_write(None)  # answered: what follows is the command's
    try:
        environment = {**os.environ, "DEVICE_STATE_LEASE_DEVICE": device_id,
                       "DEVICE_STATE_LEASE_TOKEN": held.token, "DEVICE_STATE_FENCING_TOKEN": str(held.fencing_token)}
        with lock:
            if "lost" not in running:
                try:
                    running["child"] = subprocess.Popen(list(command), env=environment)
                except OSError as error:
                    raise click.UsageError(f"cannot run {command[0]}: {error.strerror}") from None
        status = running["child"].wait() if "child" in running else REFUSED
    finally:
        _release(held, device_id)
    if "lost" in running:
        from .output import problem_lines

        gone = running["lost"]
        for line in problem_lines(gone.status, gone.problem, gone.slug):
            click.echo(line, err=True)
        click.echo(f"  the lease on {device_id} ended while the command ran; it was stopped", err=True)
        raise click.exceptions.Exit(REFUSED)
    raise click.exceptions.Exit(status if status >= 0 else 128 - status)


def _release(held, device_id: str) -> None:
    """Gives the lease up; a release that fails is a warning, not the command's failure: the
    command has run, and the lease ends by itself within its TTL (other waiters wait that long)."""
    import http.client

    from ..credentials import CredentialsError
    from ..errors import ApiError

    try:
        held.release()
    except (ApiError, OSError, http.client.HTTPException, CredentialsError) as error:
        said = (" ".join(filter(None, (str(error.status), error.slug))) if isinstance(error, ApiError)
                else str(error) or type(error).__name__)
        click.echo(f"warning: releasing the lease on {device_id} failed ({said}); it ends by itself within "
                   f"{held.ttl_seconds:g} s", err=True)


# --- settings ----------------------------------------------------------------------------------


@main.command(epilog=example("device-state configure --endpoint http://127.0.0.1:3000 --token-command 'make -s token'",
                             "device-state configure --profile prod --endpoint https://abc.execute-api.eu-west-1"
                             ".amazonaws.com/ --token-command ./cognito-token.sh",
                             "device-state configure --show"))
@click.option("--profile", "profile_name", metavar="NAME", help="The profile to set (default: --profile's).")
@click.option("--endpoint", metavar="URL", help="The API's URL.")
@click.option("--token-command", "token_command", metavar="COMMAND", help="A shell command that prints a token.")
@click.option("--websocket-url", "websocket_url", metavar="URL", help="The WebSocket API's URL.")
@click.option("--ca-file", "ca_file", metavar="PEM", help="A CA to trust beside the system's.")
@click.option("--output", "output_setting", type=click.Choice(("table", "json", "yaml", "")),
              help="The default output ('' removes it).")
@click.option("--show", is_flag=True, help="Print the profile's settings.")
def configure(profile_name, endpoint, token_command, websocket_url, ca_file, output_setting, show):
    """Save settings in a profile of the config file.

    The file is DEVICE_STATE_CONFIG, else $XDG_CONFIG_HOME/device-state/config, else
    ~/.config/device-state/config. On a terminal, with no setting given, it asks for the
    endpoint and the token command. An empty value removes a setting."""
    from .config import config_path, load_profile, save_profile

    session = _session()
    name = profile_name or session.options["profile"]
    given = {"endpoint": endpoint, "token_command": token_command, "websocket_url": websocket_url,
             "ca_file": ca_file, "output": output_setting}
    current = load_profile(name) or {}
    chosen = {key: value for key, value in given.items() if value is not None}
    if not chosen and not show:
        if not sys.stdin.isatty():
            raise click.UsageError("give a setting to save (--endpoint, --token-command, …), or --show")
        for key, prompt in (("endpoint", "Endpoint URL"), ("token_command", "Token command")):
            chosen[key] = click.prompt(prompt, default=current.get(key, ""), show_default=bool(current.get(key)),
                                       err=True)
    if chosen:
        path = save_profile(name, chosen)
        click.echo(f"saved profile {name} in {path}", err=True)
    for key, value in (load_profile(name) or {}).items():
        click.echo(f"{key} = {value}")
    if not current and not chosen:
        click.echo(f"no profile {name} in {config_path()}", err=True)


@main.command(epilog=example("device-state completion bash > ~/.local/share/bash-completion/completions/device-state",
                             "eval \"$(device-state completion zsh)\""))
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell):
    """Print the shell completion script for bash, zsh or fish."""
    from click.shell_completion import get_completion_class

    complete = get_completion_class(shell)(main, {}, "device-state", "_DEVICE_STATE_COMPLETE")
    click.echo(complete.source())
