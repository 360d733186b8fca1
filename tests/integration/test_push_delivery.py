"""In-order delivery under concurrency, on DynamoDB Local: a catch-up and a fan-out per
version run at once for the same subscribers, their posts slowed at random so they
interleave. After dropping repeats, each subscriber has every version after its since
exactly once, in order. The naive control (each sender posts the change it was given, as a
stream record would, with no watermark) delivers them out of order."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from functions.device_state import MergePatch
from functions.device_state.client import dynamodb_client
from functions.push.delivery import CatchUpStopped, Delivery, PostFailed
from functions.push.subscriptions import DELIVERED, Subscriptions
from localdev.faults import Forwarder
from tests.helpers import Clock
from tests.integration.test_changes import feed, follow  # noqa: F401  (the local stream processor)

pytestmark = [pytest.mark.dynamodb_local, pytest.mark.concurrency, pytest.mark.table_stream]
VERSIONS = 20
SUBSCRIBERS = 3


class Recorder:
    def __init__(self, seed: int):
        self.received: dict[str, list[int]] = {}
        self.lock = threading.Lock()
        self.rng = random.Random(seed)

    def post(self, connection_id: str, message: dict) -> None:
        with self.lock:
            pause = self.rng.random() * 0.004
        time.sleep(pause)  # the post's own latency, so senders interleave
        if message.get("type") == "change":
            with self.lock:
                self.received.setdefault(connection_id, []).append(message["version"])


def first_arrivals(versions: list[int]) -> list[int]:
    """What a client keeps when it drops versions it has already seen."""
    kept = []
    for version in versions:
        if not kept or version > kept[-1]:
            kept.append(version)
    return kept


@pytest.fixture
def recorded(feed, local_table):  # noqa: F811
    """A device with VERSIONS versions whose changes the stream processor has recorded."""
    manager, log, start = feed
    start()
    manager.create("lamp", {"n": 0})
    for n in range(1, VERSIONS):
        manager.update_with_retry("lamp", MergePatch({"n": n}))
    assert [change.version for change in follow(log, "lamp", VERSIONS)] == list(range(1, VERSIONS + 1))
    client, name = local_table
    return Subscriptions(client, name), log


def _run(recorded, seed: int, naive: bool) -> dict[str, list[int]]:
    subscriptions, log = recorded
    recorder = Recorder(seed)
    delivery = Delivery(subscriptions, log, recorder.post)
    subscribers = []
    for number in range(SUBSCRIBERS):
        connection = f"c{seed}-{number}"
        subscriptions.open(connection, "test")
        subscribers.append(subscriptions.subscribe(connection, "lamp", 0, ("state", "desired", "reported")))
    barrier = threading.Barrier(VERSIONS + 1)

    def sender(version):
        barrier.wait()
        if naive:
            change = log.read("lamp", version - 1, 1)[0] if version else None
            for subscription in subscribers if change else ():
                recorder.post(subscription.connection_id, {"type": "change", "version": change.version})
        elif version == 0:
            for subscription in subscribers:
                delivery.advance(subscription)  # the catch-up on subscribe
        else:
            delivery.fan_out("lamp", version)  # the stream's record of this version

    threads = [threading.Thread(target=sender, args=(version,)) for version in range(VERSIONS + 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return recorder.received


def test_every_subscriber_gets_every_version_once_in_order_however_senders_interleave(recorded):
    for seed in range(2):
        received = _run(recorded, seed, naive=False)
        assert len(received) == SUBSCRIBERS
        for versions in received.values():
            kept = first_arrivals(versions)
            assert kept == list(range(1, VERSIONS + 1)), versions
            assert len(kept) == len(set(versions))  # repeats only of versions already kept


def test_the_naive_control_delivers_out_of_order(recorded):
    orders = [first_arrivals(versions) for versions in _run(recorded, 7, naive=True).values()]
    assert any(kept != list(range(1, VERSIONS + 1)) for kept in orders), orders


def test_one_subscriber_whose_posts_fail_holds_up_none_of_the_others_and_its_changes_are_sent_again(recorded):
    """A post to "slow" times out: "fine" gets every version all the same, then the fan-out
    raises, so the mapping sends the device's records again, and that retry brings "slow" up
    (where swallowing the failure left it behind until the device wrote again)."""
    subscriptions, log = recorded
    recorder, failing = Recorder(3), {"slow"}

    def post(connection_id, message):
        if connection_id in failing:
            raise TimeoutError("the connection's post timed out")
        recorder.post(connection_id, message)

    for connection in ("slow", "fine"):
        subscriptions.open(connection, "test")
        subscriptions.subscribe(connection, "lamp", 0, ("state",))
    delivery = Delivery(subscriptions, log, post)
    with pytest.raises(PostFailed):
        delivery.fan_out("lamp", VERSIONS)
    assert recorder.received["fine"] == list(range(1, VERSIONS + 1))
    [slow] = [subscription for subscription in subscriptions.of_device("lamp") if subscription.connection_id == "slow"]
    assert slow.delivered == 0
    failing.clear()
    assert delivery.fan_out("lamp", VERSIONS) == 1  # the retry: "fine" is up to date already
    assert recorder.received["slow"] == list(range(1, VERSIONS + 1))
    assert recorder.received["fine"] == list(range(1, VERSIONS + 1))


BETWEEN = pytest.mark.parametrize("between", [False, True], ids=["alone", "another-sender-between"])


def _is_advance(body: bytes) -> bool:
    """The UpdateItem that advances ``delivered`` (the only one that names it)."""
    return DELIVERED in json.loads(body).get("ExpressionAttributeNames", {}).values()


@BETWEEN
def test_a_lost_answer_to_the_watermark_write_leaves_no_gap_and_no_disorder(recorded, dynamodb_local, local_table,
                                                                            between):
    """The advance of ``delivered`` lands and its answer is lost (localdev/faults.py), alone
    or with another sender delivering everything in between: the sender reads the watermark
    again and goes on, so the subscriber's first copies are still 1..VERSIONS in order."""
    client, name = local_table
    subscriptions, log = recorded
    forwarder = Forwarder(dynamodb_local.port)
    try:
        recorder = Recorder(5)
        faulty = Subscriptions(dynamodb_client(forwarder.endpoint, "us-east-1"), name)
        subscriptions.open("c", "test")
        subscription = subscriptions.subscribe("c", "lamp", 0, ("state",))
        other = Delivery(subscriptions, log, recorder.post)
        forwarder.lose("UpdateItem", when=_is_advance,
                       then=(lambda: other.advance(subscriptions.current(subscription))) if between else None)
        Delivery(faulty, log, recorder.post).advance(subscription)
        assert forwarder.lost == ["UpdateItem"]
        assert first_arrivals(recorder.received["c"]) == list(range(1, VERSIONS + 1)), recorder.received
        assert subscriptions.current(subscription).delivered == VERSIONS
    finally:
        forwarder.close()


