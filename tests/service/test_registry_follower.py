"""The registry follower's loop: a stop ends it without another round."""

from __future__ import annotations

import threading
import time

from service.rollout.follower import RegistryFollower


def test_no_tick_runs_once_a_stop_is_asked() -> None:
    ticked = threading.Event()
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(time.monotonic())
        ticked.set()

    follower = RegistryFollower(threading.Event(), on_tick=[tick], looks=[])
    follower.start(None)
    assert ticked.wait(timeout=30)
    asked = time.monotonic()
    follower.stop()
    assert all(at < asked for at in ticks), "a tick ran after the stop was asked"
