"""`make serve`: the Lambda handler behind real HTTP, on DynamoDB Local.

Each request becomes an API Gateway HTTP API proxy event (payload format 1.0) for the same ``lambda_handler``
that Lambda runs (``localdev/http_front.py``), so local and deployed behaviour cannot
drift. This module starts and supervises the processes: the HTTP workers, the WebSocket
process, the stream processor and the push fan-out (each as Lambda would run it), and
DynamoDB Local unless ``DYNAMODB_ENDPOINT`` names another. A worker that exits is replaced.

With ``TLS=1`` it serves HTTPS and asks each client for a certificate of the local CA
without requiring one. Requests that wait may take at most ``WAITING_REQUESTS`` workers at
once (half of them by default).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shlex
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

from localdev import console, http_front, websocket
from localdev.apigw import LambdaContext

STREAM_TIMEOUT_SECONDS = 60.0  # the stream processor's timeout (infra/changes.py)
# The processor and the fan-out are background work: on a busy machine the API's requests go
# first (in Lambda they never share a CPU). STREAM_NICENESS=0 runs them at the API's priority.
STREAM_NICENESS = int(os.environ.get("STREAM_NICENESS", "10"))
# The DeviceStateChanged events `make serve` publishes (there is no EventBridge locally), one JSON a line.
DEFAULT_EVENTS_FILE = ".serve/change-events.jsonl"
CURSOR_KEY_FILE = Path(".serve/cursor-key")  # the key listings' cursors are sealed with, unless CURSOR_KEY names one
# The key devices' secrets and enrollments' group keys are sealed with (functions/auth/sealing.py),
# unless SEALING_KEY_FILE or SEALING_KMS_KEY names one.
SEALING_KEY_FILE = Path(".serve/sealing-key")
RESTARTS_PER_MINUTE = 10  # more workers than this exiting within a minute stop the server

_DEFAULTS = {
    "TABLE_NAME": "devices",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "POWERTOOLS_SERVICE_NAME": "device-state",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_LOG_LEVEL": "WARNING",
}
# DynamoDB Local accepts any credentials; these are used only where none are configured.
_LOCAL_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}


def _table_client(endpoint: str):
    """The stream pollers' client for DescribeTable (the stream's ARN): botocore's own timeouts
    and retries (a read, safe to send again), not the library's 3 s read timeout, which DynamoDB
    Local's DescribeTable outlasts on a large table (it counts the table's items each time: about
    2 s at 100,000 devices on a 2-core machine, longer when several processes ask at once)."""
    import boto3

    return boto3.session.Session().client("dynamodb", endpoint_url=endpoint)


def _stream_worker(endpoint: str, table_name: str) -> None:
    """The stream processor, as Lambda's event source mapping would run it (localdev/stream.py)."""
    import logging

    import boto3

    from functions.changes.handler import give_up, lambda_handler
    from localdev.stream import StreamPoller

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.nice(STREAM_NICENESS)
    logging.basicConfig(format="%(name)s: %(message)s", stream=sys.stderr)
    for name in ("device_state.changes", "device_state.stream"):
        logging.getLogger(name).setLevel(logging.INFO)

    def context():
        lambda_context = LambdaContext(STREAM_TIMEOUT_SECONDS)
        lambda_context.function_name = "device-state-changes"
        return lambda_context

    streams = boto3.session.Session().client("dynamodbstreams", endpoint_url=endpoint)
    StreamPoller(streams, _table_client(endpoint), table_name, lambda_handler, context_factory=context,
                 on_give_up=give_up).run()


def _jobs_worker(endpoint: str, table_name: str) -> None:
    """The job runner, as its function, its self-invocations and its schedule would run it
    (localdev/jobs.py)."""
    import logging

    from functions.config import JobsConfig
    from functions.device_state import DeviceStateManager, dynamodb_client
    from localdev import jobs

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.nice(STREAM_NICENESS)
    logging.basicConfig(format="%(name)s: %(message)s", stream=sys.stderr)
    config = JobsConfig.from_environment()
    jobs.serve(DeviceStateManager(dynamodb_client(endpoint), table_name, fleet_index=config.fleet_index,
                                  cursor_key=config.cursor_key))


def _fanout_worker(endpoint: str, table_name: str) -> None:
    """The push fan-out, a consumer of the stream of its own as its own event source mapping
    is deployed (functions/push/fanout.py), posting to the WebSocket process's @connections."""
    import boto3

    from functions.push.fanout import BATCH_SIZE, MAX_RETRY_ATTEMPTS, lambda_handler, matches_filter
    from localdev.stream import StreamPoller

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.nice(STREAM_NICENESS)
    streams = boto3.session.Session().client("dynamodbstreams", endpoint_url=endpoint)
    StreamPoller(streams, _table_client(endpoint), table_name, lambda_handler, batch_size=BATCH_SIZE,
                 max_retry_attempts=MAX_RETRY_ATTEMPTS, record_filter=matches_filter,
                 context_factory=lambda: LambdaContext(STREAM_TIMEOUT_SECONDS)).run()


