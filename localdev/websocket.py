"""The WebSocket API under `make serve`: ``ws://127.0.0.1:3000/ws``, on the HTTP port.

An HTTP worker that accepts a connection whose request is ``GET /ws`` hands the socket,
unread, to this process (over a Unix socket, SCM_RIGHTS), which runs the WebSocket
handshake (``websockets``), the authorizer step of ``$connect`` (the same authorizer
function as the HTTP routes, token in the Authorization header, a ``bearer.<token>`` subprotocol
or ``?token=``), with the subprotocol the ``$connect`` answer selected, and then
feeds ``functions.push.handler`` the events API Gateway would: ``$connect``, one event per
message (route ``subscribe``, ``unsubscribe`` or ``$default`` by its ``action``), and
``$disconnect``. Posts to a connection go through ``@connections``, which this process
serves on a loopback port of its own (``CONNECTIONS_ENDPOINT``), as API Gateway's
management API; the stream's fan-out worker posts there too."""

from __future__ import annotations

import base64
import json
import queue
import socket
import traceback
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from functions.push.delivery import MAX_MESSAGE_BYTES
from functions.push.subscriptions import CONNECTION_LIFETIME_SECONDS
from localdev.apigw import LambdaContext, STAGE

PATH = "/ws"
IDLE_SECONDS = 10 * 60  # API Gateway's idle timeout, kept here too
METHOD_ARN = f"arn:aws:execute-api:us-east-1:000000000000:local-ws/{STAGE}/$connect"


def is_websocket_request(head: bytes) -> bool:
    """Whether the first bytes of a request are a ``GET /ws`` (with or without a query)."""
    return head.startswith(b"GET /ws ") or head.startswith(b"GET /ws?")


def hand_off(channel: socket.socket, connection: socket.socket, address) -> None:
    """Passes an accepted connection, unread, to the WebSocket process."""
    socket.send_fds(channel, [json.dumps(list(address)).encode()], [connection.fileno()])


OUTBOX_MESSAGES = 1000  # posts waiting for a client that does not read; one more and it is dropped


class Gateway:
    """The connections this process holds, by API Gateway-style connection id. A post is
    queued for the connection's own sender thread and answered at once, as API Gateway
    answers a post, so a client that stops reading holds up nobody else; when its queue is
    full, it is closed (and then gone, 410)."""

    def __init__(self):
        self.connections: dict[str, object] = {}
        self.outboxes: dict[str, queue.Queue] = {}
        self.connected_at: dict[str, float] = {}
        self.last_active: dict[str, float] = {}

    def add(self, connection_id: str, connection) -> None:
        outbox = queue.Queue(OUTBOX_MESSAGES)
        self.connections[connection_id], self.outboxes[connection_id] = connection, outbox
        self.connected_at[connection_id] = time.time()
        threading.Thread(target=self._send_all, args=(connection, outbox), daemon=True).start()

    def remove(self, connection_id: str) -> None:
        self.connections.pop(connection_id, None)
        outbox = self.outboxes.pop(connection_id, None)
        try:
            if outbox is not None:
                outbox.put_nowait(None)  # the sender stops; full, it stops at its next send to the closed connection
        except queue.Full:
            pass

    @staticmethod
    def _send_all(connection, outbox: queue.Queue) -> None:
        while (data := outbox.get()) is not None:
            try:
                connection.send(data.decode())
            except Exception:  # noqa: BLE001 - closed meanwhile: what is left goes nowhere
                return

    def post(self, connection_id: str, data: bytes) -> bool:
        connection, outbox = self.connections.get(connection_id), self.outboxes.get(connection_id)
        if connection is None or outbox is None:
            return False
        try:
            outbox.put_nowait(data)
        except queue.Full:
            connection.close(1008, "too slow: reconnect, and subscribe again from the last version seen")
            self.remove(connection_id)
            return False
        return True


