"""``BackgroundLoop``: one thread per loop, and a stop that ends the loop's rests at once."""

from __future__ import annotations

import threading
import time

from service.background import BackgroundLoop


def test_a_loop_runs_once_however_often_started_and_a_stop_ends_its_rest() -> None:
    loop = BackgroundLoop("test-loop")
    rounds: list[str] = []

    def body() -> None:
        while not loop.stopped.wait(60.0):  # a rest far longer than the test
            rounds.append(threading.current_thread().name)

    loop.start(body)
    loop.start(body)  # already running: no second thread
    assert loop.running
    assert [t.name for t in threading.enumerate()].count("test-loop") == 1
    began = time.monotonic()
    loop.stop(timeout_s=5)
    assert time.monotonic() - began < 5 and not loop.running
    assert "test-loop" not in [t.name for t in threading.enumerate()]
    assert rounds == []  # the rest was cut short, not waited out


def test_a_stop_sets_the_wake_event_and_a_restart_runs_again() -> None:
    wake = threading.Event()
    loop = BackgroundLoop("test-wake", wake=wake)
    woken = threading.Event()

    def body() -> None:
        wake.wait(60.0)
        woken.set()

    loop.start(body)
    loop.stop(timeout_s=5)
    assert wake.is_set() and woken.is_set()
    wake.clear()
    woken.clear()
    loop.start(body)  # stopped loops start again (a replica that leads again)
    assert loop.running and not loop.stopped.is_set()
    loop.stop(timeout_s=5)
    assert woken.is_set()
