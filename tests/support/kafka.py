"""Helpers for tests against a real Kafka-protocol broker."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

from kafka import KafkaProducer


def produce(
    bootstrap: str, topic: str, values: Iterable[bytes | dict], key: bytes | None = b"k"
) -> int:
    """Send each value (a dict is JSON-encoded) and wait for the broker's acks.

    With ``key=None`` each message is keyed by its position, spreading partitions.
    """
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    sent = 0
    try:
        for value in values:
            raw = json.dumps(value).encode() if isinstance(value, dict) else value
            producer.send(topic, key=key if key is not None else str(sent).encode(), value=raw)
            sent += 1
        producer.flush(timeout=60)
    finally:
        producer.close()
    return sent


def events(start: int, stop: int, prefix: str = "k") -> list[dict]:
    return [
        {
            "event_id": f"{prefix}-{i}",
            "user_id": f"u{i % 37}",
            "item_id": f"i{i % 53}",
            "rating": float(1 + i % 5),
        }
        for i in range(start, stop)
    ]


def produce_slowly(bootstrap: str, topic: str, values: list[dict], batch: int, pause: float) -> int:
    """``produce`` in batches of ``batch`` (keyed by position) with ``pause`` seconds
    between them: a stream that lasts while consumers join and leave."""
    sent = 0
    for start in range(0, len(values), batch):
        if start:
            time.sleep(pause)
        sent += produce(bootstrap, topic, values[start : start + batch], key=None)
    return sent
