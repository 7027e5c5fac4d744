"""The event writer: store a validated batch exactly once and report what is new.

A batch is one transaction: its events, and whatever the caller must commit with them
(the Kafka consumer's offsets, the monitor's heartbeats left over by a failed write), so
an acknowledged event is durable and a retried one is never stored twice (events with an
``event_id`` are deduplicated by the store). Validation happens before, at the edge that
parsed the batch (``service.ingest.validation``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy import Connection

from service.metrics import Metrics
from service.store import Database
from service.store.events import IngestOutcome, NewEvent, store_events

#: Something written in the batch's own transaction.
AlsoWrite = Callable[[Connection], None]


class StoreFailed(Exception):
    """A transaction of batches failed, so none of them was stored (the cause is chained)."""


class EventWriter:
    """Durable, deduplicated writes of event batches."""

    def __init__(self, db: Database, metrics: Metrics) -> None:
        self.db = db
        self.metrics = metrics

    def store_all(
        self, batches: Sequence[Sequence[NewEvent]], *also_write: AlsoWrite
    ) -> list[IngestOutcome]:
        """Store ``batches`` in order and run each of ``also_write``, in one transaction.

        Each outcome is what its batch would have done stored alone right after the
        ones before it: a repeat of an earlier batch's event counts as a duplicate,
        and its ids follow theirs.

        Raises
        ------
        StoreFailed
            When the transaction failed; nothing of it was stored (the error is chained).
        """
        try:
            with self.db.begin() as conn:
                outcomes = [store_events(conn, batch) for batch in batches]
                for write in also_write:
                    write(conn)
        except Exception as exc:
            raise StoreFailed(f"{len(batches)} batch(es) not stored: {exc}") from exc
        return outcomes

    def count(self, outcome: IngestOutcome) -> None:
        """Count what a committed batch accepted and what it found already stored."""
        self.metrics.events_ingested.inc(outcome.accepted)
        self.metrics.events_duplicate.inc(outcome.duplicates)
