"""The HTTP front of `make serve`: worker processes that accept connections on a shared
socket, read each request under a deadline, turn it into an API Gateway HTTP API proxy event for
the same ``lambda_handler`` that Lambda runs, and answer it.

Like Lambda, each worker handles one request at a time (Powertools' resolver keeps the
current request on the app object, so threads sharing one handler would mix requests);
several workers share the listening socket, so requests run concurrently. A worker accepts a
connection only when it is idle and closes it after one response, so a long request (a
lease wait) never holds up another client's request queued behind it. Reading a request
has a deadline (``REQUEST_READ_SECONDS``, and each socket read too), so an idle or slow
client holds a worker for a few seconds at most, never all of them for good.

With TLS (``localdev/tls.py``'s local CA) the handshake is done by the worker that accepted
the connection, under the same read deadline, so a slow or failed handshake holds up no
other client; a client certificate reaches the handler as API Gateway passes one verified by
mutual TLS (``requestContext.identity.clientCert``). A ``GET /ws`` under TLS cannot take its
TLS state to the WebSocket process, so the worker that read it hands that process a plain
socket instead and relays bytes between the two in a thread of its own (``_relay``), going
back to serving requests meanwhile: wss is served on the TLS port, as ws is on the plain one.
Deployed, the WebSocket API takes no client certificate, and neither does this relay.

Requests that wait (a long-poll of the change feed, a lease request with ``waitSeconds``)
may take at most a set number of workers at once (``configure``); one more is answered 503
with Retry-After, so other requests always find a worker. A waiting request whose client
hangs up is stopped at once (as if its Lambda had crashed, which the lease queue and the
feed are built to survive), and its worker goes back to serving.
"""

from __future__ import annotations

import base64
import json
import os
import re
import select
import signal
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, quote, urlsplit

from localdev import console, docs, websocket
from localdev.apigw import LambdaContext, make_event

MAX_REQUEST_BYTES = 10 * 1024 * 1024  # API Gateway's payload limit
LAMBDA_TIMEOUT_SECONDS = 28.0  # the deployed function's timeout (infra/api.py), so waits are capped alike
REQUEST_READ_SECONDS = float(os.environ.get("REQUEST_READ_SECONDS", "5"))  # to read one whole request
HANG_UP_POLL_SECONDS = 0.1  # how often a waiting request's connection is checked for a hang-up
_waiting_slots = None  # a semaphore shared by the workers (made before they fork)
_waiting_count = 0  # how many it holds
_interruptible = False  # a waiting request is being handled, and may be stopped when its client goes


def configure(waiting: int, websocket_channel: socket.socket | None) -> None:
    """Before the workers fork: how many waiting requests may be handled at once (a semaphore
    the workers share), and where a WebSocket upgrade is handed (None: no WebSocket process)."""
    global _waiting_slots, _waiting_count, _websocket_channel
    import multiprocessing

    _waiting_slots, _waiting_count, _websocket_channel = multiprocessing.Semaphore(waiting), waiting, websocket_channel


class _ClientGone(BaseException):
    """Raised into a waiting request whose client hung up. Not an Exception, so nothing
    on the way (the API's catch-all, the library's retries) mistakes it for a fault."""


def _client_gone(_signum, _frame):
    if _interruptible:
        raise _ClientGone()


def waits(method: str, target: str, body: bytes | None) -> bool:
    """Whether a request may wait: one of the routes that wait (``functions.api.routes.WAITING_ROUTES``,
    which the deployed stack gives a function of their own) asking for a wait where its declaration
    says it asks (``waitSeconds`` in the query, or in the JSON body)."""
    from functions.api.routes import rules_for_path

    url = urlsplit(target)
    declared = [declaration for declaration in rules_for_path(url.path)
                if declaration.waits and method in declaration.methods]
    if not declared:
        return False
    if declared[0].waits == "query":
        return any(value.strip("0") for value in parse_qs(url.query).get("waitSeconds", []))
    if not body:
        return False
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # the handler answers what is wrong with it
        return False
    return isinstance(document, dict) and bool(document.get("waitSeconds"))


