"""Fault injection in front of DynamoDB Local, for tests and the benchmark: an HTTP
forwarder that can let a request land and lose its answer (or drop it before it reaches
DynamoDB), optionally running another writer between the landing and the loss, or hold an
operation's answers for a while (``slow``). Point ``DYNAMODB_ENDPOINT`` (or a client) at
``Forwarder.endpoint``. Loopback only."""

from __future__ import annotations

import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable

from localdev.dynamodb_local import free_port


@dataclass
class Fault:
    target: str  # the operation, as in X-Amz-Target (e.g. "UpdateItem")
    land: bool = True  # forward it (it applies) before the answer is lost
    then: Callable[[], None] | None = None  # runs after it landed, before the answer is lost
    when: Callable[[bytes], bool] | None = None  # only requests whose body matches
    times: int = 1


class Forwarder:
    """``endpoint`` forwards to ``upstream`` (host, port). ``lose(...)`` arms a fault for
    the next matching requests; ``before(...)`` runs an action as the next matching request
    arrives; ``unreachable = True`` drops every request unsent; ``slow[target] = seconds``
    holds each answer to that operation that long."""

    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.faults: list[Fault] = []
        # (target, action, which bodies), each run once
        self.hooks: list[tuple[str, Callable[[], None], Callable[[bytes], bool] | None]] = []
        self.unreachable = False
        self.slow: dict[str, float] = {}
        self.lost: list[str] = []  # targets whose answers were lost
        # (target, probability, rng): also lose that share of those answers, after they landed
        self.random_loss: tuple[str, float, random.Random] | None = None
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def lose(self, target: str, **options) -> Fault:
        fault = Fault(target, **options)
        with self._lock:
            self.faults.append(fault)
        return fault

    def before(self, target: str, action: Callable[[], None],
               when: Callable[[bytes], bool] | None = None) -> Callable[[], None]:
        """Runs ``action`` once, when the next ``target`` request (whose body matches ``when``)
        arrives and before it is forwarded (pausing DynamoDB Local there makes that very request
        wait in it). Returns what takes the hook back if no request has taken it yet."""
        hook = (target, action, when)
        with self._lock:
            self.hooks.append(hook)

        def take_back() -> None:
            with self._lock:
                if hook in self.hooks:
                    self.hooks.remove(hook)
        return take_back

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    # ------------------------------------------------------------ internals

    def _accept(self) -> None:
        while not self._closed:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        try:
            while True:
                request = _read_message(client, is_request=True)
                if request is None:
                    return
                head, body = request
                target = _header(head, b"x-amz-target").split(b".")[-1].decode()
                hook = self._take_hook(target, body)
                if hook is not None:
                    hook()
                fault = self._take_fault(target, body)
                if self.unreachable or (fault is not None and not fault.land):
                    self.lost.append(target)
                    return  # never forwarded: close without an answer
                if upstream is None:
                    upstream = socket.create_connection(self.upstream)
                upstream.sendall(head + body)
                response = _read_message(upstream, is_request=False)
                if response is None:
                    return
                if fault is not None:
                    if fault.then is not None:
                        fault.then()
                    self.lost.append(target)
                    return  # it landed; its answer is lost
                time.sleep(self.slow.get(target, 0))
                client.sendall(response[0] + response[1])
        except OSError:
            return
        finally:
            client.close()
            if upstream is not None:
                upstream.close()

    def _take_hook(self, target: str, body: bytes) -> Callable[[], None] | None:
        with self._lock:
            for index, (hooked, action, when) in enumerate(self.hooks):
                if hooked == target and (when is None or when(body)):
                    del self.hooks[index]
                    return action
        return None

    def _take_fault(self, target: str, body: bytes) -> Fault | None:
        with self._lock:
            if self.random_loss and self.random_loss[0] == target and self.random_loss[2].random() < self.random_loss[1]:
                return Fault(target)
            for fault in self.faults:
                if fault.target == target and fault.times > 0 and (fault.when is None or fault.when(body)):
                    fault.times -= 1
                    return fault
        return None


def _header(head: bytes, name: bytes) -> bytes:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return b""


def _read_message(sock: socket.socket, is_request: bool) -> tuple[bytes, bytes] | None:
    """One HTTP/1.1 message with a Content-Length body (all DynamoDB speaks)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    head += b"\r\n\r\n"
    length = int(_header(head, b"content-length") or 0)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return head, rest[:length]
