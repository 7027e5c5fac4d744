"""The Kafka consumer against a real broker: exactly-once into the store, dead letters."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from benchmarks.broker import EmbeddedBroker
from benchmarks.launcher import free_port
from service.ingest.kafka import EventConsumer
from service.settings import Settings
from service.store.events import count_events
from service.store.offsets import count_dead_letters, list_dead_letters, load_offsets
from service.wiring import Driftline, build_driftline
from tests.support.kafka import events, produce

pytestmark = pytest.mark.slow

MALFORMED = [
    b"{not json",
    b"\xff\xfe",
    b'{"user_id": "u", "item_id": "i", "rating": 99}',
    b'{"item_id": "i"}',
    b"[1, 2, 3]",
    b'{"user_id": "u", "item_id": "i", "colour": "red"}',
]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=free_port(), partitions=3, log_path=tmp_path / "broker.log") as b:
        yield b


def _pipeline(tmp_path: Path) -> Driftline:
    return build_driftline(Settings(data_dir=tmp_path / "data", retrain_enabled=False))


def _consume_until(consumer: EventConsumer, done, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    try:
        while not done():
            assert time.monotonic() < deadline, "consumer did not catch up in time"
            time.sleep(0.1)
    finally:
        consumer.stop()
        thread.join(timeout=30)


def _stored(pipeline: Driftline) -> int:
    with pipeline.db.connect() as conn:
        return count_events(conn)


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
    again = EventConsumer(_pipeline(tmp_path), broker.bootstrap, "events")
    produce(broker.bootstrap, "events", events(1_500, 1_600))
    _consume_until(again, lambda: again.state.consumed == 100)
    assert _stored(pipeline) == 1_600
    assert again.state.lag and set(again.state.lag.values()) == {0}


def test_messages_without_ids_get_their_offset_as_id(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    anonymous = [{k: v for k, v in e.items() if k != "event_id"} for e in events(0, 50)]
    produce(broker.bootstrap, "events", anonymous, key=b"same-partition")
    pipeline = _pipeline(tmp_path)
    consumer = EventConsumer(pipeline, broker.bootstrap, "events")
    _consume_until(consumer, lambda: consumer.state.consumed == 50)
    assert _stored(pipeline) == 50


def test_replicas_split_the_partitions(broker: EmbeddedBroker, tmp_path: Path) -> None:
    produce(broker.bootstrap, "events", events(0, 300), key=None)
    pipeline = _pipeline(tmp_path)
    first = EventConsumer(pipeline, broker.bootstrap, "events", replica=0, replicas=2)
    second = EventConsumer(pipeline, broker.bootstrap, "events", replica=1, replicas=2)
    threads = [threading.Thread(target=c.run, daemon=True) for c in (first, second)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while _stored(pipeline) < 300 and time.monotonic() < deadline:
        time.sleep(0.1)
    for consumer, thread in zip((first, second), threads, strict=True):
        consumer.stop()
        thread.join(timeout=30)
    assert set(first.state.partitions) == {0, 2} and second.state.partitions == [1]
    assert first.state.consumed > 0 and second.state.consumed > 0
    assert first.state.consumed + second.state.consumed == _stored(pipeline) == 300


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