def watch_for_hang_up(connection: socket.socket, done: threading.Event) -> None:
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
WEBSOCKET_PREFIX = b"GET /ws"  # then " " or "?"


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

    relayed = None  # a TLS connection handed to a relay (``_Handler._relay_websocket``): not closed here

    def process_request(self, request, client_address) -> None:
        """A ``GET /ws`` goes, unread, to the WebSocket process (localdev/websocket.py); under
        TLS, whose state cannot move to another process, the handler relays it instead."""
        if (self.tls is None and _websocket_channel is not None
                and websocket.is_websocket_request(_peek(request))):
            websocket.hand_off(_websocket_channel, request, client_address)
            _arm(0)  # its deadline is the WebSocket process's now (shutdown_request, which disarms, is skipped)
            request.close()  # this process's copy only: no shutdown, the WebSocket process goes on with it
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        _arm(0)  # whatever happened to the request, its deadline ends with it
        if request is self.relayed:
            self.relayed = None  # the relay thread owns it now
            return
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (TimeoutError, ConnectionError, ssl.SSLError)):
            super().handle_error(request, client_address)

def _peer_closed(connection: socket.socket) -> bool:
    """Whether the client's FIN has arrived (Linux's POLLRDHUP sees it behind unread bytes)."""
    if not hasattr(select, "POLLRDHUP"):
        return False
    poller = select.poll()
    poller.register(connection, select.POLLRDHUP)
    return bool(poller.poll(0))


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
            if more != WEBSOCKET_PREFIX[:len(more)]:
                return more  # not a WebSocket request whatever follows: the handler reads (or times out) the rest
            if len(more) == len(head):
                if _peer_closed(connection):
                    return more  # closed mid request line, behind bytes a peek cannot get past
                time.sleep(0.01)  # no more yet: look again shortly
            head = more
        return head
    except _ReadDeadline:
        raise
    except OSError:
        return b""
    finally:
        connection.settimeout(None)