def _event(route: str, connection_id: str, authorizer: dict, body: str | None = None,
           request=None) -> dict:
    event = {"requestContext": {
        "routeKey": route, "eventType": {"$connect": "CONNECT", "$disconnect": "DISCONNECT"}.get(route, "MESSAGE"),
        "connectionId": connection_id, "stage": STAGE, "domainName": "127.0.0.1", "apiId": "local-ws",
        "requestId": str(uuid.uuid4()), "connectedAt": int(time.time() * 1000), "authorizer": authorizer}}
    if request is not None:
        url = urlsplit(request.path)
        headers: dict[str, list[str]] = {}
        for name, value in request.headers.raw_items():
            headers.setdefault(name, []).append(value)
        event["headers"] = {name: values[-1] for name, values in headers.items()}
        event["multiValueHeaders"] = headers  # as API Gateway's: a repeated header is seen whole
        query = parse_qs(url.query)
        event["queryStringParameters"] = {name: values[-1] for name, values in query.items()} or None
        event["multiValueQueryStringParameters"] = query or None
    if body is not None:
        event["body"] = body
        event["isBase64Encoded"] = False
    return event


def _route(body: str) -> str:
    """API Gateway's route selection expression ``$request.body.action``."""
    try:
        action = json.loads(body).get("action")
    except (ValueError, AttributeError, RecursionError):
        return "$default"
    return action if action in ("subscribe", "unsubscribe") else "$default"


def serve(channel: socket.socket, connections_listener: socket.socket) -> None:
    """Runs in its own process: receives handed-off sockets and serves them, and serves @connections."""
    from websockets.datastructures import Headers
    from websockets.exceptions import ConnectionClosedError
    from websockets.http11 import Response
    from websockets.sync.server import serve as websocket_server

    from functions.auth import authorizer
    from functions.auth.credentials import load_auth_config
    from functions.push.handler import lambda_handler
    from functions.push.services import services

    # Made once, before connections come: a flood of first connects would otherwise each build
    # the clients at once (a Lambda instance takes one event at a time; this process takes many).
    services()
    load_auth_config()
    gateway = Gateway()

    def refuse(status: int, headers: dict | None = None, body: dict | None = None) -> Response:
        data = b"" if body is None else json.dumps(body).encode()
        return Response(status, HTTPStatus(status).phrase, Headers({**(headers or {}), "Content-Length": str(len(data))}),
                        data)

    def process_request(connection, request):
        """API Gateway's part before the connection exists: the route, then the authorizer."""
        if urlsplit(request.path).path != PATH:
            return refuse(404, {"Content-Type": "application/problem+json"},
                          {"type": "about:blank", "title": "Not found", "status": 404, "detail": f"WebSocket is on {PATH}"})
        if "websocket" not in request.headers.get("Upgrade", "").lower():
            return None  # the handshake answers 426, before anything is connected
        connection_id = base64.b64encode(uuid.uuid4().bytes[:10]).decode()
        event = _event("$connect", connection_id, {}, request=request)
        try:
            decision = authorizer.decide({**event, "type": "REQUEST", "methodArn": METHOD_ARN})
        except authorizer.Unauthorized:
            return refuse(*authorizer.unauthorized_problem())
        context = {"principalId": decision["principalId"], **decision["context"]}
        answer = lambda_handler({**event, "requestContext": {**event["requestContext"], "authorizer": context}},
                                LambdaContext())
        status = answer.get("statusCode")
        if status == 401:
            return refuse(*authorizer.unauthorized_problem())
        if status != 200:  # the $connect integration's status and Retry-After, never its body
            retry_after = (answer.get("headers") or {}).get("Retry-After")
            return refuse(status, {"Retry-After": retry_after} if retry_after else None)
        connection.device_state_route = (connection_id, context)  # for handle(), once connected
        # The subprotocol the $connect answer selected, which API Gateway hands on (select_subprotocol)
        connection.device_state_subprotocol = (answer.get("headers") or {}).get("Sec-WebSocket-Protocol")
        return None

    def select_subprotocol(connection, _offered):
        return getattr(connection, "device_state_subprotocol", None)

    def handle(connection) -> None:
        connection_id, context = connection.device_state_route
        gateway.add(connection_id, connection)
        try:
            for message in connection:
                if isinstance(message, bytes):
                    message = message.decode(errors="replace")
                gateway.last_active[connection_id] = time.time()
                try:
                    lambda_handler(_event(_route(message), connection_id, context, body=message), LambdaContext())
                except Exception:  # noqa: BLE001 - as API Gateway does when a route's Lambda fails
                    traceback.print_exc()
                    gateway.post(connection_id, json.dumps({"message": "Internal server error"}).encode())
        except ConnectionClosedError:
            pass  # the client went without a close frame (a lost network, a killed process): a normal end
        finally:
            gateway.remove(connection_id)
            lambda_handler(_event("$disconnect", connection_id, context), LambdaContext())

    placeholder = socket.create_server(("127.0.0.1", 0))  # the handler is what serves each handed-off socket
    server = websocket_server(handle, sock=placeholder, process_request=process_request,
                              select_subprotocol=select_subprotocol, compression=None,
                              ping_interval=30, ping_timeout=30, max_size=MAX_MESSAGE_BYTES)
    threading.Thread(target=_serve_connections_api, args=(connections_listener, gateway), daemon=True).start()
    threading.Thread(target=_expire, args=(gateway,), daemon=True).start()
    while True:
        _, fds, _, _ = socket.recv_fds(channel, 1024, 1)
        if not fds:
            continue
        handed = socket.socket(fileno=fds[0])
        handed.setblocking(True)
        threading.Thread(target=server.handler, args=(handed, handed.getpeername()), daemon=True).start()


