"""``device-state``: the command line of the device-state service, over ``AppClient``.

Start-up stays small: this module imports Click alone; the HTTP client, WebSocket, Rich and
PyYAML are imported by the commands that use them, so ``--help`` loads none of them."""

from __future__ import annotations

import os
import sys
import uuid

import click

from .. import __version__
from .output import FORMATS

# Exit statuses: what happened, for scripts (130: interrupted, as shells count SIGINT).
APPLIED, REFUSED, USAGE, UNKNOWN, INTERRUPTED = 0, 1, 2, 3, 130
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
LEASE_ENVIRONMENT = ("DEVICE_STATE_LEASE_DEVICE", "DEVICE_STATE_LEASE_TOKEN")
# Sends of a request before the command gives up (about 4 s of backoff when nothing answers,
# or what Retry-After asks, up to a minute each): a person waits at a prompt; a script runs the
# command again.
ATTEMPTS = 4


def example(*lines: str) -> str:
    """An epilog of example commands, kept as written by Click's help formatter (``\\b``)."""
    return "\b\nExample:\n" + "\n".join(f"  {line}" for line in lines)


def deliver_dropped_interrupts() -> None:
    """Python prints and drops an exception raised in a finalizer (an object's ``__del__``). A
    Ctrl-C that lands in one, as when the 304 answer of a watch's long-poll is freed, would be lost
    and the watch would go on: it is delivered to the main thread again, from another thread, once
    the finalizer has returned (should it land in a finalizer again, again). Installed once."""
    previous = sys.unraisablehook
    if getattr(previous, "delivers_dropped_interrupts", False):
        return

    def hook(unraisable):
        if not issubclass(unraisable.exc_type, KeyboardInterrupt):
            return previous(unraisable)
        import threading

        again = threading.Timer(0.01, _interrupt_main_thread)
        again.daemon = True
        try:
            again.start()
        except RuntimeError:  # the interpreter is shutting down: nothing is left to interrupt
            pass

    hook.delivers_dropped_interrupts = True
    sys.unraisablehook = hook


def _interrupt_main_thread() -> None:
    """SIGINT to the main thread, which ends what it waits on (a socket, a sleep) as a Ctrl-C does;
    where threads cannot be signalled (Windows), the interrupt it takes at its next step."""
    import signal
    import threading

    if hasattr(signal, "pthread_kill"):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    else:
        import _thread

        _thread.interrupt_main()


class CommandLine(click.Group):
    """The top command: runs a subcommand and turns what befell it into an exit status and a
    readable message on stderr (0 applied, 1 refused by the service, 2 usage, 3 outcome unknown
    or the service unavailable)."""

    def main(self, *args, **kwargs):
        deliver_dropped_interrupts()
        return super().main(*args, **kwargs)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.exceptions.Exit:
            raise
        except click.ClickException:
            raise
        except BrokenPipeError:  # the reader of a pipe stopped reading (| head): not a failure
            sys.stdout = open(os.devnull, "w")
            ctx.exit(APPLIED)
        except KeyboardInterrupt:  # Ctrl-C (a watch's usual end): not a refusal, which Click's 1 would say
            click.echo(err=True)
            key, to_see = (getattr(ctx.obj, name, None) for name in ("idempotency_key", "write_to_see"))
            if key:
                click.echo(f"interrupted: the write may or may not have been applied; the same command with "
                           f"--idempotency-key {key} applies it at most once and answers what became of it", err=True)
            elif to_see:
                click.echo(f"interrupted: the write may or may not have been applied; {to_see}", err=True)
            ctx.exit(INTERRUPTED)
        except Exception as error:  # noqa: BLE001 - each kind is told apart in _failure
            status = _failure(ctx, error)
            if status is None:
                raise
            ctx.exit(status)