def _ascii_target(target: str) -> str:
    """The request target with each byte outside ASCII percent-encoded, as a client should have
    sent it: http.server reads the request line as latin-1 (a character per byte), and no byte
    may be decoded here, guessed or lost; the handler reads them as UTF-8 or refuses them."""
    return re.sub("[\x80-\xff]", lambda byte: f"%{ord(byte.group()):02X}", target)


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

    def _refuse(self, status: int, slug: str, title: str, detail: str, headers: dict | None = None) -> None:
        """The server's own refusals (framing, load), as problem details of the service's own
        namespace (docs/api/errors.md), as the handler's are."""
        from functions.problem_details import MEDIA_TYPE, problem

        body = json.dumps(problem(status, slug, title, detail, instance=quote(self.path.split("?")[0], safe="/%")))
        self._send(status, {"Content-Type": MEDIA_TYPE, **(headers or {})}, body.encode())

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
            self._refuse(411, "length-required", "Length required", "send the body with a Content-Length")
            return
        length = self._content_length()
        if length is None:
            self._refuse(400, "bad-request", "Bad request", "Content-Length must be one non-negative decimal integer")
            return
        if length > MAX_REQUEST_BYTES:
            self._refuse(413, "too-large", "Request or resulting item too large",
                         f"requests are limited to {MAX_REQUEST_BYTES} bytes")
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
        event = make_event(self.command, _ascii_target(self.path), headers, body, source_ip=self.client_address[0],
                           client_cert=self._client_cert())
        waiting = waits(self.command, self.path, raw)
        if waiting and not _waiting_slots.acquire(block=False):
            self._refuse(503, "too-many-waiting", "Too many waiting requests",
                         f"this server gives {_waiting_count} of its workers to waiting requests and every one is "
                         "taken; retry after Retry-After",
                         {"Retry-After": "1"})
            return
        try:
            result = self._handle(lambda_handler, event, waiting)
        except _ClientGone:
            self.close_connection = True
            sys.stderr.write(f"{self.client_address[0]} {self.command} {self.path} client hung up while waiting\n")
            return
        finally:
            if waiting:
                _waiting_slots.release()
        payload = result.get("body") or ""
        # Past Lambda's answer limit the invocation fails, and the HTTP API answers 500. Escaped
        # inside the response object, a body at most doubles: only a large one is measured.
        from functions.api.common import LAMBDA_ANSWER_BYTES  # the API's, loaded as the handler is
        if 2 * len(payload.encode()) + 65_536 > LAMBDA_ANSWER_BYTES and \
                len(json.dumps(result, ensure_ascii=False).encode()) > LAMBDA_ANSWER_BYTES:
            sys.stderr.write(f"{self.client_address[0]} {self.command} {self.path} {result['statusCode']}: "
                             f"the answer exceeds Lambda's {LAMBDA_ANSWER_BYTES} bytes; answered 500 as the API would\n")
            self._refuse(500, "answer-too-large", "Internal Server Error",
                         "the function's answer exceeded Lambda's response payload limit")
            return
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
        watcher = threading.Thread(target=watch_for_hang_up, args=(self.connection, done), daemon=True)
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
        if console.handles(self.path):  # the browser console: dev server only, never in Lambda
            self._console()
            return
        if (isinstance(self.connection, ssl.SSLSocket) and _websocket_channel is not None
                and urlsplit(self.path).path == websocket.PATH):
            self._relay_websocket()
            return
        self._serve()

    def do_POST(self) -> None:
        if console.handles(self.path):
            self._console()
            return
        self._serve()

    def _console(self) -> None:
        _arm(0)
        self._send(*console.response(self.command, self.path, self.headers, self.client_address[0],
                                     isinstance(self.connection, ssl.SSLSocket)))

    def _relay_websocket(self) -> None:
        """Hands the WebSocket process one end of a loopback TCP connection (the WebSocket
        server sets TCP options on it) with this request's head written into it (a WebSocket
        client sends nothing more before its answer), and relays between the other end and
        the TLS connection in a thread, as long as both are open."""
        _arm(0)
        head = self.raw_requestline + b"".join(f"{name}: {value}\r\n".encode("latin-1")
                                               for name, value in self.headers.items()) + b"\r\n"
        with socket.create_server(("127.0.0.1", 0)) as listener:
            outer = socket.create_connection(listener.getsockname())
            inner, _ = listener.accept()
        websocket.hand_off(_websocket_channel, inner, self.client_address)
        inner.close()
        outer.sendall(head)
        self.connection.settimeout(None)
        self.server.relayed = self.connection
        self.close_connection = True
        threading.Thread(target=_relay, args=(self.connection, outer), daemon=True).start()

    def log_message(self, format, *args):  # one line per request is written by _serve
        pass


def _relay(tls_connection: ssl.SSLSocket, plain: socket.socket) -> None:
    """Bytes both ways until either side closes. One thread does both directions, so the
    TLS connection is never used from two threads at once (OpenSSL does not allow that)."""
    try:
        while True:
            ready = [tls_connection] if tls_connection.pending() else \
                select.select([tls_connection, plain], [], [])[0]
            for source in ready:
                data = source.recv(65536)
                if not data:
                    return
                (plain if source is tls_connection else tls_connection).sendall(data)
    except (OSError, ValueError):
        pass
    finally:
        plain.close()
        try:
            tls_connection.close()
        except OSError:
            pass


def worker(listener: socket.socket, tls: ssl.SSLContext | None) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGALRM, _read_deadline_passed)
    signal.signal(signal.SIGUSR1, _client_gone)
    server = _Server(listener.getsockname(), _Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = listener  # non-blocking: a worker that loses the race to accept goes back to waiting
    server.tls = tls
    server.serve_forever(poll_interval=0.2)
