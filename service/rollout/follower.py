"""The registry follower: a thread that looks for news at once when this process's
retrainer publishes, and every ``REGISTRY_POLL_SECONDS`` for what other processes did.

Each tick runs the tick tasks: start a drift job that waited for the job before it, and
on the leader answer the retraining requests other replicas stored (``TICK_S`` keeps
their wait under a second). Each look swaps in the registry's target and takes in the
events other processes stored. A failed task or look is logged and the next tick tries
again: the loop ends only when stopped.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence

from service.background import BackgroundLoop

log = logging.getLogger(__name__)

#: How often the loop wakes without a publication, seconds.
TICK_S = 0.2


class RegistryFollower:
    """Runs each of ``on_tick`` every tick and each of ``looks`` when there may be news."""

    def __init__(
        self,
        published: threading.Event,
        on_tick: Sequence[Callable[[], object]],
        looks: Sequence[Callable[[], object]],
    ) -> None:
        self.published = published
        self.on_tick = list(on_tick)
        self.looks = list(looks)
        # A stop sets ``published`` too, so the loop ends without waiting out a tick; the
        # look it would have prompted is left to the next start or the next poll.
        self._loop = BackgroundLoop("registry-follower", wake=published)

    def start(self, every: float | None) -> None:
        """Follow on a thread; ``every`` None: only this process's publications."""
        self._loop.start(functools.partial(self._run, every))

    def stop(self) -> None:
        self._loop.stop()

    def tick(self) -> None:
        """Run each tick task once; one that fails does not keep the others from running."""
        for task in self.on_tick:
            try:
                task()
            except Exception:  # the next tick tries again
                log.exception("tick task %s failed", getattr(task, "__qualname__", task))

    def _run(self, every: float | None) -> None:
        polled = time.monotonic()
        while not self._loop.stopped.is_set():
            self.published.wait(timeout=TICK_S)
            if self._loop.stopped.is_set():
                break
            self.tick()
            due = every is not None and time.monotonic() - polled >= every
            if not (self.published.is_set() or due):
                continue
            polled = time.monotonic()
            try:
                for look in self.looks:
                    look()
            except Exception:  # a failed look must not end the loop; the next one may work
                log.exception("could not check the registry or the events for news")