def _failure(ctx, error: Exception) -> int | None:
    """Says on stderr what went wrong; the exit status, or None for a fault of this program."""
    import http.client

    from ..credentials import CredentialsError
    from ..errors import ApiError
    from ..follow import FollowError
    from .output import problem_lines

    session = ctx.obj
    key = getattr(session, "idempotency_key", None)
    to_see = getattr(session, "write_to_see", None)
    if isinstance(error, ApiError):
        for line in problem_lines(error.status, error.problem, error.slug):
            click.echo(line, err=True)
        unknown = error.status == 429 or error.status >= 500
        if unknown and key:
            what = "was not applied" if error.status in (429, 503) else "may or may not have been applied"
            click.echo(f"  the write {what}; the same command with --idempotency-key {key} applies it at most "
                       "once and answers what became of it", err=True)
        elif unknown and to_see and error.status not in (429, 503):
            click.echo(f"  the write may or may not have been applied; {to_see}", err=True)
        return UNKNOWN if unknown else REFUSED
    if isinstance(error, FollowError):
        click.echo(f"error: {error}", err=True)
        return REFUSED
    if isinstance(error, CredentialsError):
        click.echo(f"error: {error}", err=True)
        return USAGE
    if isinstance(error, (OSError, http.client.HTTPException)):
        import urllib.error

        endpoint = getattr(session, "endpoint", None) or "the service"
        click.echo(f"error: no answer from {endpoint}: {error}", err=True)
        if key and isinstance(error, urllib.error.URLError):  # the client raises it when no copy was sent whole
            click.echo(f"  the write was not applied: no copy of it reached the service; the same command with "
                       f"--idempotency-key {key} sends it again", err=True)
        elif key:
            click.echo(f"  the write may or may not have been applied; the same command with --idempotency-key "
                       f"{key} applies it at most once and answers what became of it", err=True)
        elif to_see:
            click.echo(f"  the write may or may not have been applied; {to_see}", err=True)
        return UNKNOWN
    return None


class Session:
    """The settings of one run (options, then environment, then profile), resolved when a
    command first needs the service."""

    def __init__(self, ctx, options: dict):
        self.ctx, self.options = ctx, options
        self.idempotency_key: str | None = None
        self.write_to_see: str | None = None
        self._profile: dict | None = None

    def profile(self) -> dict:
        if self._profile is None:
            from .config import config_path, load_profile

            name = self.options["profile"]
            loaded = load_profile(name)
            if loaded is None and self._given("profile"):
                raise click.UsageError(f"no profile {name!r} in {config_path()}: run device-state configure "
                                       f"--profile {name}")
            self._profile = loaded or {}
        return self._profile

    def _given(self, name: str) -> bool:
        source = self.ctx.get_parameter_source(name)
        return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")

    def setting(self, name: str):
        """An option's value from the command line or the environment, else the profile's."""
        return self.options.get(name) if self._given(name) else self.profile().get(name)

    @property
    def endpoint(self) -> str | None:
        return self.setting("endpoint")

    def output(self, chosen: str | None) -> str:
        from .output import default_format

        return chosen or self.setting("output") or default_format()

    def credentials(self):
        from ..credentials import CommandCredentials, TokenCredentials

        # A token or command given on the command line beats one from the environment, which
        # beats the profile's; at the same level a token beats a command.
        ranked = []
        for rank, (name, make) in enumerate((("token", TokenCredentials), ("token_command", CommandCredentials))):
            source = self.ctx.get_parameter_source(name)
            level = {"COMMANDLINE": 0, "ENVIRONMENT": 1}.get(source.name if source else "", None)
            if level is not None and self.options.get(name):
                ranked.append((level, rank, make, self.options[name]))
        if self.profile().get("token_command"):
            ranked.append((2, 1, CommandCredentials, self.profile()["token_command"]))
        if not ranked:
            raise click.UsageError("no credentials: pass --token or --token-command, set DEVICE_STATE_TOKEN or "
                                   "DEVICE_STATE_TOKEN_COMMAND, or run device-state configure")
        _, _, make, value = min(ranked, key=lambda candidate: candidate[:2])
        return make(value)

    def client(self):
        from ..app import AppClient

        if not self.endpoint:
            raise click.UsageError("no endpoint: pass --endpoint, set DEVICE_STATE_ENDPOINT or run "
                                   "device-state configure")
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(self.endpoint)
            parts.port  # noqa: B018 - read for its ValueError on a port that is not a number
        except ValueError:
            parts = None
        if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
                or any(character.isspace() for character in self.endpoint)):
            raise click.UsageError(f"the endpoint {self.endpoint!r} is not an http:// or https:// URL")
        ssl_context = None
        if self.setting("ca_file"):
            import ssl

            ssl_context = ssl.create_default_context()
            try:
                ssl_context.load_verify_locations(cafile=self.setting("ca_file"))
            except (OSError, ssl.SSLError) as error:
                raise click.UsageError(f"cannot use the CA file {self.setting('ca_file')}: {error}") from None
        return AppClient(self.endpoint, self.credentials(), websocket_url=self.setting("websocket_url"),
                         ssl_context=ssl_context, write_attempts=ATTEMPTS)

    def write_key(self, given: str | None) -> str:
        """The Idempotency-Key of this run's write: the one given, else a new one."""
        self.idempotency_key = given or str(uuid.uuid4())
        return self.idempotency_key

    def unkeyed_write(self, to_see: str | None) -> None:
        """This run sends a write that takes no Idempotency-Key: an answer lost on the way leaves
        it unknown, and ``to_see`` says how to find out what became of it (None: it was answered)."""
        self.write_to_see = to_see


