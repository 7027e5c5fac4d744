"""The dashboard's event buffer: ids for resuming, bounded memory, safe across threads."""

from __future__ import annotations

import threading

import pytest

from service.livefeed import EventBuffer


def test_a_reader_resumes_after_the_last_event_id_it_saw() -> None:
    buffer = EventBuffer(capacity=10)
    first = buffer.publish("heartbeat", {"rmse": 0.9})
    buffer.publish("alert", {"id": 1})
    buffer.publish("swap", {"version": "v2"})
    assert [e.kind for e in buffer.since(first.id)] == ["alert", "swap"]
    assert not buffer.missed(first.id)


def test_the_oldest_events_fall_off_and_a_late_reader_is_told() -> None:
    buffer = EventBuffer(capacity=3)
    for n in range(5):
        buffer.publish("heartbeat", {"n": n})
    assert [e.data["n"] for e in buffer.since(0)] == [2, 3, 4]
    assert buffer.missed(1) and not buffer.missed(2)


def test_publishing_from_threads_gives_unique_increasing_ids() -> None:
    buffer = EventBuffer(capacity=4000)
    threads = [
        threading.Thread(target=lambda: [buffer.publish("heartbeat", {}) for _ in range(500)])
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [e.id for e in buffer.since(0)] == list(range(1, 2001))


def test_a_buffer_needs_room_for_one_event() -> None:
    with pytest.raises(ValueError, match="capacity"):
        EventBuffer(capacity=0)
