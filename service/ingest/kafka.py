"""Exactly-once consumption from Kafka into the event store, in a consumer group.

Replicas join the consumer group ``kafka_group`` and Kafka shares the topic's partitions
among them; a replica that starts, stops or dies makes the group rebalance. The group
only decides who reads which partition. Where to read from is the event store's: the
next offset of every partition is stored in the same transaction as the events its
messages carried, and on every assignment each partition is sought to that stored
offset (or its beginning if none). So after any crash or rebalance the store and the
offsets agree, and whoever owns a partition resumes exactly where the store left off. A
message without an ``event_id`` gets ``<topic>-<partition>-<offset>`` as its id, which
makes redelivery harmless too. The offsets are also committed to Kafka after they are
stored, for operators' tools (lag dashboards); nothing reads them back.

A rebalance waits for the batch in flight: partitions are given up only after its
transaction has committed, and a batch polled before a rebalance is dropped, not stored
(the new owner reads it again from the stored offsets). ``save_offsets`` never moves an
offset backwards, whatever the order of two owners' commits.

A batch the store or the learning path refuses is not lost either, nor is the consumer
when the database goes away: nothing past the stored offsets was stored, so it backs
off, rejoins and resumes from them once the database answers again.

A message that is not a valid event goes to the dead-letter table with its raw bytes
and the reason, its offset advances, and the loop goes on. A stored offset past the
end of the log means the topic was recreated (the embedded broker keeps its log in
memory); the consumer then starts that partition from its earliest offset.

The client is aiokafka (the embedded broker's group protocol works with it,
docs/operations.md); its event loop runs in the thread that calls ``run()``, and each
batch is stored in a worker thread of its own so that heartbeats go on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from service.ingest.validation import EventLimits, parse_batch, parse_event_json
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
#: Offsets are committed to Kafka (advisory, for operators' tools) at most this often.
_KAFKA_COMMIT_SECONDS = 1.0


class BatchNotStored(Exception):
    """The store or the learning path refused a polled batch (a database that went away,
    a full disk)."""


def default_replica() -> str:
    """This process's name in metrics and logs: ``<hostname>-<pid>``."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class ConsumerState:
    """What ``/healthz`` and ``/metrics`` show about consumption.

    ``partitions`` are the ones this replica owns now; they change on rebalances.
    """

    connected: bool = False
    partitions: list[int] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)
    lag: dict[int, int] = field(default_factory=dict)
    consumed: int = 0
    dead_letters: int = 0
    reconnects: int = 0
    rebalances: int = 0
    store_failures: int = 0


@dataclass(frozen=True)
class Decoded:
    """One poll's records turned into events, dead letters and next offsets."""

    events: list[NewEvent]
    dead: list[DeadLetter]
    next_offsets: dict[int, int]


def decode(topic: str, records: Iterable[Any], limits: EventLimits) -> Decoded:
    """Events from Kafka records; anything unusable becomes a dead letter, never an error.

    A poll's messages are decoded with orjson and checked together (``parse_batch``);
    only a poll with a message that fails that is parsed one message at a time, so
    that each bad one becomes a dead letter with its reason.
    """
    records = list(records)
    events = _decode_all(topic, records, limits)
    if events is not None:
        offsets = {record.partition: record.offset + 1 for record in records}
        return Decoded(events, [], offsets)
    return _decode_each(topic, records, limits)


def _decode_all(topic: str, records: list[Any], limits: EventLimits) -> list[NewEvent] | None:
    """The events of every record, or None if any record might not hold a valid one."""
    try:
        raws = [orjson.loads(record.value) for record in records]
    except (orjson.JSONDecodeError, TypeError):  # TypeError: a message without a value
        return None
    return parse_batch(raws, limits, lambda at: _record_id(topic, records[at]))


def _record_id(topic: str, record: Any) -> str:
    """``<topic>-<partition>-<offset>``: the id of an event that carries none, so that
    a message delivered again is a duplicate."""
    return f"{topic}-{record.partition}-{record.offset}"


