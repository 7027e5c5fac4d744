"""Concurrent ingest requests stored in one transaction and learnt as one batch.

Most of what a batch costs on the ingest path is paid per batch, not per event: the
store's fsync, the monitor's commit, and a few dozen array passes of the learning path
whose set-up costs as much as a few hundred events' work. While one batch is stored and
learnt, the requests that arrive queue behind it anyway (one writer owns the learner);
taking them together when their turn comes pays those costs once for all of them
(``docs/decisions/0007``).

Each request keeps its own answer: the events it stored and the ones it repeated, in
its own order, as if it had been stored alone right after the requests before it
(``Driftline.ingest_all``). A group whose transaction fails commits nothing, and its
requests are then stored one by one, so one request's bad batch is never another's
failure; when the database is unreachable, every caller gets that error at once, as it
would alone (a retry could store twice what a commit lost with its connection stored).

Ownership: ``_queue`` belongs to ``_queue_lock``; a request's answer is written by the
thread that holds ``_turn`` when it takes the request, and read by the request's own
thread only after it has held ``_turn`` itself, so the lock orders the two.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.store.database import is_unavailable
from service.store.events import IngestOutcome, NewEvent
from service.stream.writer import StoreFailed

log = logging.getLogger(__name__)

#: Stores batches in one transaction, learns them as one; one outcome per batch.
IngestAll = Callable[[Sequence[Sequence[NewEvent]]], list[IngestOutcome]]


@dataclass(slots=True, eq=False)
class _Request:
    events: Sequence[NewEvent]
    outcome: IngestOutcome | None = None
    error: BaseException | None = None
    done: bool = False


class CoalescingIngest:
    """Stores and learns each caller's batch, together with the batches queued beside it.

    Parameters
    ----------
    ingest_all
        Stores batches in one transaction and learns them, one outcome each
        (``Driftline.ingest_all``).
    max_events
        Most events taken together; a batch larger than it goes alone. 0 or 1: every
        batch alone.
    observe
        Told the number of batches of each group (``driftline_ingest_group_batches``).
    """

    def __init__(
        self, ingest_all: IngestAll, max_events: int, observe: Callable[[int], None] | None = None
    ) -> None:
        self._ingest_all = ingest_all
        self.max_events = max_events
        self._observe = observe
        self._queue: deque[_Request] = deque()
        self._queue_lock = threading.Lock()
        self._turn = threading.Lock()
        #: Groups taken and the batches they held.
        self.groups = 0
        self.batches = 0

    def __call__(self, events: Sequence[NewEvent]) -> IngestOutcome:
        """Store and learn ``events``; returns once they are durable and learnt.

        Raises what storing or learning them raised.
        """
        request = _Request(events)
        with self._queue_lock:
            self._queue.append(request)
        while True:
            with self._turn:
                if not request.done:
                    self._run(self._take())
            if request.done:
                break
        if request.error is not None:
            raise request.error
        assert request.outcome is not None
        return request.outcome

    def _take(self) -> list[_Request]:
        """The oldest queued requests, as many as fit ``max_events`` (at least one)."""
        with self._queue_lock:
            group = [self._queue.popleft()]
            total = len(group[0].events)
            while self._queue and total + len(self._queue[0].events) <= self.max_events:
                total += len(self._queue[0].events)
                group.append(self._queue.popleft())
        return group

    def _run(self, group: list[_Request]) -> None:
        """Store and learn ``group`` together; alone, each, if the group's store fails."""
        self.groups += 1
        self.batches += len(group)
        if self._observe is not None:
            self._observe(len(group))
        if len(group) > 1 and self._together(group):
            return
        for request in group:
            self._alone(request)

    def _together(self, group: list[_Request]) -> bool:
        """Answer every request of ``group`` from one ``ingest_all``; False, answering
        none, when the transaction failed for a reason of one batch's own."""
        try:
            outcomes = self._ingest_all([request.events for request in group])
        except StoreFailed as failed:
            cause = failed.__cause__ or failed
            if not is_unavailable(cause):
                log.warning(
                    "a group of %d batches was not stored (%s); storing each alone",
                    len(group),
                    cause,
                )
                return False
            # An outage fails every batch alike, and a commit lost with the connection
            # may have landed: answer each caller with it, as alone.
            self._answer(group, error=cause)
        except BaseException as exc:  # stored, then learning failed: tell every caller
            self._answer(group, error=exc)
        else:
            for request, outcome in zip(group, outcomes, strict=True):
                request.outcome, request.done = outcome, True
        return True

    def _alone(self, request: _Request) -> None:
        try:
            request.outcome = self._ingest_all([request.events])[0]
        except StoreFailed as failed:
            request.error = failed.__cause__ or failed
        except BaseException as exc:
            request.error = exc
        request.done = True

    @staticmethod
    def _answer(group: list[_Request], *, error: BaseException) -> None:
        for request in group:
            request.error, request.done = error, True
