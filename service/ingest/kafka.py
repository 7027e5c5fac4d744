"""Exactly-once consumption from Kafka into the event store.

The consumer uses explicit partition assignment (``assign``): the embedded broker's
group protocol does not work with kafka-python (docs/operations.md). Each replica takes
the partitions ``p`` with ``p % replicas == replica``.
The next offset of every partition is stored in the event store in the same
transaction as the events its messages carried, so after any crash the consumer
resumes exactly where the store left off. A message without an ``event_id`` gets
``<topic>-<partition>-<offset>`` as its id, which makes redelivery harmless too.

A message that is not a valid event goes to the dead-letter table with its raw bytes
and the reason, its offset advances, and the loop goes on. A stored offset past the
end of the log means the topic was recreated (the embedded broker keeps its log in
memory); the consumer then starts that partition from its earliest offset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from sqlalchemy import Connection

from service.ingest.validation import EventLimits, parse_event_json
from service.metrics import Metrics
from service.settings import Settings
from service.store import Database
from service.store.events import IngestOutcome, NewEvent
from service.store.offsets import DeadLetter, add_dead_letters, load_offsets, save_offsets

log = logging.getLogger(__name__)


class IngestTarget(Protocol):
    """Where consumed events go: stored with the consumer's offsets in one transaction,
    then evaluated and learnt (``service.wiring.Driftline``)."""

    settings: Settings
    db: Database
    metrics: Metrics

    def ingest(
        self, batch: list[NewEvent], also_write: Callable[[Connection], None] | None = None
    ) -> IngestOutcome: ...


#: After this long without records, check that the broker still answers.
_QUIET_PROBE_SECONDS = 2.0


@dataclass
class ConsumerState:
    """What ``/healthz`` and ``/metrics`` show about consumption."""

    connected: bool = False
    partitions: list[int] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)
    lag: dict[int, int] = field(default_factory=dict)
    consumed: int = 0
    dead_letters: int = 0
    reconnects: int = 0


@dataclass(frozen=True)
class Decoded:
    """One poll's records turned into events, dead letters and next offsets."""

    events: list[NewEvent]
    dead: list[DeadLetter]
    next_offsets: dict[int, int]


def decode(topic: str, records: Iterable[Any], limits: EventLimits) -> Decoded:
    """Events from Kafka records; anything unusable becomes a dead letter, never an error."""
    events: list[NewEvent] = []
    dead: list[DeadLetter] = []
    next_offsets: dict[int, int] = {}
    for record in records:
        next_offsets[record.partition] = record.offset + 1
        event, problem = _decode_one(topic, record, limits)
        if event is not None:
            events.append(event)
        else:
            dead.append(
                DeadLetter(
                    topic, record.partition, record.offset, record.key, record.value, problem
                )
            )
    return Decoded(events, dead, next_offsets)


def _decode_one(topic: str, record: Any, limits: EventLimits) -> tuple[NewEvent | None, str]:
    if record.value is None:
        return None, "message has no value"
    event, problems = parse_event_json(record.value, limits)
    if event is None:
        return None, "; ".join(f"{p.field}: {p.message}" for p in problems)
    if event.event_id is None:
        event = NewEvent(
            event.user_id,
            event.item_id,
            event.rating,
            event.timestamp,
            f"{topic}-{record.partition}-{record.offset}",
        )
    return event, ""


