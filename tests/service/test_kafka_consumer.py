"""The Kafka consumer against a real broker: a consumer group, exactly-once into the store,
dead letters; and stored offsets that never move backwards."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from sqlalchemy import Connection, select
from sqlalchemy.exc import OperationalError

from benchmarks.broker import EmbeddedBroker
from benchmarks.launcher import free_port
from service.ingest.kafka import EventConsumer
from service.settings import Settings
from service.store import Database
from service.store.events import IngestOutcome, NewEvent, count_events
from service.store.offsets import count_dead_letters, list_dead_letters, load_offsets, save_offsets
from service.store.tables import events as events_table
from service.wiring import Driftline, build_driftline
from tests.support.kafka import events, produce, produce_slowly

MALFORMED = [
    b"{not json",
    b"\xff\xfe",
    b'{"user_id": "u", "item_id": "i", "rating": 99}',
    b'{"item_id": "i"}',
    b"[1, 2, 3]",
    b'{"user_id": "u", "item_id": "i", "colour": "red"}',
]

#: Short group timeouts keep the tests quick; the defaults suit production.
SESSION_TIMEOUT_MS = 6_000


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=free_port(), partitions=3, log_path=tmp_path / "broker.log") as b:
        yield b


@pytest.fixture
def broker4(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=free_port(), partitions=4, log_path=tmp_path / "broker.log") as b:
        yield b


def _pipeline(tmp_path: Path) -> Driftline:
    return build_driftline(
        Settings(
            data_dir=tmp_path / "data",
            retrain_enabled=False,
            kafka_session_timeout_ms=SESSION_TIMEOUT_MS,
        )
    )


def _start(consumer: EventConsumer) -> threading.Thread:
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    return thread


def _wait_for(done: Callable[[], bool], timeout: float = 60.0, what: str = "catch up") -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting to {what}"
        time.sleep(0.1)


def _stop(*running: tuple[EventConsumer, threading.Thread]) -> None:
    for consumer, _ in running:
        consumer.stop()
    for _, thread in running:
        thread.join(timeout=30)
        assert not thread.is_alive(), "run() did not return after stop()"


def _consume_until(
    consumer: EventConsumer, done: Callable[[], bool], timeout: float = 60.0
) -> None:
    thread = _start(consumer)
    try:
        _wait_for(done, timeout)
    finally:
        _stop((consumer, thread))


def _stored(pipeline: Driftline) -> int:
    with pipeline.db.connect() as conn:
        return count_events(conn)


def _event_ids(pipeline: Driftline) -> list[str]:
    with pipeline.db.connect() as conn:
        return list(conn.scalars(select(events_table.c.event_id)))


def _log_ends(bootstrap: str, topic: str) -> dict[int, int]:
    """partition → last offset + 1, read from the log itself."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends: dict[int, int] = {}
        for _ in range(10):
            for tp, records in consumer.poll(timeout_ms=300).items():
                ends[tp.partition] = records[-1].offset + 1
        return ends
    finally:
        consumer.close()


def test_stored_offsets_never_move_backwards(database_url: str) -> None:
    db = Database(database_url)
    try:
        with db.begin() as conn:
            save_offsets(conn, "events", {0: 100, 1: 50})
        with db.begin() as conn:  # a late batch of the partition's previous owner
            save_offsets(conn, "events", {0: 80, 1: 60, 2: 5})
        with db.connect() as conn:
            assert load_offsets(conn, "events") == {0: 100, 1: 60, 2: 5}
    finally:
        db.dispose()