def lease_token_for(device_id: str, given: str | None) -> str | None:
    """``--lease-token``, else the token ``device-state lease`` hands the command it runs, on
    the device it leased only (a token on another device would be refused as a lease not held)."""
    if given:
        return given
    leased, token = (os.environ.get(name) for name in LEASE_ENVIRONMENT)
    return token if token and leased == device_id else None


@click.group(cls=CommandLine, context_settings=CONTEXT, epilog=example(
    "export DEVICE_STATE_ENDPOINT=http://127.0.0.1:3000 DEVICE_STATE_TOKEN_COMMAND='make -s token'",
    "device-state create lamp-1 '{\"state\": {\"power\": \"on\"}}'",
    "device-state list --filter 'eq(reported/online,false)' -o json"))
@click.option("--endpoint", envvar="DEVICE_STATE_ENDPOINT", metavar="URL",
              help="The API's URL (make serve's http://127.0.0.1:3000; deployed, the stack output Url). "
                   "[env DEVICE_STATE_ENDPOINT]")
@click.option("--token", envvar="DEVICE_STATE_TOKEN", metavar="TOKEN",
              help="A bearer token. [env DEVICE_STATE_TOKEN]")
@click.option("--token-command", "token_command", envvar="DEVICE_STATE_TOKEN_COMMAND", metavar="COMMAND",
              help="A shell command that prints a token (or an OAuth token answer, JSON), run again before "
                   "the token expires: 'make -s token', or a curl of Cognito's token endpoint. "
                   "[env DEVICE_STATE_TOKEN_COMMAND]")
@click.option("--websocket-url", "websocket_url", envvar="DEVICE_STATE_WEBSOCKET_URL", metavar="URL",
              help="The WebSocket API's URL for watch (default: the endpoint's /ws; deployed, the stack "
                   "output WebSocketUrl). [env DEVICE_STATE_WEBSOCKET_URL]")
@click.option("--ca-file", "ca_file", envvar="DEVICE_STATE_CA_FILE", metavar="PEM",
              help="A CA to trust beside the system's (make serve TLS=1's .serve/tls/ca.pem). "
                   "[env DEVICE_STATE_CA_FILE]")
@click.option("--profile", envvar="DEVICE_STATE_PROFILE", default="default", show_default=True,
              help="The profile of the config file whose settings fill in what is not given. "
                   "[env DEVICE_STATE_PROFILE]")
@click.version_option(__version__, prog_name="device-state")
@click.pass_context
def main(ctx, **options):
    """Read, change and follow devices of the device-state service.

    Settings come from the options, then the environment, then the profile in the config file
    (device-state configure). Output is a table on a terminal and JSON when piped (-o to
    choose). Exit status: 0 applied, 1 refused by the service, 2 usage, 3 outcome unknown or
    the service unavailable (the problem is printed on stderr), 130 interrupted (Ctrl-C)."""
    ctx.obj = Session(ctx, options)


def output_option(function):
    return click.option("-o", "--output", type=click.Choice(FORMATS), default=None,
                        help="table (default on a terminal), json (default when piped) or yaml.")(function)


def write_options(function):
    """Options every write takes."""
    function = click.option("--idempotency-key", "idempotency_key", metavar="KEY",
                            help="The write's Idempotency-Key (default: a new one). The same command with "
                                 "the same key applies at most once and answers as the first did.")(function)
    return click.option("--lease-token", "lease_token", metavar="TOKEN",
                        help="The lease holder's Lease-Token, for a leased device (inside device-state lease, "
                             "the lease's own).")(function)


class _Id(click.ParamType):
    """A device's, job's, credential's or enrollment's id: not empty (an empty one would name
    the collection: ``get ""`` read the fleet's first page)."""

    name = "id"

    def convert(self, value, param, ctx):
        if not value:
            self.fail("an id is not empty", param, ctx)
        return value


ID = _Id()


def if_match_option(function):
    return click.option("--if-match", "if_match", type=click.IntRange(min=1), metavar="VERSION",
                        help="Write only if the device is at this version (else 412, nothing written).")(function)


def include_option(function):
    return click.option("--include", type=click.Choice(["metadata"]), default=None,
                        help="metadata: each desired and reported leaf's version, time, ack and expiry.")(function)


# Each module of commands registers its commands (or its group of them) on main when imported.
from . import commands, identity, jobs  # noqa: E402

__all__ = ["main", "commands", "identity", "jobs"]
