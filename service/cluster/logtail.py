"""The log tail: a replica applies the events other replicas stored, in log order.

Every ``LOG_POLL_S`` the tail asks the database for the newest event id; when it is
past what the learner has applied, ``catch_up`` applies the rest (``Driftline``). A
reader that needs a position applied (``/recommend?after=``) wakes the tail at once
and waits for it (``wait_for``).

Ownership: one thread; ``wait_for`` may be called from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

from service.background import BackgroundLoop

log = logging.getLogger(__name__)

#: How often ``wait_for`` looks at the applied position.
_WAIT_STEP_S = 0.005


class LogTail:
    """Keeps ``applied()`` close behind ``head()`` by calling ``catch_up``."""

    def __init__(
        self,
        head: Callable[[], int],
        applied: Callable[[], int],
        catch_up: Callable[[], object],
        poll_s: float,
    ) -> None:
        self.head = head
        self.applied = applied
        self.catch_up = catch_up
        self.poll_s = poll_s
        #: The newest log position seen at the last look (for the lag metric).
        self.seen_head = 0
        self._wake = threading.Event()
        self._loop = BackgroundLoop("log-tail", wake=self._wake)

    @property
    def lag(self) -> int:
        """Events stored that this replica had not applied at the last look."""
        return max(0, self.seen_head - self.applied())

    def look(self) -> bool:
        """Apply what other replicas stored since the last look; returns whether any."""
        self.seen_head = self.head()
        if self.seen_head <= self.applied():
            return False
        self.catch_up()
        return True

    def wait_for(self, position: int, timeout_s: float) -> bool:
        """Block until the log up to ``position`` is applied, at most ``timeout_s``;
        returns whether it is."""
        deadline = time.monotonic() + timeout_s
        while self.applied() < position:
            if time.monotonic() >= deadline:
                return False
            self._wake.set()
            time.sleep(_WAIT_STEP_S)
        return True

    def start(self) -> None:
        self._loop.start(self._run)

    def stop(self) -> None:
        self._loop.stop()

    def _run(self) -> None:
        while not self._loop.stopped.is_set():
            try:
                self.look()
            except SQLAlchemyError:
                log.warning("log tail: database unreachable; trying again", exc_info=True)
                self._loop.stopped.wait(1.0)
            except Exception:  # the tail must outlive a bad batch; the next look retries
                log.exception("log tail: applying the log failed")
                self._loop.stopped.wait(1.0)
            self._wake.wait(self.poll_s)
            self._wake.clear()