@pytest.mark.slow
def test_every_message_is_stored_once_and_bad_ones_become_dead_letters(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    good = events(0, 1_500)
    produce(broker.bootstrap, "events", good[:700] + MALFORMED + good[700:])
    pipeline = _pipeline(tmp_path)
    consumer = EventConsumer(pipeline, broker.bootstrap, "events")
    _consume_until(consumer, lambda: consumer.state.consumed == len(good) + len(MALFORMED))

    assert _stored(pipeline) == len(good)
    with pipeline.db.connect() as conn:
        assert count_dead_letters(conn) == len(MALFORMED)
        letters = list_dead_letters(conn)
        assert load_offsets(conn, "events") == _log_ends(broker.bootstrap, "events")
    assert {bytes(d["value"]) for d in letters} == set(MALFORMED)
    assert all(d["error"] for d in letters)
    assert "driftline_dead_letters_total 6.0" in pipeline.metrics.render().decode()

    # A restarted consumer resumes from the stored offsets: nothing is read twice.
    again_pipeline = _pipeline(tmp_path)
    again = EventConsumer(again_pipeline, broker.bootstrap, "events", replica="again")
    produce(broker.bootstrap, "events", events(1_500, 1_600))
    _consume_until(
        again,
        lambda: (
            again.state.consumed == 100
            and len(again.state.lag) == 3
            and set(again.state.lag.values()) == {0}
        ),
    )
    assert _stored(pipeline) == 1_600
    metrics = again_pipeline.metrics.render().decode()
    assert 'driftline_consumer_lag{partition="0",replica="again"} 0.0' not in metrics  # left


@pytest.mark.slow
def test_messages_without_ids_get_their_offset_as_id(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    anonymous = [{k: v for k, v in e.items() if k != "event_id"} for e in events(0, 50)]
    produce(broker.bootstrap, "events", anonymous, key=b"same-partition")
    pipeline = _pipeline(tmp_path)
    consumer = EventConsumer(pipeline, broker.bootstrap, "events")
    _consume_until(consumer, lambda: consumer.state.consumed == 50)
    assert _stored(pipeline) == 50
    assert all(i.startswith("events-") for i in _event_ids(pipeline))


@pytest.mark.slow
def test_two_consumers_in_a_group_split_the_partitions_and_store_each_event_once(
    broker4: EmbeddedBroker, tmp_path: Path
) -> None:
    total = 2_000
    produce(broker4.bootstrap, "events", events(0, total), key=None)
    pipeline = _pipeline(tmp_path)
    first = EventConsumer(pipeline, broker4.bootstrap, "events", replica="first")
    second = EventConsumer(pipeline, broker4.bootstrap, "events", replica="second")
    running = [(first, _start(first)), (second, _start(second))]
    try:
        _wait_for(
            lambda: (
                _stored(pipeline) == total
                and len(first.state.partitions) == len(second.state.partitions) == 2
            )
        )
        owned = (set(first.state.partitions), set(second.state.partitions))
        lags = pipeline.metrics.render().decode()
    finally:
        _stop(*running)
    assert owned[0] | owned[1] == {0, 1, 2, 3} and not owned[0] & owned[1]
    # Every message was stored by exactly one of them, once.
    assert first.state.consumed + second.state.consumed == total
    assert sorted(_event_ids(pipeline)) == sorted(e["event_id"] for e in events(0, total))
    with pipeline.db.connect() as conn:
        assert sum(load_offsets(conn, "events").values()) == total
    for replica, partitions in zip(("first", "second"), owned, strict=True):
        for p in partitions:
            assert f'driftline_consumer_lag{{partition="{p}",replica="{replica}"}}' in lags


@pytest.mark.slow
def test_a_consumer_joining_mid_stream_takes_partitions_without_loss_or_duplicates(
    broker4: EmbeddedBroker, tmp_path: Path
) -> None:
    total = 12_000
    producer = threading.Thread(
        target=produce_slowly, args=(broker4.bootstrap, "events", events(0, total), 500, 0.25)
    )
    producer.start()
    pipeline = _pipeline(tmp_path)
    first = EventConsumer(pipeline, broker4.bootstrap, "events", replica="first")
    running = [(first, _start(first))]
    try:
        _wait_for(lambda: _stored(pipeline) >= 2_000, what="store the first events")
        assert first.state.partitions == [0, 1, 2, 3]
        second = EventConsumer(pipeline, broker4.bootstrap, "events", replica="second")
        running.append((second, _start(second)))
        _wait_for(lambda: len(second.state.partitions) == 2, what="rebalance")
        assert _stored(pipeline) < total, "the stream ended before the rebalance"
        producer.join()
        _wait_for(lambda: _stored(pipeline) == total)
        owned = (set(first.state.partitions), set(second.state.partitions))
    finally:
        producer.join()
        _stop(*running)
    assert owned[0] | owned[1] == {0, 1, 2, 3} and not owned[0] & owned[1]
    assert second.state.consumed > 0
    assert first.state.consumed + second.state.consumed == total
    assert sorted(_event_ids(pipeline)) == sorted(e["event_id"] for e in events(0, total))
    with pipeline.db.connect() as conn:
        assert sum(load_offsets(conn, "events").values()) == total


@pytest.mark.slow
def test_a_recreated_topic_is_read_from_the_start(tmp_path: Path) -> None:
    port = free_port()
    pipeline = _pipeline(tmp_path)
    with EmbeddedBroker(port=port, partitions=1) as first_life:
        produce(first_life.bootstrap, "events", events(0, 200))
        consumer = EventConsumer(pipeline, first_life.bootstrap, "events")
        _consume_until(consumer, lambda: consumer.state.consumed == 200)
    with EmbeddedBroker(port=port, partitions=1) as second_life:  # empty log, same name
        produce(second_life.bootstrap, "events", events(200, 250))
        consumer = EventConsumer(pipeline, second_life.bootstrap, "events")
        _consume_until(consumer, lambda: consumer.state.consumed == 50)
    assert _stored(pipeline) == 250


class _FailingOnce:
    """The pipeline as an ingest target, except that its ``fail_at``-th batch raises."""

    def __init__(self, pipeline: Driftline, fail_at: int) -> None:
        self.pipeline = pipeline
        self.settings, self.db, self.metrics = pipeline.settings, pipeline.db, pipeline.metrics
        self.fail_at = fail_at
        self.calls = 0

    def ingest(
        self, batch: list[NewEvent], also_write: Callable[[Connection], None] | None = None
    ) -> IngestOutcome:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("the store refused the batch")
        return self.pipeline.ingest(batch, also_write)


@pytest.mark.slow
def test_a_batch_the_store_refuses_is_read_again_and_stored_once(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    # Small polls: batches before the refused one are stored, and so are the ones after.
    total = 2_000
    produce(broker.bootstrap, "events", events(0, total))
    pipeline = _pipeline(tmp_path)
    target = _FailingOnce(pipeline, fail_at=3)
    consumer = EventConsumer(target, broker.bootstrap, "events", max_records=200)
    _consume_until(consumer, lambda: _stored(pipeline) == total)

    assert target.calls > 3 and consumer.state.store_failures == 1
    assert sorted(_event_ids(pipeline)) == sorted(e["event_id"] for e in events(0, total))
    with pipeline.db.connect() as conn:
        assert load_offsets(conn, "events") == _log_ends(broker.bootstrap, "events")


@pytest.mark.slow
def test_the_consumer_outlives_a_database_that_goes_away(
    broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where the database is asked outside a batch's transaction (the stored offsets, on
    # a rebalance that came while polling), its error reaches the poll loop as it is.
    total = 1_000
    produce(broker.bootstrap, "events", events(0, total))
    pipeline = _pipeline(tmp_path)
    consumer = EventConsumer(pipeline, broker.bootstrap, "events", max_records=200)
    poll_once, polls = consumer._poll_once, [0]

    async def poll_or_lose_the_database() -> None:
        polls[0] += 1
        if polls[0] == 2:
            raise OperationalError("SELECT", {}, ConnectionRefusedError("database restarting"))
        await poll_once()

    monkeypatch.setattr(consumer, "_poll_once", poll_or_lose_the_database)
    _consume_until(consumer, lambda: _stored(pipeline) == total)
    assert consumer.state.store_failures == 1
    assert sorted(_event_ids(pipeline)) == sorted(e["event_id"] for e in events(0, total))