def test_the_naive_control_claim_then_post_loses_the_version_whose_answer_was_lost(recorded, dynamodb_local,
                                                                                  local_table):
    """Claiming a version (advancing ``delivered``) before posting it, a lost answer reads as
    "not mine" and the version that landed is never posted: a gap."""
    client, name = local_table
    subscriptions, log = recorded
    forwarder = Forwarder(dynamodb_local.port)
    try:
        recorder = Recorder(6)
        faulty = Subscriptions(dynamodb_client(forwarder.endpoint, "us-east-1"), name)
        subscriptions.open("n", "test")
        subscription = subscriptions.subscribe("n", "lamp", 0, ("state",))
        forwarder.lose("UpdateItem", when=_is_advance)
        for change in log.read("lamp", 0, VERSIONS):
            if faulty.advance(subscription, change.version):
                recorder.post("n", {"type": "change", "version": change.version})
            subscription = faulty.current(subscription)
        assert first_arrivals(recorder.received["n"]) != list(range(1, VERSIONS + 1))
    finally:
        forwarder.close()


def test_a_fan_out_that_read_its_subscriber_before_the_token_expired_posts_no_repeat_after(recorded, local_table):
    """Row 16 of issue 27, step by step: the fan-out reads the subscriber
    (delivered 0) while the connection's token is valid; its read of the changes stalls; the
    catch-up delivers every version meanwhile, and the token expires. The fan-out then goes
    on with the subscriber it read: it may not post version 1 again, past the expiry."""
    client, name = local_table
    _, log = recorded
    clock = Clock(time.time())
    subscriptions = Subscriptions(client, name, clock=clock)
    subscriptions.open("x", "test", credential_expires_at=int(clock.now) + 4)
    subscription = subscriptions.subscribe("x", "lamp", 0, ("state",))
    recorder = Recorder(8)
    catch_up = Delivery(subscriptions, log, recorder.post)

    class StalledLog:
        def read(self, *args):
            catch_up.advance(subscription)
            clock.now += 5
            return log.read(*args)

        def __getattr__(self, name):
            return getattr(log, name)

    Delivery(subscriptions, StalledLog(), recorder.post).fan_out("lamp", VERSIONS)
    assert recorder.received["x"] == list(range(1, VERSIONS + 1))  # the catch-up's, before the expiry; no repeat


