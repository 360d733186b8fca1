"""`make serve`: the Lambda handler behind real HTTP, on DynamoDB Local.

Each request becomes an API Gateway REST proxy event for the same ``lambda_handler``
that Lambda runs, so local and deployed behaviour cannot drift. Like Lambda, each
worker process handles one request at a time (Powertools' resolver keeps the current
request on the app object, so threads sharing one handler would mix requests); several
workers share the listening socket, so requests run concurrently. A worker accepts a
connection only when it is idle and closes it after one response, so a long request (a
lease wait) never holds up another client's request queued behind it. Reading a request
has a deadline (``REQUEST_READ_SECONDS``, and each socket read too), so an idle or slow
client holds a worker for a few seconds at most, never all of them for good.

With ``TLS=1`` it serves HTTPS (``localdev/tls.py``'s local CA) and asks each client for a
certificate of that CA without requiring one. The handshake is done by the worker that
accepted the connection, under the same read deadline, so a slow or failed handshake holds
up no other client; a client certificate reaches the handler as API Gateway passes one
verified by mutual TLS (``requestContext.identity.clientCert``).

Requests that wait (a long-poll of the change feed, a lease request with ``waitSeconds``)
may take at most ``WAITING_REQUESTS`` workers at once (half of them by default); one more
is answered 503 with Retry-After, so other requests always find a worker. A waiting
request whose client hangs up is stopped at once (as if its Lambda had crashed, which the
lease queue and the feed are built to survive), and its worker goes back to serving.
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import re
import select
import shlex
import signal
import socket
import ssl
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlsplit

from localdev import docs, websocket
from localdev.apigw import LambdaContext, authorizer_step, make_event

MAX_REQUEST_BYTES = 10 * 1024 * 1024  # API Gateway's payload limit
LAMBDA_TIMEOUT_SECONDS = 28.0  # the deployed function's timeout (infra/api.py), so waits are capped alike
STREAM_TIMEOUT_SECONDS = 60.0  # the stream processor's timeout (infra/changes.py)
# The processor is background work: on a busy machine the API's requests go first (in Lambda
# the two never share a CPU).
STREAM_NICENESS = 10
# The DeviceStateChanged events `make serve` publishes (there is no EventBridge locally), one JSON a line.
DEFAULT_EVENTS_FILE = ".serve/change-events.jsonl"
REQUEST_READ_SECONDS = float(os.environ.get("REQUEST_READ_SECONDS", "5"))  # to read one whole request
RESTARTS_PER_MINUTE = 10  # more workers than this exiting within a minute stop the server


HANG_UP_POLL_SECONDS = 0.1  # how often a waiting request's connection is checked for a hang-up
_waiting_slots = None  # a semaphore shared by the workers (made before they fork)
_interruptible = False  # a waiting request is being handled, and may be stopped when its client goes


class _ClientGone(BaseException):
    """Raised into a waiting request whose client hung up. Not an Exception, so nothing
    on the way (the API's catch-all, the library's retries) mistakes it for a fault."""


def _client_gone(_signum, _frame):
    if _interruptible:
        raise _ClientGone()


def _waits(method: str, target: str, body: bytes | None) -> bool:
    """Whether a request may wait: a long-poll of the feed or the delta, or a lease request
    with waitSeconds (the routes the deployed stack gives a function of their own)."""
    url = urlsplit(target)
    parts = url.path.rstrip("/").split("/")
    if len(parts) != 4 or parts[1] != "devices":
        return False
    if parts[3] in ("changes", "delta") and method in ("GET", "HEAD"):
        return any(value.strip("0") for value in parse_qs(url.query).get("waitSeconds", []))
    if parts[3] == "leases" and method == "POST" and body:
        try:
            document = json.loads(body)
        except ValueError:
            return False
        return isinstance(document, dict) and bool(document.get("waitSeconds"))
    return False


def _watch_for_hang_up(connection: socket.socket, done: threading.Event) -> None:
    """Signal this process when the client closes its end while its request is handled."""
    gone = _closed_under_tls if isinstance(connection, ssl.SSLSocket) and hasattr(select, "POLLRDHUP") else _closed
    if gone(connection, done) and not done.is_set():
        os.kill(os.getpid(), signal.SIGUSR1)


def _closed(connection: socket.socket, done: threading.Event) -> bool:
    while not done.is_set():
        try:
            readable, _, _ = select.select([connection], [], [], HANG_UP_POLL_SECONDS)
            if readable and connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                return True
            if readable:
                done.wait(HANG_UP_POLL_SECONDS)  # it sent more (it is still there); look again later
        except BlockingIOError:
            continue
        except (OSError, ValueError):
            return True
    return False


def _closed_under_tls(connection: ssl.SSLSocket, done: threading.Event) -> bool:
    """An SSLSocket cannot peek, and a TLS client may send bytes before its FIN (a close_notify):
    Linux's POLLRDHUP sees the FIN behind whatever the client sent."""
    poller = select.poll()
    poller.register(connection, select.POLLRDHUP)
    while not done.is_set():
        if poller.poll(HANG_UP_POLL_SECONDS * 1000):
            return True
    return False