def _websocket_process(channel: socket.socket, connections_listener: socket.socket) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    websocket.serve(channel, connections_listener)


@contextlib.contextmanager
def _stops_held():
    """SIGTERM held (blocked) while children are forked and recorded. A stop that reached the
    server while it forked ran its handler inside logging's after-fork callback, where the
    KeyboardInterrupt it raises is ignored ("Exception ignored in: <function _releaseLock>",
    seen in a server left running after a clean clone's test): the server went on waiting for
    its workers for ever. One reaching it between a fork and the record would leave the child out
    of the stop, and one reaching a child before it set its own handler would run the server's.
    Held, each is delivered once it can be handled."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _forked(target, *args) -> int:
    """Runs ``target`` in a forked child that exits when it ends, however it ends: an error
    must never carry the child back into ``main``, whose clean-up would stop its siblings.
    Called under ``_stops_held``: the child lets SIGTERM in once it ends the child (SIG_DFL)."""
    pid = os.fork()
    if pid:
        return pid
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    code = 1
    try:
        target(*args)
        code = 0
    except KeyboardInterrupt:
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def stream_processor_on() -> bool:
    return os.environ.get("STREAM_PROCESSOR", "on") != "off"


def table_stream_on() -> bool:
    """The table has a stream (made with one, or given one when kept from before) unless
    TABLE_STREAM=off, which only a server without the stream processor heeds: the test suite's,
    on a DynamoDB Local that keeps every stream's records for good. A table of `make serve` keeps
    its stream with the processor off, so the writes made meanwhile reach the history later."""
    return stream_processor_on() or os.environ.get("TABLE_STREAM", "on") != "off"


def _ensure_table(endpoint: str, table_name: str) -> None:
    import boto3

    from functions.config import ConfigError, fleet_index
    from functions.device_state.table import STREAM_VIEW_TYPE
    from localdev.reindex import prepare

    client = boto3.session.Session().client("dynamodb", endpoint_url=endpoint)
    try:
        declared = fleet_index()
    except ConfigError as error:
        print(error, file=sys.stderr)
        raise SystemExit(2) from None
    streamed = table_stream_on()
    prepare(client, table_name, declared, stream=streamed)  # the table, with the fleet index FLEET_INDEX declares
    if streamed and "LatestStreamArn" not in client.describe_table(TableName=table_name)["Table"]:  # kept from before
        client.update_table(TableName=table_name,
                            StreamSpecification={"StreamEnabled": True, "StreamViewType": STREAM_VIEW_TYPE})


def _supervise(workers: dict[int, tuple]) -> None:
    """Replaces a worker that exits (its traceback is in the log), as Lambda replaces a failed
    instance, so one failure never stops the server; returns when another child (DynamoDB
    Local) exits, or when workers keep exiting (more than RESTARTS_PER_MINUTE)."""
    restarts: list[float] = []
    while True:
        pid, status = os.wait()
        job = workers.pop(pid, None)
        now = time.monotonic()
        restarts = [at for at in restarts if now - at < 60] + [now]
        if job is None or len(restarts) > RESTARTS_PER_MINUTE:
            print(f"process {pid} exited unexpectedly ({_exit_description(status)}); stopping",
                  file=sys.stderr, flush=True)
            return
        print(f"worker {pid} exited unexpectedly ({_exit_description(status)}); starting another",
              file=sys.stderr, flush=True)
        with _stops_held():
            workers[_forked(*job)] = job


def _exit_description(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def _library_environment(endpoint: str) -> str:
    """The export line that points dynamodb_client() (and boto3) at the table this server uses."""
    names = ["DYNAMODB_ENDPOINT", "AWS_REGION"]
    if os.environ.get("AWS_ACCESS_KEY_ID") == _LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"]:
        names += list(_LOCAL_CREDENTIALS)  # placeholders DynamoDB Local accepts, never real secrets
    values = {**os.environ, "DYNAMODB_ENDPOINT": endpoint}
    return "export " + " ".join(f"{name}={shlex.quote(values[name])}" for name in names)


def _arguments(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "3000")))
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WORKERS", "8")))
    parser.add_argument("--waiting", type=int, default=int(os.environ.get("WAITING_REQUESTS", "0")),
                        help="workers that waiting requests may take at once (default: half of them)")
    parser.add_argument("--tls", action="store_true", default=os.environ.get("TLS", "") not in ("", "0"),
                        help="HTTPS, asking for (not requiring) a client certificate of the local CA "
                             "(TLS=1; the CA in $TLS_DIR, default .serve/tls)")
    parser.add_argument("--data-dir", default=os.environ.get("DYNAMODB_DATA_DIR"),
                        help="keep DynamoDB Local's data on disk here (default: in memory)")
    return parser.parse_args(argv)


def _environment() -> tuple[str, object]:
    """The defaults every process inherits; what issues the tokens it accepts, as a note, and
    this checkout's issuer when it is the one trusted (the console's local sign-in), else None."""
    for name, value in _DEFAULTS.items():
        os.environ.setdefault(name, value)
    if not (os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE")):
        os.environ.update(_LOCAL_CREDENTIALS)
    # This checkout's own issuer (`make -s token` prints its tokens); it signs device tokens too.
    from localdev.issuer import DEFAULT_DIRECTORY, KEY_FILE, Issuer

    note, issuer, trusted = "the issuer named by AUTH_ISSUER, AUTH_AUDIENCE and AUTH_JWKS", None, None
    if not os.environ.get("AUTH_JWKS"):
        issuer = trusted = Issuer.load_or_create(DEFAULT_DIRECTORY)
        os.environ.update(issuer.environment())
        note = f"the local issuer in {DEFAULT_DIRECTORY}/ (a token: make -s token)"
    if not os.environ.get("DEVICE_TOKEN_ISSUER"):  # device tokens: signed with the local issuer's key
        issuer = issuer or Issuer.load_or_create(DEFAULT_DIRECTORY)
        os.environ.update(issuer.device_token_environment(DEFAULT_DIRECTORY / KEY_FILE))
    if not os.environ.get("CURSOR_KEY"):  # every worker seals cursors alike, and across restarts
        os.environ["CURSOR_KEY"] = _checkout_cursor_key(CURSOR_KEY_FILE)
    if not (os.environ.get("SEALING_KEY_FILE") or os.environ.get("SEALING_KMS_KEY")):  # kept across restarts
        os.environ["SEALING_KEY_FILE"] = _checkout_sealing_key(SEALING_KEY_FILE)
    _check_auth_configuration()
    _check_api_configuration()
    return note, trusted


def _checkout_cursor_key(path: Path) -> str:
    """This checkout's cursor key, made on first use (64 hex digits, readable by its owner only)."""
    from localdev.issuer import create_once

    if not path.exists():
        create_once(path, (secrets.token_hex(32) + "\n").encode())
    return path.read_text().strip()


