"""Batches that queue while one is stored go together (``service.stream.coalescing``),
on a real pipeline and store: each caller's answer is its own, nothing is stored twice,
and one caller's bad batch is no other caller's failure."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError

from service.store.events import IngestOutcome, NewEvent, count_events, max_event_id
from service.stream.writer import StoreFailed
from service.wiring import Driftline
from tests.support.pipelines import pipeline_factory, small_settings


@pytest.fixture
def make(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Driftline]]:
    def settings(**overrides: Any) -> Any:
        return small_settings(tmp_path / "data", database_url, **overrides)

    with pipeline_factory(settings) as make:
        yield make


def _batch(name: str, n: int, repeat_of: str | None = None) -> list[NewEvent]:
    """``n`` rated events with ids ``name-k``; ``repeat_of`` repeats that batch's first
    two ids (a retry of a request still in flight) and one id-less event ends it."""
    events = [
        NewEvent(f"u{k % 7}", f"i{k % 11}", rating=1.0 + k % 5, event_id=f"{name}-{k}")
        for k in range(n)
    ]
    if repeat_of is not None:
        events[:2] = [
            NewEvent("other", "other", rating=5.0, event_id=f"{repeat_of}-{k}") for k in range(2)
        ]
    events.append(NewEvent("u0", "i0", rating=3.0))
    return events


def _queued(pipeline: Driftline, waiting: int) -> None:
    """Wait until ``waiting`` requests are queued behind one that has taken its turn."""
    coalescing = pipeline.coalescing
    assert coalescing is not None
    deadline = time.monotonic() + 30
    while len(coalescing._queue) != waiting or not coalescing._turn.locked():
        assert time.monotonic() < deadline, "the requests did not queue"
        time.sleep(0.01)


def _ingest_while_held(
    pipeline: Driftline, batches: list[list[NewEvent]]
) -> list[IngestOutcome | BaseException]:
    """Call ``pipeline.coalescing`` with each batch from a thread of its own while the
    learner is busy, so that all but the first queue; the answers in batch order."""
    coalescing = pipeline.coalescing
    assert coalescing is not None
    answers: list[IngestOutcome | BaseException | None] = [None] * len(batches)

    def call(k: int) -> None:
        try:
            answers[k] = coalescing(batches[k])
        except BaseException as exc:  # the caller's own error, checked by the test
            answers[k] = exc

    threads = [threading.Thread(target=call, args=(k,)) for k in range(len(batches))]
    with pipeline.learner.lock:
        threads[0].start()
        _queued(pipeline, 0)  # the first has taken its turn and waits for the learner
        for waiting, thread in enumerate(threads[1:], start=1):
            thread.start()
            _queued(pipeline, waiting)  # queued in batch order
    for thread in threads:
        thread.join(timeout=60)
    assert all(answer is not None for answer in answers)
    return answers  # type: ignore[return-value]


def _stored_ids(pipeline: Driftline) -> list[str]:
    with pipeline.db.connect() as conn:
        return list(conn.scalars(text("SELECT event_id FROM events ORDER BY id")))


def _ids_between(pipeline: Driftline, after: int, up_to: int) -> list[str]:
    """The event ids stored in ``(after, up_to]``, in id order (generated ids, of the
    id-less events, hold no dash)."""
    with pipeline.db.connect() as conn:
        rows = conn.scalars(
            text("SELECT event_id FROM events WHERE id > :a AND id <= :b ORDER BY id"),
            {"a": after, "b": up_to},
        )
        return list(rows)


def test_queued_batches_are_stored_together_each_answered_as_if_alone(
    make: Callable[..., Driftline],
) -> None:
    pipeline = make()
    batches = [_batch("a", 40), _batch("b", 30), _batch("c", 20, repeat_of="a"), _batch("d", 10)]
    answers = _ingest_while_held(pipeline, batches)
    coalescing = pipeline.coalescing
    assert coalescing is not None
    assert (coalescing.groups, coalescing.batches) == (2, 4)  # the first alone, then three
    groups = pipeline.metrics.ingest_group_batches.collect()[0].samples
    counted = {s.name: s.value for s in groups if s.name.endswith(("_count", "_sum"))}
    assert counted == {
        "driftline_ingest_group_batches_count": 2.0,
        "driftline_ingest_group_batches_sum": 4.0,
    }
    outcomes = [answer for answer in answers if isinstance(answer, IngestOutcome)]
    assert len(outcomes) == 4
    # Each answer holds its own events, those it repeated counted as duplicates.
    for batch, outcome in zip(batches, outcomes, strict=True):
        assert all(any(event is mine for mine in batch) for event in outcome.stored)
    assert [o.accepted for o in outcomes] == [41, 31, 19, 11]
    assert [o.duplicates for o in outcomes] == [0, 0, 2, 0]
    # Stored once each, in the order the batches were queued, positions in that order.
    ids = _stored_ids(pipeline)
    assert len(ids) == len(set(ids)) == 102
    expected = [e.event_id for o in outcomes for e in o.stored if e.event_id is not None]
    assert [i for i in ids if i in set(expected)] == expected
    for outcome in outcomes:  # each bounds exactly its own rows
        between = _ids_between(pipeline, outcome.log_before, outcome.position)
        assert len(between) == outcome.accepted
        named = [e.event_id for e in outcome.stored if e.event_id is not None]
        assert [i for i in between if "-" in i] == named
    assert all(a.position == b.log_before for a, b in zip(outcomes, outcomes[1:], strict=False))
    with pipeline.db.connect() as conn:
        assert outcomes[-1].position == max_event_id(conn)
    # Everything stored was learnt, once.
    assert pipeline.learner.applied == outcomes[-1].position
    assert pipeline.learner.labelled_seen == 102


def test_a_bad_batch_in_a_group_fails_alone_and_the_others_are_stored(
    make: Callable[..., Driftline],
) -> None:
    pipeline = make()
    bad = [*_batch("bad", 5), NewEvent(None, "i", rating=1.0, event_id="null-user")]  # type: ignore[arg-type]
    batches = [_batch("a", 10), _batch("b", 10), bad, _batch("c", 10)]
    answers = _ingest_while_held(pipeline, batches)
    assert isinstance(answers[2], IntegrityError)  # the caller's own error, unwrapped
    assert [a.accepted for a in answers if isinstance(a, IngestOutcome)] == [11, 11, 11]
    ids = _stored_ids(pipeline)
    assert not any(i.startswith("bad-") for i in ids)
    with pipeline.db.connect() as conn:
        assert count_events(conn) == 33
    assert pipeline.learner.labelled_seen == 33


def test_a_batch_larger_than_the_limit_goes_alone(make: Callable[..., Driftline]) -> None:
    pipeline = make(ingest_coalesce_events=25)
    batches = [_batch("a", 5), _batch("b", 30), _batch("c", 5), _batch("d", 5)]
    answers = _ingest_while_held(pipeline, batches)
    assert all(isinstance(a, IngestOutcome) for a in answers)
    coalescing = pipeline.coalescing
    assert coalescing is not None
    # a alone (first); b alone (over the limit); c and d together.
    assert (coalescing.groups, coalescing.batches) == (3, 4)
    assert len(_stored_ids(pipeline)) == 49


def test_with_coalescing_off_every_batch_goes_alone(make: Callable[..., Driftline]) -> None:
    pipeline = make(ingest_coalesce_events=0)
    answers = _ingest_while_held(pipeline, [_batch("a", 5), _batch("b", 5), _batch("c", 5)])
    assert all(isinstance(a, IngestOutcome) for a in answers)
    coalescing = pipeline.coalescing
    assert coalescing is not None
    assert (coalescing.groups, coalescing.batches) == (3, 3)


def test_many_concurrent_callers_store_every_event_exactly_once(
    make: Callable[..., Driftline],
) -> None:
    """Sixteen threads, eight batches each, overlapping ids between neighbours."""
    pipeline = make()
    coalescing = pipeline.coalescing
    assert coalescing is not None
    answers: list[IngestOutcome] = []
    lock = threading.Lock()

    def caller(t: int) -> None:
        for b in range(8):
            events = [
                NewEvent(f"u{t}", f"i{k}", rating=3.0, event_id=f"{(t + k % 2) % 16}-{b}-{k // 2}")
                for k in range(25)
            ]
            outcome = coalescing(events)
            with lock:
                answers.append(outcome)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    ids = _stored_ids(pipeline)
    assert len(ids) == len(set(ids))
    assert sum(a.accepted for a in answers) == len(ids)
    assert sum(a.accepted + a.duplicates for a in answers) == 16 * 8 * 25
    assert pipeline.learner.labelled_seen == len(ids)
    assert coalescing.batches == 128 and coalescing.groups <= 128


def test_an_outage_fails_every_caller_of_the_group_without_storing_again(
    make: Callable[..., Driftline], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit lost with its connection may have landed: the group is not retried
    batch by batch (its id-less events could be stored twice); each caller gets the
    outage, as it would alone, and may retry."""
    pipeline = make()
    lost = OperationalError("INSERT INTO events", None, ConnectionRefusedError("refused"))
    calls: list[int] = []

    def store_all(batches: Any, *_writes: Any) -> Any:
        calls.append(len(batches))
        raise StoreFailed("not stored") from lost

    monkeypatch.setattr(pipeline.writer, "store_all", store_all)
    answers = _ingest_while_held(pipeline, [_batch("a", 5), _batch("b", 5), _batch("c", 5)])
    assert all(answer is lost for answer in answers)
    assert calls == [1, 2]  # the first alone, then the other two once, together
