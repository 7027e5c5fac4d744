"""The threads a retrainer starts: one per job, one per job's stragglers."""

from __future__ import annotations

import threading
import time


class JobThreads:
    """Starts the retrainer's threads and waits for them all.

    A job's thread starts its stragglers' thread as it ends, so ``wait`` looks again
    until no thread it knows of is alive.
    """

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, thread: threading.Thread) -> None:
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
            thread.start()  # under the lock: ``wait`` never sees it unstarted

    def wait(self, timeout: float | None = None) -> None:
        """Block until every thread started has finished, or ``timeout`` passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                alive = [t for t in self._threads if t.is_alive()]
            if not alive:
                return
            for thread in alive:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                thread.join(left)
