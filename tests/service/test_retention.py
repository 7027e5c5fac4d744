"""Event retention: old events move to Parquet partitions in the object store, and every
reader of the log gets the same events from the archive as it got from the table.

Storage tests run on SQLite and, when ``DRIFTLINE_TEST_DATABASE_URL`` names one, on
PostgreSQL (``tests/conftest.py``); one runs on S3 (moto's server).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError
from sqlalchemy import delete, func, insert, select, update

from functions.objectstore import FileObjectStore, ObjectStore, open_object_store
from functions.s3 import S3ObjectStore
from retrain.window import ChangeWindowPolicy, WindowPolicy
from service.retraining import StoreWindowSource
from service.settings import Settings, parse_retention
from service.store import Database, archives
from service.store.archive_sample import SAMPLE_PREFIX, sample_key
from service.store.eventlog import EventLog
from service.store.events import (
    LabelledEvents,
    LogBatch,
    NewEvent,
    count_events,
    labelled_events,
    labelled_id_from_end,
    log_after,
    max_event_id,
    store_events,
    uniform_labelled,
)
from service.store.leases import Claimant, claim_lease
from service.store.partitions import ARCHIVE_PREFIX, ArchiveError, PartitionReader
from service.store.retention import BATCH_ROWS, Archiver, RetentionOptions
from service.store.tables import event_archives, events, online_snapshots
from service.store.versions import add_version
from service.wiring import Driftline
from tests.functions.test_s3 import fake_aws, fresh_bucket_name, moto_s3_server
from tests.support.pipelines import pipeline_factory, replica_factory, small_settings

USERS = [f"u{n}" for n in range(30)]
ITEMS = [f"i{n}" for n in range(50)]


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    yield database
    database.dispose()


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    return FileObjectStore(tmp_path / "objects")


def _events(n: int, seed: int, prefix: str) -> list[NewEvent]:
    rng = np.random.default_rng(seed)
    return [
        NewEvent(
            USERS[rng.integers(len(USERS))],
            ITEMS[rng.integers(len(ITEMS))],
            float(rng.integers(1, 11)) / 2 if rng.random() < 0.85 else None,
            float(1_700_000_000 + j) if rng.random() < 0.7 else None,
            event_id=f"{prefix}-{j}",
        )
        for j in range(n)
    ]


def _store(db: Database, stream: list[NewEvent], seed: int = 0) -> None:
    """Store ``stream`` in batches of 1 to 40 events, each its own transaction."""
    rng = np.random.default_rng(seed)
    start = 0
    while start < len(stream):
        size = int(rng.integers(1, 41))
        with db.begin() as conn:
            store_events(conn, stream[start : start + size])
        start += size


def _published(db: Database) -> None:
    """A version in the registry: without one nothing is archived."""
    with db.begin() as conn:
        add_version(
            conn,
            version="v0001",
            artifact_key="models/v0001/x.npz",
            checksum="0" * 64,
            last_event_id=1,
            n_users=1,
            n_items=1,
        )


def _archiver(
    db: Database,
    store: ObjectStore,
    policy: str,
    clock: Callable[[], float] = time.time,
    **options: Any,
) -> Archiver:
    values: dict[str, Any] = {"dedup_horizon_s": 0.0, "partition_rows": 70, "batch_rows": 25}
    options = {**values, "pause_s": 0, **options}
    return Archiver(db, store, RetentionOptions(parse_retention(policy), **options), clock=clock)


def _columns(found: LabelledEvents) -> tuple[list, ...]:
    return found.ids.tolist(), found.user_ids, found.item_ids, found.ratings.tolist()


def _walk(read: Callable[..., list[LogBatch]], up_to: int | None, limit: int) -> list[Any]:
    """The whole log as ``read`` pages it, batch by batch."""
    applied, seen = 0, []
    while batches := read(applied, up_to, limit):
        for batch in batches:
            seen.append((batch.ids, batch.events))
            applied = batch.position
    return seen


def _reads(db: Database, log: EventLog | None) -> dict[str, Any]:
    """What every reader of the log gets: straight from the table (``log`` None) or
    through the archive."""
    with db.connect() as conn:
        head = max_event_id(conn)
        ranges = [(0, None), (0, head // 3), (head // 4, head // 2), (head // 2, None)]
        draws = [(head, 40, 3), (head // 2, 25, 4), (head, 10_000, 5)]
        if log is None:
            labelled = [labelled_events(conn, a, b) for a, b in ranges]
            uniform = [uniform_labelled(conn, u, n, s) for u, n, s in draws]
            pages = [_walk(lambda a, u, n: log_after(conn, a, u, n), u, n) for u, n in _pages(head)]
        else:
            labelled = [log.labelled(conn, a, b) for a, b in ranges]
            uniform = [log.uniform_sample(conn, u, n, s) for u, n, s in draws]
            pages = [
                _walk(lambda a, u, n: log.log_after(conn, a, u, n), u, n) for u, n in _pages(head)
            ]
        return {
            "labelled": [_columns(found) for found in labelled],
            "uniform": [_columns(found) for found in uniform],
            "pages": pages,
            "counts": [
                count_events(conn),
                count_events(conn, labelled_only=True),
                count_events(conn, labelled_only=True, up_to_id=head),
            ],
        }


def _pages(head: int) -> list[tuple[int | None, int]]:
    return [(None, 64), (head // 2, 17), (None, 5_000)]


def _table_ids(db: Database) -> list[int]:
    with db.connect() as conn:
        return list(conn.scalars(select(events.c.id).order_by(events.c.id)))


def _recorded(db: Database) -> list[archives.Partition]:
    with db.connect() as conn:
        return archives.partitions(conn)


# -- the policy ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "seconds", "count"),
    [
        ("30d", 30 * 86_400, None),
        ("12h", 43_200, None),
        (" 90m ", 5_400, None),
        ("1.5h", 5_400, None),
        ("3600s", 3_600, None),
        ("2w", 1_209_600, None),
        ("5000000 events", None, 5_000_000),
        ("5_000_000 events", None, 5_000_000),
        ("1 event", None, 1),
    ],
)
def test_retention_is_a_duration_or_a_count(text: str, seconds: float, count: int) -> None:
    policy = parse_retention(text)
    assert (policy.seconds, policy.events) == (seconds, count)
    assert Settings(event_retention=text).retention_policy == policy


@pytest.mark.parametrize("text", ["30 days", "0d", "0 events", "-3h", "h", "10", "5M events", ""])
def test_a_bad_retention_is_refused_with_what_would_do(text: str) -> None:
    with pytest.raises(ValueError, match="event_retention"):
        parse_retention(text)
    with pytest.raises(ValidationError, match="event_retention"):
        Settings(event_retention=text)


def test_retention_is_off_unless_asked_for() -> None:
    assert Settings().retention_policy is None


# -- archiving ----------------------------------------------------------------------------
@pytest.mark.parametrize("partition_rows", [70, 1_000])
def test_archived_events_read_back_exactly_as_the_table_gave_them(
    db: Database, store: ObjectStore, partition_rows: int
) -> None:
    _store(db, _events(900, 1, "e"))
    _published(db)
    before = _reads(db, None)
    head = max(_table_ids(db))
    run = _archiver(db, store, "200 events", partition_rows=partition_rows).run_once()
    assert run.deleted == 700 and run.boundary == head - 200
    assert _table_ids(db) == list(range(head - 199, head + 1))
    recorded = _recorded(db)
    assert sorted(store.list(ARCHIVE_PREFIX)) == [p.key for p in recorded]
    assert all(p.purged for p in recorded) and sum(p.events for p in recorded) == 700
    assert _reads(db, EventLog(store)) == before
    assert _archiver(db, store, "200 events").run_once().partitions == []  # nothing new


def test_the_archive_survives_in_s3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    db = Database(f"sqlite:///{tmp_path / 'driftline.db'}")
    request.addfinalizer(db.dispose)
    _store(db, _events(500, 2, "s3"))
    _published(db)
    before = _reads(db, None)
    with moto_s3_server() as endpoint:
        fake_aws(monkeypatch, endpoint)
        bucket = fresh_bucket_name()
        S3ObjectStore(bucket, create_bucket=True)
        store = open_object_store(f"s3://{bucket}/driftline")
        archiver = _archiver(db, store, "100 events", partition_rows=150, sample_size=40)
        run = archiver.run_once()
        assert len(run.partitions) == 3 and run.deleted == 400
        assert len(store.list(SAMPLE_PREFIX)) == 2
        assert _reads(db, EventLog(store)) == before
        assert _reads(db, EventLog(open_object_store(store.url), cached_partitions=1)) == before


def test_a_crash_after_writing_rewrites_one_object_and_loses_nothing(
    db: Database, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(db, _events(600, 3, "w"))
    _published(db)
    before, ids = _reads(db, None), _table_ids(db)
    crashing = _archiver(db, store, "300 events", partition_rows=1_000, sample_size=40)

    def crash(partition: archives.Partition) -> bool:
        raise RuntimeError("killed between writing and recording")

    monkeypatch.setattr(crashing, "_record", crash)
    with pytest.raises(RuntimeError):
        crashing.run_once()
    assert len(store.list(ARCHIVE_PREFIX)) == 1 and _recorded(db) == []
    assert _table_ids(db) == ids
    # The retention reaches further now: a longer partition from the same first event.
    _archiver(db, store, "100 events", partition_rows=1_000, sample_size=40).run_once()
    recorded = _recorded(db)
    assert [p.events for p in recorded] == [500]
    assert store.list(ARCHIVE_PREFIX) == [recorded[0].key]  # the shorter one swept
    assert store.list(SAMPLE_PREFIX) == [sample_key(0, recorded[0].last_id, 40)]
    assert _reads(db, EventLog(store)) == before


def test_a_crash_after_recording_is_finished_by_the_next_run(
    db: Database, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(db, _events(600, 4, "r"))
    _published(db)
    before, ids = _reads(db, None), _table_ids(db)
    crashing = _archiver(db, store, "300 events", partition_rows=1_000)

    def crash(partition: archives.Partition) -> int:
        raise RuntimeError("killed between recording and deleting")

    monkeypatch.setattr(crashing, "_purge", crash)
    with pytest.raises(RuntimeError):
        crashing.run_once()
    [recorded] = _recorded(db)
    assert not recorded.purged and _table_ids(db) == ids
    # Recorded and still in the table: read once, from the archive.
    assert _reads(db, EventLog(store)) == before
    run = _archiver(db, store, "300 events", partition_rows=1_000).run_once()
    assert run.partitions == [] and run.deleted == 300
    assert [p.purged for p in _recorded(db)] == [True]
    assert _table_ids(db) == ids[300:]
    assert _reads(db, EventLog(store)) == before


def test_a_damaged_partition_is_refused_not_read(db: Database, store: ObjectStore) -> None:
    _store(db, _events(300, 5, "d"))
    _published(db)
    _archiver(db, store, "100 events", partition_rows=1_000).run_once()
    [partition] = _recorded(db)
    store.put(partition.key, store.get(partition.key)[:-10] + b"0123456789")
    with db.connect() as conn, pytest.raises(ArchiveError, match="checksum"):
        EventLog(store).labelled(conn)
    store.delete(partition.key)
    with db.connect() as conn, pytest.raises(ArchiveError, match="missing"):
        EventLog(store).labelled(conn)


def test_events_within_the_dedup_horizon_stay_and_their_ids_stay_refused(
    db: Database, store: ObjectStore
) -> None:
    old, recent = _events(200, 6, "old"), _events(100, 7, "new")
    _store(db, old)
    with db.begin() as conn:  # stored two days ago
        conn.execute(update(events).values(ingested_at=events.c.ingested_at - 2 * 86_400))
    _store(db, recent)
    _published(db)
    archiver = _archiver(db, store, "1h", dedup_horizon_s=86_400.0, partition_rows=1_000)
    assert archiver.run_once().deleted == 200
    with db.begin() as conn:
        again = store_events(conn, [recent[5], recent[60], old[3]])
    # Within the horizon a redelivery is a duplicate; past it the event is new again.
    assert again.duplicates == 2 and [e.event_id for e in again.stored] == ["old-3"]


def test_what_a_restart_reads_from_the_table_is_never_archived(
    db: Database, store: ObjectStore
) -> None:
    _store(db, _events(400, 8, "p"))
    later = _archiver(db, store, "1s", clock=lambda: time.time() + 3_600)
    assert later.run_once().deleted == 0  # no version yet: a restart replays the table
    _published(db)
    head = max(_table_ids(db))
    with db.begin() as conn:
        conn.execute(
            insert(online_snapshots).values(
                position=head - 150, version="v0001", key="snapshots/x.npz", checksum="c",
                created_at=0.0, size=1,
            )
        )  # fmt: skip
    assert later.run_once().boundary == head - 150  # a restore folds in the log after it
    with db.begin() as conn:
        conn.execute(online_snapshots.delete())
    kept = _archiver(db, store, "1s", keep_newest=40, clock=lambda: time.time() + 3_600)
    assert kept.run_once().boundary == head - 40  # rated and popular items reload from these
    assert _archiver(db, store, "1s", clock=lambda: time.time() + 3_600).run_once().boundary == (
        head - 1
    )
    assert _table_ids(db) == [head]  # the newest event stays: SQLite numbers after it
    with db.begin() as conn:
        assert store_events(conn, _events(1, 9, "next")).position == head + 1


def test_ingestion_during_archiving_loses_and_repeats_nothing(
    db: Database, store: ObjectStore
) -> None:
    _store(db, _events(300, 10, "first"))
    _published(db)
    archiver = _archiver(db, store, "50 events", partition_rows=40, batch_rows=10)
    done = threading.Event()
    failures: list[BaseException] = []

    def ingest(writer: int) -> None:
        try:
            stream = _events(400, 100 + writer, f"w{writer}")
            for start in range(0, len(stream), 20):
                with db.begin() as conn:
                    assert store_events(conn, stream[start : start + 20]).duplicates == 0
        except BaseException as exc:  # reported below
            failures.append(exc)

    def archive() -> None:
        try:
            while not done.is_set():
                archiver.run_once()
        except BaseException as exc:
            failures.append(exc)

    writers = [threading.Thread(target=ingest, args=(w,)) for w in range(3)]
    archiving = threading.Thread(target=archive)
    archiving.start()
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    done.set()
    archiving.join()
    assert failures == []
    archiver.run_once()
    assert len(_recorded(db)) > 3
    with db.connect() as conn:
        walked = _walk(lambda a, u, n: EventLog(store).log_after(conn, a, u, n), None, 97)
        assert count_events(conn) == 1_500
    ids = [i for batch_ids, _ in walked for i in batch_ids]
    keys = [e.event_id for _, batch in walked for e in batch]
    assert ids == sorted(set(ids)) and len(ids) == 1_500
    expected = {f"first-{j}" for j in range(300)}
    expected |= {f"w{w}-{j}" for w in range(3) for j in range(400)}
    assert set(keys) == expected


def test_a_drift_change_point_in_the_archive_stands_at_its_boundary(
    db: Database, store: ObjectStore
) -> None:
    _store(db, _events(300, 11, "c"))
    _published(db)
    with db.connect() as conn:
        labelled = count_events(conn, labelled_only=True)
    boundary = _archiver(db, store, "100 events").run_once().boundary
    with db.connect() as conn:
        assert labelled_id_from_end(conn, labelled - 1) == boundary
        assert labelled_id_from_end(conn, 0) == max_event_id(conn)


# -- readers ------------------------------------------------------------------------------
def _window_builds(
    db: Database, store: ObjectStore, prefix: str, *, seed: int, since_share: int, extra: bool
) -> tuple[Callable[[], list[Any]], int]:
    """1,200 stored events and a function that builds a default window and drift windows
    over them (since ``head // since_share``), as comparable columns; and the head id.
    ``extra`` adds a drift window over the last 100 events."""
    _store(db, _events(1_200, seed, prefix))
    _published(db)
    source = StoreWindowSource(db, EventLog(store))
    with db.connect() as conn:
        head = max_event_id(conn)
    policies: list[WindowPolicy | ChangeWindowPolicy] = [
        WindowPolicy(history_sample=200),
        ChangeWindowPolicy(after_id=head // 3, history_ratio=0.5, seed=7),
    ]
    if extra:
        policies.append(ChangeWindowPolicy(after_id=head - 100, history_ratio=2.0, seed=1))

    def windows() -> list[Any]:
        built = [policy.build(source, head // since_share, head) for policy in policies]
        return [(w.user_ids, w.item_ids, w.ratings.tolist()) for w in built]

    return windows, head


def test_a_retraining_window_across_the_boundary_is_the_one_before_archiving(
    db: Database, store: ObjectStore
) -> None:
    windows, head = _window_builds(db, store, "win", seed=12, since_share=2, extra=True)
    before = windows()
    assert _archiver(db, store, "300 events").run_once().boundary > head // 2
    assert windows() == before


@pytest.mark.parametrize("table_read", ["labelled_events", "uniform_labelled"])
def test_a_window_read_while_the_archiver_moves_is_patched_not_read_again(
    db: Database, store: ObjectStore, monkeypatch: pytest.MonkeyPatch, table_read: str
) -> None:
    """The archiver records partitions and deletes their rows while a long window read
    is in the table: the read gets the events it missed from those partitions, and reads
    the table once."""
    import service.store.eventlog as eventlog

    windows, _ = _window_builds(db, store, "race", seed=13, since_share=4, extra=False)
    before = windows()
    real = getattr(eventlog, table_read)
    reads: list[int] = []
    runs = iter(["400 events", "250 events"])

    def racing(conn: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        retention = next(runs, None)
        if retention is not None:  # the archiver moves the boundary under this read
            assert _archiver(db, store, retention).run_once().deleted > 0
        return real(conn, *args, **kwargs)

    monkeypatch.setattr(eventlog, table_read, racing)
    assert windows() == before
    once_per_build = {"labelled_events": 2, "uniform_labelled": 2}
    assert len(reads) == once_per_build[table_read]


# -- the archive's sample ----------------------------------------------------------------
def _partition_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of the partitions read from now on, as they are read."""
    reads: list[str] = []
    real = PartitionReader.read

    def counting(self: PartitionReader, partition: archives.Partition) -> Any:
        reads.append(partition.key)
        return real(self, partition)

    monkeypatch.setattr(PartitionReader, "read", counting)
    return reads


def _uniform_draws(
    db: Database, store: ObjectStore, draws: list[tuple[int, int, int]], reads: list[str]
) -> tuple[list[Any], list[bool]]:
    """Each of ``draws`` (up to id, size, seed) through the archive, and whether it read
    no partition."""
    found, answered = [], []
    for up_to, size, seed in draws:
        reads.clear()
        with db.connect() as conn:
            found.append(_columns(EventLog(store).uniform_sample(conn, up_to, size, seed)))
        answered.append(not reads)
    return found, answered


def _stored_head(db: Database, seed: int, prefix: str) -> int:
    """1,500 stored events and a published version; the newest event's id."""
    _store(db, _events(1_500, seed, prefix))
    _published(db)
    with db.connect() as conn:
        return max_event_id(conn)


def test_a_drift_window_draws_the_archive_from_its_sample_not_its_partitions(
    db: Database, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = _stored_head(db, 21, "smp")
    draws = [(head, 60, 9), (head, 25, 9), (head, 61, 9), (head, 60, 8)]
    with db.connect() as conn:
        before = [_columns(uniform_labelled(conn, u, n, s)) for u, n, s in draws]
    run = _archiver(db, store, "300 events", sample_size=60, sample_seed=9).run_once()
    assert len(run.partitions) == 18 and len(store.list(SAMPLE_PREFIX)) == 2
    found, answered = _uniform_draws(db, store, draws, _partition_reads(monkeypatch))
    assert found == before
    # The sample answers its seed at its size or less; another size or seed reads the
    # partitions.
    assert answered == [True, True, False, False]


def test_job_windows_over_a_long_archive_read_its_sample_not_its_partitions(
    db: Database, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = _stored_head(db, 24, "job")
    source = StoreWindowSource(db, EventLog(store))
    policies: list[WindowPolicy | ChangeWindowPolicy] = [
        WindowPolicy(history_sample=200, seed=6),  # a refresh
        ChangeWindowPolicy(after_id=head - 150, history_ratio=1.0, history_sample=200, seed=6),
    ]

    def windows() -> list[Any]:
        built = [policy.build(source, head - 100, head) for policy in policies]
        return [(w.user_ids, w.item_ids, w.ratings.tolist()) for w in built]

    before = windows()
    _archiver(db, store, "300 events", sample_size=200, sample_seed=6).run_once()
    reads = _partition_reads(monkeypatch)
    assert windows() == before
    assert reads == []


def test_a_sample_answers_a_prefix_of_the_archive_only_when_it_holds_enough(
    db: Database, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = _stored_head(db, 22, "pre")
    draws = [(head // 2, 10, 4), (head // 2, 60, 4), (head // 20, 30, 4)]
    with db.connect() as conn:
        before = [_columns(uniform_labelled(conn, u, n, s)) for u, n, s in draws]
    _archiver(db, store, "300 events", sample_size=60, sample_seed=4).run_once()
    found, answered = _uniform_draws(db, store, draws, _partition_reads(monkeypatch))
    assert found == before
    assert answered == [True, False, False]


def test_the_archiver_keeps_two_samples_and_starts_one_for_an_archive_without(
    db: Database, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(db, _events(900, 23, "late"))
    _published(db)
    with db.connect() as conn:
        head = max_event_id(conn)
        before = _columns(uniform_labelled(conn, head, 40, 2))
    _archiver(db, store, "600 events").run_once()
    assert store.list(SAMPLE_PREFIX) == []
    _archiver(db, store, "200 events", sample_size=40, sample_seed=2).run_once()
    boundaries = [p.last_id for p in _recorded(db)]
    assert len(boundaries) == 11  # 5 without a sample, 6 with
    assert store.list(SAMPLE_PREFIX) == [sample_key(2, b, 40) for b in boundaries[-2:]]
    found, answered = _uniform_draws(db, store, [(head, 40, 2)], _partition_reads(monkeypatch))
    assert found == [before] and answered == [True]


@pytest.fixture
def retention_pipelines(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Driftline]]:
    """Pipelines that keep the newest 100 events (and the 4,096 a restart reloads)."""

    def settings(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "event_retention": "100 events",
            "retention_dedup_horizon_s": 0,
            "serving_history_pairs": 4_096,
            "popular_window": 50,
            "snapshot_every_events": None,
            **overrides,
        }
        return small_settings(tmp_path / "data", database_url, **values)

    with pipeline_factory(settings) as make:
        yield make


def _ingest(pipeline: Driftline, stream: list[NewEvent], batch: int = 100) -> None:
    for start in range(0, len(stream), batch):
        pipeline.ingest(stream[start : start + batch])


def _state(pipeline: Driftline) -> dict[str, Any]:
    learner = pipeline.learner
    users = [u for u in USERS for _ in ITEMS]
    items = ITEMS * len(USERS)
    return {
        "version": learner.serving.version,
        "predictions": learner.serving.predict(users, items).tolist(),
        "recommendations": [pipeline.recommender.recommend(u, 10) for u in USERS],
        "history": {user: sorted(learner.history.items(user)) for user in USERS},
        "popular": learner.popular.ranking,
        "labelled_seen": learner.labelled_seen,
        "applied": learner.applied,
    }


def test_a_restart_after_retention_comes_back_as_before(
    retention_pipelines: Callable[..., Driftline],
) -> None:
    first = retention_pipelines()
    _ingest(first, _events(4_600, 13, "s"))
    assert first.learner.current is not None
    first.monitor.flush()
    restarted = retention_pipelines(retrain_enabled=False)  # holds the lead now
    before = _state(restarted)
    assert restarted.archiver is not None
    assert restarted.archiver.run_once().deleted == 4_600 - 4_096
    again = retention_pipelines(retrain_enabled=False)
    assert _state(again) == before
    # The monitor resumes at the same place in the log: heartbeats and change points
    # keep counting archived events.
    assert again.monitor.events_offset == restarted.monitor.events_offset
    assert again.monitor.version == restarted.monitor.version == before["version"]
    with again.db.connect() as conn:
        assert count_events(conn) == 4_600


def test_a_replica_behind_the_boundary_catches_up_from_the_archive(
    tmp_path: Path, database_url: str
) -> None:
    with replica_factory(
        tmp_path / "data",
        database_url,
        event_retention="100 events",
        retention_dedup_horizon_s=0,
        serving_history_pairs=4_096,
        popular_window=50,
        snapshot_every_events=None,
    ) as make:
        leader = make("a")
        _ingest(leader, _events(300, 14, "boot"))
        leader.trigger.enabled = False
        follower = make("b", retrain_enabled=False)
        _ingest(leader, _events(4_500, 15, "behind"))
        assert leader.archiver is not None
        assert leader.archiver.run_once().boundary > follower.learner.applied
        follower.catch_up()
        assert _state(follower) == _state(leader)


def test_settings_wire_an_archiver_only_when_retention_is_set(
    retention_pipelines: Callable[..., Driftline],
) -> None:
    pipeline = retention_pipelines(event_retention=None)
    assert pipeline.archiver is None and pipeline.event_log is not None
    archiver = retention_pipelines(retention_batch_rows=300).archiver
    assert archiver is not None
    options = archiver.options
    assert (options.policy.events, options.keep_newest, options.batch_rows) == (100, 4_096, 300)


def test_deletes_per_transaction_follow_the_backend_unless_set(
    db: Database, store: ObjectStore
) -> None:
    backend = db.engine.dialect.name
    assert _archiver(db, store, "50 events", batch_rows=None).batch_rows == BATCH_ROWS[backend]
    assert _archiver(db, store, "50 events", batch_rows=300).batch_rows == 300


def test_a_partition_with_gaps_in_its_ids_leaves_the_table_whole(
    db: Database, store: ObjectStore
) -> None:
    """Ids have gaps (a PostgreSQL sequence skips the ids of refused duplicates): the
    range deletes take every archived event and no other."""
    _store(db, _events(400, 21, "g"))
    with db.begin() as conn:
        conn.execute(delete(events).where(events.c.id % 3 == 0, events.c.id < 300))
        kept = {row[0] for row in conn.execute(select(events.c.event_id))}
    _published(db)
    archiver = _archiver(db, store, "50 events", partition_rows=90, batch_rows=7)
    run = archiver.run_once()
    with db.connect() as conn:
        boundary = archives.boundary(conn)
        left = [row[0] for row in conn.execute(select(events.c.id).order_by(events.c.id))]
        walked = _walk(lambda a, u, n: EventLog(store).log_after(conn, a, u, n), None, 61)
    assert run.deleted == len(kept) - len(left) and left and left[0] > boundary
    assert {e.event_id for _, batch in walked for e in batch} == kept


def test_archive_records_match_their_objects(db: Database, store: ObjectStore) -> None:
    _store(db, _events(250, 16, "m"))
    _published(db)
    _archiver(db, store, "50 events", partition_rows=80).run_once()
    with db.connect() as conn:
        rows = conn.execute(select(event_archives).order_by(event_archives.c.first_id)).all()
        assert conn.scalar(select(func.count()).select_from(events)) == 50
    assert [(r.first_id, r.last_id, r.events) for r in rows] == [
        (1, 80, 80),
        (81, 160, 80),
        (161, 200, 40),
    ]
    assert all(r.size == len(store.get(r.key)) for r in rows)


def test_only_the_leader_archives_and_a_deposed_one_records_nothing(
    db: Database, store: ObjectStore
) -> None:
    _store(db, _events(300, 17, "l"))
    _published(db)
    options = RetentionOptions(parse_retention("100 events"), dedup_horizon_s=0, pause_s=0)
    follower = Archiver(db, store, options, leading=lambda: False)
    assert follower.run_once().partitions == [] and _recorded(db) == []
    with db.begin() as conn:
        lease = claim_lease(conn, Claimant("a", "1"), 60.0)
    deposed = Archiver(db, store, options, fencing_token=lambda: lease.token + 1)
    assert deposed.run_once().partitions == [] and _recorded(db) == []
    assert len(_table_ids(db)) == 300
    leader = Archiver(db, store, options, fencing_token=lambda: lease.token)
    assert leader.run_once().deleted == 200
    assert store.list(ARCHIVE_PREFIX) == [p.key for p in _recorded(db)]


def test_the_archiver_runs_on_its_own_thread_until_stopped(
    db: Database, store: ObjectStore
) -> None:
    _store(db, _events(300, 18, "t"))
    _published(db)
    archiver = _archiver(db, store, "100 events")
    archiver.start(interval_s=0.01)
    try:
        deadline = time.monotonic() + 30
        while len(_table_ids(db)) > 100 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        archiver.stop()
    assert len(_table_ids(db)) == 100
