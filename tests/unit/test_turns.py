"""DeviceTurns: one writer at a time per device, first come first served, and a writer
that stops waiting leaves the line without holding anyone up."""

from __future__ import annotations

import threading
import time

from functions.device_state.turns import DeviceTurns


def hold(turns, device, timeout, entered, release, results, name):
    with turns.turn(device, timeout) as mine:
        results.append((name, mine))
        entered.set()
        if mine:
            release.wait(5)


def waiter_thread(turns, device, timeout, results, name):
    """A writer that leaves as soon as it has its turn."""
    done = threading.Event()
    done.set()
    thread = threading.Thread(target=hold, args=(turns, device, timeout, threading.Event(), done, results, name))
    thread.start()
    return thread


def wait_until(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_turns_go_in_the_order_asked_and_one_at_a_time():
    turns = DeviceTurns()
    order, inside, most_inside = [], [0], [0]
    lock = threading.Lock()

    def writer(name):
        with turns.turn("lamp", 5) as mine:
            assert mine
            with lock:
                inside[0] += 1
                most_inside[0] = max(most_inside[0], inside[0])
                order.append(name)
            time.sleep(0.01)
            with lock:
                inside[0] -= 1

    with turns.turn("lamp", 5):
        threads = []
        for name in range(6):
            threads.append(threading.Thread(target=writer, args=(name,)))
            threads[-1].start()
            wait_until(lambda: turns.waiting("lamp") == name + 2)  # queued in this order
    for thread in threads:
        thread.join()
    assert order == list(range(6))
    assert most_inside[0] == 1
    assert turns.waiting("lamp") == 0


def test_other_devices_do_not_wait():
    turns = DeviceTurns()
    with turns.turn("lamp", 5) as mine:
        assert mine
        started = time.monotonic()
        with turns.turn("fan", 5) as also_mine:
            assert also_mine
        assert time.monotonic() - started < 1


def test_a_writer_that_times_out_holds_nothing_and_the_next_gets_its_turn():
    turns = DeviceTurns()
    results = []
    entered, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold, args=(turns, "lamp", 5, entered, release, results, "holder"))
    holder.start()
    entered.wait(5)
    impatient = waiter_thread(turns, "lamp", 0.05, results, "impatient")
    patient = waiter_thread(turns, "lamp", 5, results, "patient")
    impatient.join(5)
    assert ("impatient", False) in results
    assert turns.waiting("lamp") == 2  # the holder and the patient one
    release.set()
    holder.join(5)
    patient.join(5)
    assert results[-1] == ("patient", True)
    assert turns.waiting("lamp") == 0


def test_a_turn_handed_over_just_as_the_wait_times_out_is_taken_and_passed_on(monkeypatch):
    """The holder leaves just as a waiter's wait times out: the waiter has been handed the
    turn, so it takes it rather than leave the line (which would strand the one after it)."""
    real_wait = threading.Event.wait
    # every wait reports a timeout, but only after really waiting: the hand-over wins the race
    monkeypatch.setattr(threading.Event, "wait", lambda event, timeout=None: real_wait(event, 2) and False)
    turns = DeviceTurns()
    results = []
    with turns.turn("lamp", 5):
        waiter = waiter_thread(turns, "lamp", 0.01, results, "waiter")
        wait_until(lambda: turns.waiting("lamp") == 2)
        behind = waiter_thread(turns, "lamp", 0.01, results, "behind")
        wait_until(lambda: turns.waiting("lamp") == 3)
    waiter.join(5)
    behind.join(5)
    assert results == [("waiter", True), ("behind", True)]
    assert turns.waiting("lamp") == 0