def test_a_catch_up_that_runs_past_the_token_expiry_stops_posting_there(recorded, local_table):
    client, name = local_table
    _, log = recorded
    clock = Clock(time.time())
    subscriptions = Subscriptions(client, name, clock=clock)
    subscriptions.open("y", "test", credential_expires_at=int(clock.now) + 4)
    recorder = Recorder(9)

    def post(connection_id, message):
        recorder.post(connection_id, message)
        if message["version"] == 3:
            clock.now += 5  # the token expires while version 3 is posted

    Delivery(subscriptions, log, post).advance(subscriptions.subscribe("y", "lamp", 0, ("state",)))
    assert recorder.received["y"] == [1, 2, 3]


def test_a_catch_up_stops_at_its_time_and_says_where_it_got(recorded, monkeypatch):
    """A catch-up posts no change once its time is up (the push function's own limit would cut
    it off anywhere): it raises where it got, and a subscribe from there sends the rest."""
    from types import SimpleNamespace

    from functions.push import delivery as delivery_module

    subscriptions, log = recorded
    recorder, posted = Recorder(4), []

    def post(connection_id, message):  # each post takes a second of the catch-up's clock
        posted.append(message.get("version"))
        recorder.post(connection_id, message)

    subscriptions.open("c", "test")
    delivery = Delivery(subscriptions, log, post)
    monkeypatch.setattr(delivery_module, "time", SimpleNamespace(monotonic=lambda: len(posted)))
    with pytest.raises(CatchUpStopped, match="up to version 5"):
        delivery.advance(subscriptions.subscribe("c", "lamp", 0, ("state",)), until=5)
    assert posted == [1, 2, 3, 4, 5]
    monkeypatch.undo()
    delivery.advance(subscriptions.subscribe("c", "lamp", 5, ("state",)), until=time.monotonic() + 60)
    assert first_arrivals(recorder.received["c"]) == list(range(1, VERSIONS + 1))


def test_a_connection_the_fan_out_finds_gone_is_forgotten_with_the_devices_connectivity(feed, local_table,  # noqa: F811
                                                                                          monkeypatch):
    """The device's own connection is gone when the fan-out posts to it (API Gateway answers
    410, its $disconnect still to come): the fan-out forgets it as $disconnect does, so the
    device reads disconnected. Closing only its subscriptions left the device connected for
    the connection's 2 hours: the $disconnect that came next found nothing to forget."""
    from functions.auth.principals import Principal
    from functions.config import PushConfig
    from functions.push import services as push_services
    from functions.push.delivery import Gone

    manager, log, start = feed
    start()
    client, name = local_table
    monkeypatch.setattr(push_services, "devices", lambda: manager)
    subscriptions = Subscriptions(client, name)
    manager.create("lamp", {"n": 0})
    until = subscriptions.open("own", Principal.device("lamp").subject)
    assert manager.connected("lamp", "own", until)
    subscriptions.subscribe("own", "lamp", 1, ("desired",), own=True)
    manager.update_with_retry("lamp", MergePatch({"power": "on"}), section="desired")
    follow(log, "lamp", 2)

    def gone(connection_id, message):
        raise Gone(connection_id)

    monkeypatch.setenv("TABLE_NAME", name)
    monkeypatch.setenv("DYNAMODB_ENDPOINT", client.meta.endpoint_url)
    monkeypatch.setattr(push_services, "push_config", PushConfig.from_environment)  # not another test's, cached
    push_services.services.cache_clear()
    try:
        _, delivery = push_services.services()  # as the push functions make it
    finally:
        push_services.services.cache_clear()
    delivery.post = gone
    delivery.fan_out("lamp", 2)
    assert manager.get("lamp").as_dict()["connectivity"]["connected"] is False
    assert "connections" not in manager.live_state("lamp")


def test_a_catch_up_through_changes_it_does_not_follow_stops_at_its_time_too(recorded, monkeypatch):
    """A subscriber of desired behind a device of state changes only (but its creation): the
    catch-up sends nothing, page after page, and stops all the same once its time is up, each page passed over recorded,
    where only a post looked at the clock (a chatty device's catch-up ran on past the function)."""
    from types import SimpleNamespace

    from functions.push import delivery as delivery_module

    subscriptions, log = recorded
    reads, read = [], log.read

    def counted(*args, **kwargs):  # each page read takes a second of the catch-up's clock
        reads.append(args)
        return read(*args, **kwargs)

    monkeypatch.setattr(log, "read", counted)
    monkeypatch.setattr(delivery_module, "PAGE", 5)
    monkeypatch.setattr(delivery_module, "time", SimpleNamespace(monotonic=lambda: len(reads)))
    subscriptions.open("c", "test")
    with pytest.raises(CatchUpStopped, match="up to version 10"):
        Delivery(subscriptions, log, lambda *_: None).advance(
            subscriptions.subscribe("c", "lamp", 0, ("desired",)), until=2)
    assert len(reads) == 2 and subscriptions.current(subscriptions.of_device("lamp")[0]).delivered == 10
