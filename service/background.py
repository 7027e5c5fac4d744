"""Background loops: one named daemon thread per loop, started and stopped one way.

The service's periodic workers (the log tail, the leader election, the registry
follower, the archiver, the key ring) each run a loop on a thread of their own until
the process shuts down. A :class:`BackgroundLoop` owns that thread and the event that
stops it; the worker owns what one round does and how long it rests between rounds,
waiting on :attr:`BackgroundLoop.stopped` so that a stop ends every rest at once.

Ownership: ``start`` and ``stop`` are called by the composition root (start-up and
shutdown, one caller at a time); the loop's body reads ``stopped`` and nothing else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundLoop:
    """A daemon thread named ``name`` that runs a loop body until :meth:`stop`.

    ``wake``, when given, is an event the body rests on besides ``stopped`` (the log
    tail wakes on it when asked to look at once); a stop sets it too, so the body
    sees the stop without waiting out its rest.
    """

    def __init__(self, name: str, *, wake: threading.Event | None = None) -> None:
        self.name = name
        self.wake = wake
        #: Set by :meth:`stop`: the body's rests wait on it, and its loop ends once set.
        self.stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, body: Callable[[], None]) -> None:
        """Run ``body`` on the loop's thread; nothing if it runs already."""
        if self._thread is not None:
            return
        self.stopped.clear()
        self._thread = threading.Thread(target=body, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the body to end and wait for it at most ``timeout_s`` (a round in flight
        finishes first; past the wait the daemon thread is left to end on its own)."""
        self.stopped.set()
        if self.wake is not None:
            self.wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None