class _ReadDeadline(TimeoutError):
    """The client did not send its whole request in time (BaseHTTPRequestHandler drops
    the connection on a TimeoutError)."""


_reading = False  # a worker is single-threaded: at most one request is being read


def _read_deadline_passed(_signum, _frame):
    if _reading:  # a late alarm outside a read is ignored
        raise _ReadDeadline("request not read within the deadline")


def _arm(seconds: float) -> None:
    global _reading
    _reading = seconds > 0
    signal.setitimer(signal.ITIMER_REAL, seconds)


_websocket_channel = None  # where a worker hands a WebSocket request's socket (made before the workers fork)
WEBSOCKET_PEEK_BYTES = 8  # len(b"GET /ws ")


class _Server(HTTPServer):
    tls: ssl.SSLContext | None = None

    def get_request(self):
        connection, address = self.socket.accept()
        _arm(REQUEST_READ_SECONDS)  # from accept (and the TLS handshake) to the last byte of the body
        if self.tls is None:
            return connection, address
        connection.settimeout(REQUEST_READ_SECONDS)
        try:
            return self.tls.wrap_socket(connection, server_side=True), address  # closes it on failure
        except OSError as error:  # another CA's certificate, the deadline, a client gone: this one only
            _arm(0)
            sys.stderr.write(f"{address[0]} TLS handshake failed: {error}\n")
            raise

    def process_request(self, request, client_address) -> None:
        """A ``GET /ws`` goes, unread, to the WebSocket process (localdev/websocket.py); not
        under TLS, where the connection's TLS state cannot move to another process."""
        if (self.tls is None and _websocket_channel is not None
                and websocket.is_websocket_request(_peek(request))):
            websocket.hand_off(_websocket_channel, request, client_address)
            _arm(0)  # its deadline is the WebSocket process's now (shutdown_request, which disarms, is skipped)
            request.close()  # this process's copy only: no shutdown, the WebSocket process goes on with it
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        _arm(0)  # whatever happened to the request, its deadline ends with it
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (TimeoutError, ConnectionError, ssl.SSLError)):
            super().handle_error(request, client_address)