class EventConsumer:
    """Consumes a topic into ``target`` until ``stop()``; reconnects with backoff.

    Parameters
    ----------
    target
        Where events go (stored, evaluated, learned).
    bootstrap, topic
        The broker and topic.
    replica, replicas
        This replica takes partitions ``p`` with ``p % replicas == replica``.
    """

    def __init__(
        self,
        target: IngestTarget,
        bootstrap: str,
        topic: str = "events",
        replica: int = 0,
        replicas: int = 1,
        max_records: int = 5_000,
    ) -> None:
        if not 0 <= replica < replicas:
            raise ValueError(f"replica must be in 0..{replicas - 1}, got {replica}")
        self.target = target
        self.bootstrap = bootstrap
        self.topic = topic
        self.replica = replica
        self.replicas = replicas
        self.max_records = max_records
        self.state = ConsumerState()
        self._stop = threading.Event()
        self._consumer: KafkaConsumer | None = None
        self._resumed_at: dict[int, int] = {}
        self._last_heard = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """The consume loop; returns after ``stop()``."""
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self._connect()
                backoff = 0.5
                while not self._stop.is_set():
                    self._poll_once()
            except KafkaError as exc:
                self.state.connected = False
                self.state.reconnects += 1
                log.warning(
                    "kafka broker %s unreachable (%s); reconnecting in %.1fs",
                    self.bootstrap,
                    type(exc).__name__,
                    backoff,
                )
                self._close()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
        self._close()

    def _connect(self) -> None:
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.max_records,
            fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
            request_timeout_ms=5_000,
            reconnect_backoff_max_ms=5_000,
        )
        self._consumer = consumer
        partitions = self._wait_for_partitions(consumer)
        assigned = [TopicPartition(self.topic, p) for p in partitions]
        consumer.assign(assigned)
        self._seek_to_stored(consumer, assigned)
        self.state.partitions = partitions
        self.state.connected = True
        log.info(
            "consuming %s partitions %s from %s (replica %d of %d)",
            self.topic,
            partitions,
            self.bootstrap,
            self.replica,
            self.replicas,
        )

    def _wait_for_partitions(self, consumer: KafkaConsumer) -> list[int]:
        deadline = time.monotonic() + 15
        while True:
            found = consumer.partitions_for_topic(self.topic)
            if found:
                return sorted(p for p in found if p % self.replicas == self.replica)
            if time.monotonic() > deadline or self._stop.is_set():
                raise KafkaError(f"topic {self.topic!r} not found on {self.bootstrap}")
            self._stop.wait(0.5)

    def _seek_to_stored(self, consumer: KafkaConsumer, assigned: list[TopicPartition]) -> None:
        """Resume every partition at its stored offset, or its beginning if none.

        An offset past the log's end means a recreated topic; ``_poll_once`` checks it
        against the first fetch's high-water mark. The log end is not asked up front:
        the embedded broker's ListOffsets answer lags behind its log (its fetch
        high-water mark is right), so only the fetch path is trusted.
        """
        with self.target.db.connect() as conn:
            stored = load_offsets(conn, self.topic)
        self._resumed_at = {}
        for tp in assigned:
            offset = stored.get(tp.partition)
            if offset is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, offset)
                self._resumed_at[tp.partition] = offset

    def _poll_once(self) -> None:
        assert self._consumer is not None
        polled = self._consumer.poll(timeout_ms=500, max_records=self.max_records)
        records = [record for batch in polled.values() for record in batch]
        if self._resumed_at:
            self._notice_recreated_topic()
        if records:
            self._store(records)
            self._last_heard = time.monotonic()
        elif time.monotonic() - self._last_heard > _QUIET_PROBE_SECONDS:
            self._probe_broker()
        self._refresh_lag()

    def _probe_broker(self) -> None:
        """Ask the broker something; raises ``KafkaError`` if it does not answer.

        An idle poll looks the same whether the topic is quiet or the broker is gone,
        so after a quiet spell one cheap request tells them apart.
        """
        assert self._consumer is not None
        self._consumer.end_offsets(list(self._consumer.assignment()))
        self._last_heard = time.monotonic()

    def _notice_recreated_topic(self) -> None:
        """Restart a partition from its beginning if its log ends below the stored offset.

        That happens when the topic was recreated (the embedded broker keeps its log in
        memory). The broker does not answer "out of range" for it, so the first fetch's
        high-water mark is compared with where the partition resumed.
        """
        assert self._consumer is not None
        for partition, resumed in list(self._resumed_at.items()):
            tp = TopicPartition(self.topic, partition)
            high = self._consumer.highwater(tp)
            if high is None:
                continue
            del self._resumed_at[partition]
            if high < resumed:
                log.warning(
                    "%s[%d] ends at offset %d, below the stored %d: the topic was recreated; "
                    "reading it again from the start (event ids make that safe)",
                    self.topic,
                    partition,
                    high,
                    resumed,
                )
                self._consumer.seek_to_beginning(tp)

    def _store(self, records: list[Any]) -> None:
        settings = self.target.settings
        decoded = decode(self.topic, records, settings.event_limits)

        def write_offsets(conn: Any) -> None:
            add_dead_letters(conn, decoded.dead)
            save_offsets(conn, self.topic, decoded.next_offsets)

        self.target.ingest(decoded.events, also_write=write_offsets)
        self.state.consumed += len(records)
        self.state.positions.update(decoded.next_offsets)
        if decoded.dead:
            self.state.dead_letters += len(decoded.dead)
            self.target.metrics.dead_letters.inc(len(decoded.dead))
            log.warning("%d malformed message(s) sent to dead letters", len(decoded.dead))

    def _refresh_lag(self) -> None:
        """Per-partition lag from the high-water marks of the latest fetches."""
        assert self._consumer is not None
        for tp in self._consumer.assignment():
            high = self._consumer.highwater(tp)
            if high is None:
                continue
            position = self._consumer.position(tp)
            self.state.positions[tp.partition] = position
            self.state.lag[tp.partition] = max(0, high - position)
            self.target.metrics.consumer_lag.labels(partition=str(tp.partition)).set(
                self.state.lag[tp.partition]
            )

    def _close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close(autocommit=False)
            except Exception:  # closing a broken connection must not mask the real error
                log.debug("error closing the kafka consumer", exc_info=True)
            self._consumer = None