def _decode_each(topic: str, records: list[Any], limits: EventLimits) -> Decoded:
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
        event = replace(event, event_id=_record_id(topic, record))
    return event, ""


class _Rebalance(ConsumerRebalanceListener):
    """Hands the group's decisions to the consumer (aiokafka awaits these)."""

    def __init__(self, consumer: EventConsumer) -> None:
        self.consumer = consumer

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.consumer._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self.consumer._on_assigned(assigned)


class EventConsumer:
    """Consumes a topic into ``target`` as a member of a consumer group until ``stop()``;
    reconnects with backoff.

    Parameters
    ----------
    target
        Where events go (stored, evaluated, learned).
    bootstrap, topic
        The broker and topic.
    group
        The consumer group; default ``target.settings.kafka_group``.
    replica
        This process's name in the lag metric and logs (``REPLICA_ID`` where set);
        default ``<hostname>-<pid>``.
    max_records
        Most records stored in one batch (one transaction).
    session_timeout_ms
        How long the group waits for a silent member before giving its partitions to
        the others; default ``target.settings.kafka_session_timeout_ms``. Heartbeats go
        every sixth of it.
    """

    def __init__(
        self,
        target: IngestTarget,
        bootstrap: str,
        topic: str = "events",
        group: str | None = None,
        replica: str | None = None,
        max_records: int = 5_000,
        session_timeout_ms: int | None = None,
    ) -> None:
        settings = target.settings
        self.target = target
        self.bootstrap = bootstrap
        self.topic = topic
        self.group = group if group is not None else settings.kafka_group
        self.replica = replica if replica is not None else default_replica()
        self.max_records = max_records
        self.session_timeout_ms = (
            session_timeout_ms
            if session_timeout_ms is not None
            else settings.kafka_session_timeout_ms
        )
        self.state = ConsumerState()
        self._stop = threading.Event()
        self._consumer: AIOKafkaConsumer | None = None
        # Stores one batch at a time, off the event loop so heartbeats go on.
        self._executor: ThreadPoolExecutor | None = None
        self._batch_lock: asyncio.Lock | None = None
        self._generation = 0  # bumped on every rebalance: a batch polled before is stale
        self._assign_error: BaseException | None = None
        self._resumed_at: dict[int, int] = {}
        self._to_commit: dict[int, int] = {}
        self._last_commit = 0.0
        self._last_heard = time.monotonic()

    def stop(self) -> None:
        """Ask ``run()`` to return; it finishes the batch in flight and leaves the group."""
        self._stop.set()

    def run(self) -> None:
        """The consume loop; blocks until ``stop()``."""
        with ThreadPoolExecutor(1, thread_name_prefix="kafka-ingest") as executor:
            self._executor = executor
            asyncio.run(self._run())

    async def _run(self) -> None:
        self._batch_lock = asyncio.Lock()
        backoff = 0.5
        while not self._stop.is_set():
            try:
                await self._connect()
                backoff = 0.5
                while not self._stop.is_set():
                    await self._poll_once()
            except KafkaError as exc:
                self.state.reconnects += 1
                log.warning(
                    "kafka broker %s unreachable (%s); reconnecting in %.1fs",
                    self.bootstrap,
                    type(exc).__name__,
                    backoff,
                )
                backoff = await self._start_over(backoff)
            except (BatchNotStored, SQLAlchemyError):
                # The database went away (or refused a batch): nothing was stored past
                # the stored offsets, so the consumer rejoins and resumes from them.
                self.state.store_failures += 1
                log.exception(
                    "the store failed; resuming from the stored offsets in %.1fs", backoff
                )
                backoff = await self._start_over(backoff)
        await self._close(leave=True)

    async def _start_over(self, backoff: float) -> float:
        """Drop the client and wait ``backoff`` seconds before the next connection;
        returns the wait after that (doubled, at most 10 s)."""
        self.state.connected = False
        await self._close(leave=False)
        await self._sleep(backoff)
        return min(backoff * 2, 10.0)

    async def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    async def _connect(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            client_id=f"driftline-{self.replica}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.max_records,
            fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
            # A JoinGroup answer may take up to the rebalance timeout (the session
            # timeout here): a shorter request timeout would abandon every join.
            request_timeout_ms=self.session_timeout_ms + 5_000,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=max(100, self.session_timeout_ms // 6),
        )
        self._consumer = consumer
        self._assign_error = None
        await consumer.start()  # raises KafkaConnectionError if the broker is away
        consumer.subscribe([self.topic], listener=_Rebalance(self))
        self._last_heard = time.monotonic()
        self.state.connected = True
        log.info(
            "consuming %s from %s in group %r as %s",
            self.topic,
            self.bootstrap,
            self.group,
            self.replica,
        )

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Give partitions up only once the batch in flight is stored."""
        assert self._batch_lock is not None
        async with self._batch_lock:
            self._generation += 1
            await self._commit_to_kafka(force=True)
            self._to_commit.clear()
            for tp in revoked:
                self._forget(tp.partition)
            self.state.partitions = []

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Seek every assigned partition to its stored offset, or its beginning if none.

        An offset past the log's end means a recreated topic; ``_poll_once`` checks it
        against the first fetch's high-water mark. The log end is not asked up front:
        the embedded broker's ListOffsets answer lags behind its log (its fetch
        high-water mark is right), so only the fetch path is trusted.
        """
        assert self._batch_lock is not None
        async with self._batch_lock:
            self._generation += 1
            self.state.rebalances += 1
            try:
                await self._seek_to_stored(assigned)
            except Exception as exc:  # aiokafka would only log it: reconnect instead
                self._assign_error = exc
                raise
            self.state.partitions = sorted(tp.partition for tp in assigned)
        log.info(
            "%s now owns %s partitions %s (group %r)",
            self.replica,
            self.topic,
            self.state.partitions,
            self.group,
        )

    async def _seek_to_stored(self, partitions: Iterable[TopicPartition]) -> None:
        assert self._consumer is not None
        stored = await self._in_executor(self._load_offsets)
        fresh: list[TopicPartition] = []
        for tp in sorted(partitions):
            offset = stored.get(tp.partition)
            if offset is None:
                fresh.append(tp)
                self.state.positions.pop(tp.partition, None)
            else:
                self._consumer.seek(tp, offset)
                self._resumed_at[tp.partition] = offset
                self.state.positions[tp.partition] = offset
        if fresh:
            await self._consumer.seek_to_beginning(*fresh)

    def _load_offsets(self) -> dict[int, int]:
        with self.target.db.connect() as conn:
            return load_offsets(conn, self.topic)

    async def _in_executor(self, call: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def _forget(self, partition: int) -> None:
        self._resumed_at.pop(partition, None)
        self.state.positions.pop(partition, None)
        self.state.lag.pop(partition, None)
        with contextlib.suppress(KeyError):  # no lag reported for it yet
            self.target.metrics.consumer_lag.remove(str(partition), self.replica)

    async def _poll_once(self) -> None:
        consumer, lock = self._consumer, self._batch_lock
        assert consumer is not None and lock is not None
        if self._assign_error is not None:
            raise KafkaError(f"could not resume the assigned partitions: {self._assign_error}")
        generation = self._generation
        polled = await consumer.getmany(timeout_ms=500, max_records=self.max_records)
        records = [record for batch in polled.values() for record in batch]
        async with lock:
            if self._generation != generation:
                # A rebalance came while polling: whoever owns these partitions now
                # resumes them from the store (aiokafka has moved past these records).
                still_owned = set(polled) & consumer.assignment()
                if still_owned:
                    await self._seek_to_stored(still_owned)
                records = []
            if self._resumed_at:
                await self._notice_recreated_topic()
            if records:
                await self._store(records)
                self._last_heard = time.monotonic()
        if not records and time.monotonic() - self._last_heard > _QUIET_PROBE_SECONDS:
            await self._probe_broker()
        await self._commit_to_kafka()
        await self._refresh_lag()

    async def _probe_broker(self) -> None:
        """Ask the broker something; raises ``KafkaError`` if it does not answer.

        An idle poll looks the same whether the topic is quiet or the broker is gone,
        so after a quiet spell one cheap request (the cluster's metadata) tells them apart.
        """
        assert self._consumer is not None
        await self._consumer.topics()
        self._last_heard = time.monotonic()

    async def _notice_recreated_topic(self) -> None:
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
                self.state.positions.pop(partition, None)
                await self._consumer.seek_to_beginning(tp)

    async def _store(self, records: list[Any]) -> None:
        settings = self.target.settings
        decoded = decode(self.topic, records, settings.event_limits)

        def write_offsets(conn: Any) -> None:
            add_dead_letters(conn, decoded.dead)
            save_offsets(conn, self.topic, decoded.next_offsets)

        try:
            await self._in_executor(lambda: self.target.ingest(decoded.events, write_offsets))
        except Exception as exc:
            raise BatchNotStored(f"{len(records)} message(s) refused: {exc!r}") from exc
        self.state.consumed += len(records)
        self.state.positions.update(decoded.next_offsets)
        self._to_commit.update(decoded.next_offsets)
        if decoded.dead:
            self.state.dead_letters += len(decoded.dead)
            self.target.metrics.dead_letters.inc(len(decoded.dead))
            log.warning("%d malformed message(s) sent to dead letters", len(decoded.dead))

    async def _commit_to_kafka(self, force: bool = False) -> None:
        """Commit the stored offsets to Kafka too: advisory, for operators' tools.

        Nothing reads them back (every assignment seeks to the store's offsets), so a
        commit that fails, or a rebalance that makes it fail, costs nothing.
        """
        if not self._to_commit or self._consumer is None:
            return
        if not force and time.monotonic() - self._last_commit < _KAFKA_COMMIT_SECONDS:
            return
        owned = set(self.state.partitions)
        offsets = {
            TopicPartition(self.topic, p): o for p, o in self._to_commit.items() if p in owned
        }
        self._to_commit.clear()
        self._last_commit = time.monotonic()
        if not offsets:
            return
        try:
            await asyncio.wait_for(self._consumer.commit(offsets), timeout=2.0)
        except (KafkaError, TimeoutError) as exc:
            log.debug("advisory offset commit to kafka failed: %r", exc)

    async def _refresh_lag(self) -> None:
        """Per-partition lag (high-water mark − position) from the latest fetches."""
        assert self._consumer is not None
        for tp in self._consumer.assignment():
            high = self._consumer.highwater(tp)
            if high is None:
                continue
            try:  # known after a fetch; not waited for while a seek is pending
                position = await asyncio.wait_for(self._consumer.position(tp), timeout=0.05)
            except (KafkaError, TimeoutError):
                continue
            self.state.positions[tp.partition] = position
            self.state.lag[tp.partition] = max(0, high - position)
            self.target.metrics.consumer_lag.labels(
                partition=str(tp.partition), replica=self.replica
            ).set(self.state.lag[tp.partition])

    async def _close(self, leave: bool) -> None:
        """Stop the client; ``leave``: commit to Kafka first (the group rebalances now
        either way, as aiokafka's stop leaves the group)."""
        consumer, self._consumer = self._consumer, None
        self.state.connected = False
        if consumer is None:
            return
        if leave:
            self._consumer = consumer
            await self._commit_to_kafka(force=True)
            self._consumer = None
        try:
            await asyncio.wait_for(consumer.stop(), timeout=10.0)
        # Closing a broken connection must not mask the real error; aiokafka's stop
        # may raise the CancelledError of its fetch task, which nobody here cancelled.
        except (Exception, asyncio.CancelledError):
            log.debug("error closing the kafka consumer", exc_info=True)
        for partition in list(self.state.partitions):
            self._forget(partition)
        self.state.partitions = []