def _peek(connection: socket.socket) -> bytes:
    """The request's first bytes, left unread, within the read deadline armed at accept
    (when it passes, ``_ReadDeadline`` drops the connection as it would mid-request)."""
    try:
        connection.settimeout(REQUEST_READ_SECONDS)
        head = b""
        while len(head) < WEBSOCKET_PEEK_BYTES:
            more = connection.recv(WEBSOCKET_PEEK_BYTES, socket.MSG_PEEK)
            if not more:
                return head  # closed before a whole request line
            if len(more) == len(head):
                time.sleep(0.01)  # no more yet: look again shortly
            head = more
        return head
    except _ReadDeadline:
        raise
    except OSError:
        return b""
    finally:
        connection.settimeout(None)


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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "device-state-dev"
    timeout = REQUEST_READ_SECONDS  # each socket read; the whole request has the same deadline

    def finish(self) -> None:
        _arm(0)
        super().finish()

    def __getattr__(self, name: str):
        if name.startswith("do_"):  # any method goes to the handler, which answers 405 with Allow
            return self._serve
        raise AttributeError(name)

    def _refuse(self, status: int, title: str, detail: str, headers: dict | None = None) -> None:
        """The server's own refusals (framing, load), as problem details like the handler's."""
        body = json.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail})
        self._send(status, {"Content-Type": "application/problem+json", **(headers or {})}, body.encode())

    def _content_length(self) -> int | None:
        values = {value.strip() for value in self.headers.get_all("Content-Length") or []}
        if not values:
            return 0
        if len(values) == 1 and re.fullmatch(r"[0-9]{1,12}", next(iter(values))):
            return int(next(iter(values)))
        return None

    def _serve(self) -> None:
        from functions.api.handler import lambda_handler

        started = time.perf_counter()
        if self.headers.get("Transfer-Encoding"):
            self._refuse(411, "Length required", "send the body with a Content-Length")
            return
        length = self._content_length()
        if length is None:
            self._refuse(400, "Bad request", "Content-Length must be one non-negative decimal integer")
            return
        if length > MAX_REQUEST_BYTES:
            self._refuse(413, "Request too large", f"requests are limited to {MAX_REQUEST_BYTES} bytes")
            return
        raw = self.rfile.read(length) if length else None
        if raw is not None and len(raw) < length:
            self.close_connection = True  # the client closed before sending its whole body
            return
        _arm(0)  # the request is read; handling it may take as long as the Lambda would
        headers: dict[str, list[str]] = {}
        for name, value in self.headers.items():
            headers.setdefault(name, []).append(value)
        body = None
        if raw is not None:
            try:
                body = raw.decode("utf-8")
            except UnicodeDecodeError:
                body = raw  # sent base64-encoded, as API Gateway does for binary bodies
        event = make_event(self.command, self.path, headers, body, source_ip=self.client_address[0],
                           client_cert=self._client_cert())
        refusal = authorizer_step(event)
        if refusal:
            status, refusal_headers, problem = refusal
            self._send(status, refusal_headers, json.dumps(problem).encode())
            return
        waits = _waits(self.command, self.path, raw)
        if waits and not _waiting_slots.acquire(block=False):
            self._refuse(503, "Too many waiting requests",
                         "every worker this server gives to waiting requests is taken; retry after Retry-After",
                         {"Retry-After": "1"})
            return
        try:
            result = self._handle(lambda_handler, event, waits)
        except _ClientGone:
            self.close_connection = True
            sys.stderr.write(f"{self.client_address[0]} {self.command} {self.path} client hung up while waiting\n")
            return
        finally:
            if waits:
                _waiting_slots.release()
        payload = result.get("body") or ""
        data = base64.b64decode(payload) if result.get("isBase64Encoded") else payload.encode("utf-8")
        response_headers = dict(result.get("headers") or {})
        for name, values in (result.get("multiValueHeaders") or {}).items():
            response_headers[name] = ", ".join(values)
        self._send(result["statusCode"], response_headers, data)
        elapsed = (time.perf_counter() - started) * 1000
        sys.stderr.write(f"{self.client_address[0]} {self.command} {self.path} {result['statusCode']} "
                         f"{elapsed:.1f}ms\n")

    def _client_cert(self) -> dict | None:
        """The certificate the client sent (TLS verified it against the local CA), if any."""
        if not isinstance(self.connection, ssl.SSLSocket):
            return None
        der = self.connection.getpeercert(binary_form=True)
        if not der:
            return None
        from localdev.tls import client_cert

        return client_cert(der)

    def _handle(self, lambda_handler, event: dict, waits: bool) -> dict:
        """The handler's answer; a waiting request is stopped (``_ClientGone``) once its client hangs up."""
        global _interruptible
        if not waits:
            return lambda_handler(event, LambdaContext(LAMBDA_TIMEOUT_SECONDS))
        done = threading.Event()
        watcher = threading.Thread(target=_watch_for_hang_up, args=(self.connection, done), daemon=True)
        _interruptible = True
        try:
            watcher.start()
            return lambda_handler(event, LambdaContext(LAMBDA_TIMEOUT_SECONDS))
        finally:
            _interruptible = False
            done.set()

    def _send(self, status: int, headers: dict, data: bytes) -> None:
        self.close_connection = True  # one response per connection: see the module docstring
        self.send_response_only(status)
        for name, value in headers.items():
            if name.lower() not in ("content-length", "connection"):
                self.send_header(name, value)
        if status != 304 and status != 204:
            self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.send_header("Date", self.date_time_string())
        self.end_headers()
        if status not in (204, 304) and self.command != "HEAD":
            self.wfile.write(data)

    def do_GET(self) -> None:
        if docs.handles(self.path):  # Swagger UI: dev server only, never in Lambda
            self._send(*docs.response(self.path))
            return
        self._serve()

    def log_message(self, format, *args):  # one line per request is written by _serve
        pass


