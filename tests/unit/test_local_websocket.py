"""The dev server's @connections stand-in answers a post at once, as API Gateway does: a
client that stops reading fills only its own outbox and is then closed (gone), while a post
that sent inline, the naive control, would hold its poster until the client read."""

from __future__ import annotations

import threading
import time

from localdev.websocket import OUTBOX_MESSAGES, Gateway


class StalledClient:
    """A connection whose client never reads: a send blocks until it is closed."""

    def __init__(self):
        self.closed = threading.Event()
        self.sent = 0

    def send(self, _text):
        self.sent += 1
        self.closed.wait()
        raise ConnectionError("closed")

    def close(self, *_args):
        self.closed.set()


def test_posts_to_a_stalled_client_return_at_once_and_a_full_outbox_closes_it():
    gateway, client = Gateway(), StalledClient()
    gateway.add("c1", client)
    started = time.monotonic()
    assert gateway.post("c1", b'{"n": 0}')
    while client.sent == 0:  # the sender thread took it and is stuck in it
        time.sleep(0.01)
    answers = [gateway.post("c1", b'{"n": 1}') for _ in range(OUTBOX_MESSAGES)]
    assert all(answers) and time.monotonic() - started < 1
    assert gateway.post("c1", b'{"n": 2}') is False  # full: closed, and gone from now on
    assert client.closed.is_set() and gateway.post("c1", b"{}") is False


def test_the_naive_control_blocks_its_poster():
    client = StalledClient()
    def post_inline():  # as a post did: the poster sends itself
        try:
            client.send("{}")
        except ConnectionError:
            pass

    poster = threading.Thread(target=post_inline, daemon=True)
    poster.start()
    poster.join(timeout=0.5)
    assert poster.is_alive()  # still blocked: every later post (and the fan-out behind it) waits
    client.close()