def _checkout_sealing_key(path: Path) -> str:
    """This checkout's sealing key's file, made on first use (32 random bytes, its owner's alone)."""
    from functions.auth.sealing import KEY_BYTES
    from localdev.issuer import create_once

    if not path.exists():
        create_once(path, secrets.token_bytes(KEY_BYTES))
    return str(path.resolve())


def _check_api_configuration() -> None:
    """A bad setting of the API's (CURSOR_KEY, FLEET_INDEX, ...) stops the server at start, in one line."""
    from functions.config import ApiConfig, ConfigError

    try:
        ApiConfig.from_environment()
    except ConfigError as error:
        sys.exit(f"make serve: {error}")


def _check_auth_configuration() -> None:
    """A bad AUTH_*, DEVICE_TOKEN_* or SEALING_* setting stops the server at start, in one line."""
    from functions.auth.credentials import AuthConfig, AuthConfigError
    from functions.auth.device_tokens import TokenSettings, signer_for
    from functions.auth.sealing import sealer_from_environment

    try:
        AuthConfig.from_environment()
        signer_for(TokenSettings.from_environment())
        sealer_from_environment()
    except AuthConfigError as error:
        sys.exit(f"make serve: {error}")


def _listen(host: str, port: int) -> socket.socket:
    """Before anything is started, so a busy port is one line and nothing to clean up."""
    try:
        listener = socket.create_server((host, port), backlog=256, reuse_port=False)
    except OSError as error:
        sys.exit(f"make serve: cannot listen on {host}:{port}: {error.strerror}. "
                 f"Stop what uses it, or pick another port: PORT={port + 1} make serve")
    listener.setblocking(False)
    return listener