def _worker(listener: socket.socket, tls: ssl.SSLContext | None) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGALRM, _read_deadline_passed)
    signal.signal(signal.SIGUSR1, _client_gone)
    server = _Server(listener.getsockname(), _Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = listener  # non-blocking: a worker that loses the race to accept goes back to waiting
    server.tls = tls
    server.serve_forever(poll_interval=0.2)


def _stream_worker(endpoint: str, table_name: str) -> None:
    """The stream processor, as Lambda's event source mapping would run it (localdev/stream.py)."""
    import logging

    import boto3

    from functions.changes.handler import give_up, lambda_handler
    from functions.device_state import dynamodb_client
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
    StreamPoller(streams, dynamodb_client(endpoint), table_name, lambda_handler, context_factory=context,
                 on_give_up=give_up).run()


def _fanout_worker(endpoint: str, table_name: str) -> None:
    """The push fan-out, a consumer of the stream of its own as its own event source mapping
    is deployed (functions/push/fanout.py), posting to the WebSocket process's @connections."""
    import boto3

    from functions.device_state import dynamodb_client
    from functions.push.fanout import BATCH_SIZE, MAX_RETRY_ATTEMPTS, lambda_handler, matches_filter
    from localdev.stream import StreamPoller

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.nice(STREAM_NICENESS)
    streams = boto3.session.Session().client("dynamodbstreams", endpoint_url=endpoint)
    StreamPoller(streams, dynamodb_client(endpoint), table_name, lambda_handler, batch_size=BATCH_SIZE,
                 max_retry_attempts=MAX_RETRY_ATTEMPTS, record_filter=matches_filter,
                 context_factory=lambda: LambdaContext(STREAM_TIMEOUT_SECONDS)).run()


def _websocket_process(channel: socket.socket, connections_listener: socket.socket) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    websocket.serve(channel, connections_listener)


def _forked(target, *args) -> int:
    """Runs ``target`` in a forked child that exits when it ends, however it ends: an error
    must never carry the child back into ``main``, whose clean-up would stop its siblings."""
    pid = os.fork()
    if pid:
        return pid
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


def _ensure_table(endpoint: str, table_name: str) -> None:
    import boto3

    from functions.device_state.table import STREAM_VIEW_TYPE, ensure_table

    client = boto3.session.Session().client("dynamodb", endpoint_url=endpoint)
    ensure_table(client, table_name)
    if "LatestStreamArn" not in client.describe_table(TableName=table_name)["Table"]:  # kept on disk from before
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


def main(argv=None) -> None:
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
    args = parser.parse_args(argv)

    # Ctrl-C and SIGTERM stop everything, even when started from a shell that ignores SIGINT.
    def stop(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    for name, value in _DEFAULTS.items():
        os.environ.setdefault(name, value)
    if not (os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE")):
        os.environ.update(_LOCAL_CREDENTIALS)
    issuer_note = "the issuer named by AUTH_ISSUER, AUTH_AUDIENCE and AUTH_JWKS"
    if not os.environ.get("AUTH_JWKS"):  # this checkout's own issuer: `make -s token` prints its tokens
        from localdev.issuer import DEFAULT_DIRECTORY, Issuer

        os.environ.update(Issuer.load_or_create(DEFAULT_DIRECTORY).environment())
        issuer_note = f"the local issuer in {DEFAULT_DIRECTORY}/ (a token: make -s token)"

    try:  # before anything is started, so a busy port is one line and nothing to clean up
        listener = socket.create_server((args.host, args.port), backlog=256, reuse_port=False)
    except OSError as error:
        sys.exit(f"make serve: cannot listen on {args.host}:{args.port}: {error.strerror}. "
                 f"Stop what uses it, or pick another port: PORT={args.port + 1} make serve")
    listener.setblocking(False)
    tls = None
    if args.tls:
        from localdev.tls import LocalCA

        local_ca = LocalCA.load_or_create()
        tls = local_ca.server_context()
    scheme = "https" if tls else "http"

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

        global _waiting_slots, _websocket_channel
        _websocket_channel, websocket_inbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        connections_listener = socket.create_server(("127.0.0.1", 0))
        os.environ["CONNECTIONS_ENDPOINT"] = f"http://127.0.0.1:{connections_listener.getsockname()[1]}"
        workers_count = max(1, args.workers)
        _waiting_slots = multiprocessing.Semaphore(min(args.waiting or max(1, workers_count // 2), workers_count))
        jobs = [(_worker, listener, tls)] * workers_count + [(_websocket_process, websocket_inbox,
                                                              connections_listener)]
        if os.environ.get("STREAM_PROCESSOR", "on") != "off":
            jobs.append((_fanout_worker, endpoint, os.environ["TABLE_NAME"]))
            events_file = os.environ.setdefault("CHANGE_EVENTS_FILE", os.path.abspath(DEFAULT_EVENTS_FILE))
            os.makedirs(os.path.dirname(events_file), exist_ok=True)
            jobs.append((_stream_worker, endpoint, os.environ["TABLE_NAME"]))
            print(f"Stream processor on the table's stream; DeviceStateChanged events go to {events_file}",
                  flush=True)
        workers.update((_forked(*job), job) for job in jobs)
        print(f"Serving the device-state API on {scheme}://{args.host}:{args.port} "
              f"(table {os.environ['TABLE_NAME']}, {len(workers)} workers); Ctrl-C stops", flush=True)
        if tls is None:
            print(f"WebSocket push: ws://{args.host}:{args.port}{websocket.PATH} (@connections on "
                  f"{os.environ['CONNECTIONS_ENDPOINT']})", flush=True)
        else:
            print("WebSocket push is served without TLS only (make serve, not TLS=1)", flush=True)
        print(f"API docs: {scheme}://{args.host}:{args.port}/docs (Swagger UI over "
              f"{scheme}://{args.host}:{args.port}/openapi.json)", flush=True)
        print(f"Every route but /openapi.json and /docs needs 'Authorization: Bearer <token>' from "
              f"{issuer_note}{', or a device certificate' if tls else ''}", flush=True)
        if tls:
            print(f"TLS: the server's certificate is signed by the local CA {local_ca.certificate_path} "
                  f"(curl --cacert {local_ca.certificate_path}); a client certificate of that CA is asked for, "
                  f"not required: a device's from make -s device-cert DEVICE=<id>", flush=True)
        print(f"For scripts and the library: {_library_environment(endpoint)}", flush=True)
        _supervise(workers)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
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
        if dynamodb_local:
            dynamodb_local.stop()
        print("stopped", flush=True)


if __name__ == "__main__":
    main()