def _expire(gateway: Gateway) -> None:
    """API Gateway's limits: a connection idle for 10 minutes, or open for 2 hours, is closed."""
    while True:
        time.sleep(5)
        now = time.time()
        for connection_id, connection in list(gateway.connections.items()):
            idle = now - gateway.last_active.get(connection_id, gateway.connected_at[connection_id])
            if idle > IDLE_SECONDS or now - gateway.connected_at[connection_id] > CONNECTION_LIFETIME_SECONDS:
                connection.close(1001, "going away: reconnect, and subscribe again from the last version seen")


def _serve_connections_api(listener: socket.socket, gateway: Gateway) -> None:
    """The @connections stand-in: POST (send), DELETE (close), GET (info), as API Gateway's."""

    class Handler(BaseHTTPRequestHandler):
        def _connection_id(self) -> str | None:
            parts = urlsplit(self.path).path.split("/")
            return unquote(parts[-1]) if len(parts) >= 3 and parts[-2] == "@connections" else None

        def _answer(self, status: int, body: dict | None = None) -> None:
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(status)
            if status == 410:  # how botocore reads the error's code
                self.send_header("x-amzn-ErrorType", "GoneException")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            connection_id = self._connection_id()
            try:
                sent = connection_id is not None and gateway.post(connection_id, data)
            except Exception:  # noqa: BLE001 - the connection closed while sending: gone
                sent = False
            if sent:
                self._answer(200)
            else:
                self._answer(410, {"message": "GoneException"})

        def do_DELETE(self):
            connection = gateway.connections.get(self._connection_id() or "")
            if connection is None:
                self._answer(410, {"message": "GoneException"})
                return
            connection.close()
            self._answer(204)

        def do_GET(self):
            connection_id = self._connection_id() or ""
            if connection_id not in gateway.connections:
                self._answer(410, {"message": "GoneException"})
                return
            self._answer(200, {"connectedAt": gateway.connected_at[connection_id]})

        def log_message(self, format, *args):
            pass

    server = ThreadingHTTPServer(listener.getsockname(), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = listener
    server.daemon_threads = True
    server.serve_forever()