def _jobs(args, listener: socket.socket, tls, endpoint: str) -> list[tuple]:
    """What each process runs: the HTTP workers, the WebSocket process and, unless
    STREAM_PROCESSOR=off, the push fan-out, the stream processor and the job runner."""
    websocket_channel, websocket_inbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    connections_listener = socket.create_server(("127.0.0.1", 0))
    os.environ["CONNECTIONS_ENDPOINT"] = f"http://127.0.0.1:{connections_listener.getsockname()[1]}"
    workers_count = max(1, args.workers)
    http_front.configure(waiting_capacity(args), websocket_channel)
    jobs = [(http_front.worker, listener, tls)] * workers_count + [(_websocket_process, websocket_inbox,
                                                                    connections_listener)]
    if stream_processor_on():
        jobs.append((_fanout_worker, endpoint, os.environ["TABLE_NAME"]))
        events_file = os.environ.setdefault("CHANGE_EVENTS_FILE", os.path.abspath(DEFAULT_EVENTS_FILE))
        os.makedirs(os.path.dirname(events_file), exist_ok=True)
        jobs.append((_stream_worker, endpoint, os.environ["TABLE_NAME"]))
        print(f"Stream processor on the table's stream; DeviceStateChanged events go to {events_file}", flush=True)
        jobs.append((_jobs_worker, endpoint, os.environ["TABLE_NAME"]))
    return jobs


def waiting_capacity(args) -> int:
    """How many waiting requests (long-polls, lease waits) the HTTP workers take at once: half
    of them unless --waiting says; the next one is 503 too-many-waiting (docs/api/errors.md)."""
    workers_count = max(1, args.workers)
    return min(args.waiting or max(1, workers_count // 2), workers_count)


def _announce(args, tls, local_ca, workers: int, issuer_note: str, endpoint: str) -> None:
    scheme = "https" if tls else "http"
    print(f"Serving the device-state API on {scheme}://{args.host}:{args.port} "
          f"(table {os.environ['TABLE_NAME']}, {max(1, args.workers)} HTTP workers, {waiting_capacity(args)} of them "
          f"for waiting requests; {workers} processes); Ctrl-C stops", flush=True)
    certificates = "; a device with a certificate connects with a token of POST /devices/<id>/token" if tls else ""
    print(f"WebSocket push: {'wss' if tls else 'ws'}://{args.host}:{args.port}{websocket.PATH} (@connections on "
          f"{os.environ['CONNECTIONS_ENDPOINT']}{certificates})", flush=True)
    print(f"API docs: {scheme}://{args.host}:{args.port}/docs (Swagger UI over "
          f"{scheme}://{args.host}:{args.port}/openapi.json)", flush=True)
    print(f"Console: {scheme}://{args.host}:{args.port}/console/ (signed in as the local developer"
          f"{'' if console.signs_in() else ': paste a token of the issuer above'})", flush=True)
    print(f"Every route but /openapi.json and /docs needs 'Authorization: Bearer <token>' from "
          f"{issuer_note}{', or a device certificate' if tls else ''}", flush=True)
    if tls:
        print(f"TLS: the server's certificate is signed by the local CA {local_ca.certificate_path} "
              f"(curl --cacert {local_ca.certificate_path}); a client certificate of that CA is asked for, "
              f"not required: a device's from make -s device-cert DEVICE=<id>", flush=True)
    print(f"For scripts and the library: {_library_environment(endpoint)}", flush=True)


def _stop(workers: dict[int, tuple]) -> None:
    for pid in workers:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for pid in workers:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def main(argv=None) -> None:
    args = _arguments(argv)

    # Ctrl-C and SIGTERM stop everything, even when started from a shell that ignores SIGINT.
    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    issuer_note, local_issuer = _environment()
    console.configure(local_issuer)
    listener = _listen(args.host, args.port)
    tls = local_ca = None
    if args.tls:
        from localdev.tls import LocalCA

        local_ca = LocalCA.load_or_create()
        tls = local_ca.server_context()

    dynamodb_local = None
    endpoint = os.environ.get("DYNAMODB_ENDPOINT")
    if not endpoint:
        from localdev.dynamodb_local import DynamoDBLocal

        dynamodb_local = DynamoDBLocal(data_dir=args.data_dir).start()
        endpoint = os.environ["DYNAMODB_ENDPOINT"] = dynamodb_local.endpoint
        print(f"DynamoDB Local on {endpoint} ({'on disk in ' + args.data_dir if args.data_dir else 'in memory'})",
              flush=True)
    workers: dict[int, tuple] = {}  # pid -> what it runs
    try:
        _ensure_table(endpoint, os.environ["TABLE_NAME"])
        import functions.api.handler  # noqa: F401  (imported once, before the workers fork)

        jobs = _jobs(args, listener, tls, endpoint)
        with _stops_held():
            workers.update((_forked(*job), job) for job in jobs)
        _announce(args, tls, local_ca, len(workers), issuer_note, endpoint)
        _supervise(workers)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        _stop(workers)
        if dynamodb_local:
            dynamodb_local.stop()
        print("stopped", flush=True)


if __name__ == "__main__":
    main()
