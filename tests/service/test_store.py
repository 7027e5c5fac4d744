"""The event store (``service.store``) on a real database.

Every test runs on a SQLite file under ``tmp_path`` and, when
``DRIFTLINE_TEST_DATABASE_URL`` names a PostgreSQL database, on a fresh schema of it too
(the ``database_url`` fixture in ``tests/conftest.py``).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.exc import IntegrityError

from service.store import Database
from service.store.alerts import (
    add_alert,
    add_heartbeats,
    attach_alert,
    list_alerts,
    list_heartbeats,
)
from service.store.events import (
    IngestOutcome,
    LabelledEvents,
    NewEvent,
    count_events,
    labelled_events,
    max_event_id,
    popular_items,
    rated_items,
    store_events,
)
from service.store.jobs import (
    active_jobs,
    add_epoch,
    count_jobs,
    create_job,
    get_job,
    list_jobs,
    update_job,
)
from service.store.tables import metadata
from service.store.versions import add_version, get_version, list_versions
from tests.support.databases import schema_of


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url)
    yield database
    database.dispose()


def _is_sqlite(db: Database) -> bool:
    return db.engine.dialect.name == "sqlite"


def _labelled(n: int, prefix: str = "e") -> list[NewEvent]:
    return [
        NewEvent(f"u{k % 5}", f"i{k % 7}", rating=1.0 + k % 5, event_id=f"{prefix}{k}")
        for k in range(n)
    ]


def _store(db: Database, batch: list[NewEvent]) -> None:
    with db.begin() as conn:
        store_events(conn, batch)


# -- schema and connection -----------------------------------------------------------


def test_migrations_are_idempotent_when_the_same_database_is_opened_twice(
    database_url: str,
) -> None:
    first = Database(database_url)
    _store(first, _labelled(3))
    first.dispose()
    second = Database(database_url)
    try:
        with second.connect() as conn:
            assert count_events(conn) == 3
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).all()
        assert len(versions) == 1
    finally:
        second.dispose()


def test_migrations_create_every_table(db: Database) -> None:
    with db.connect() as conn:
        for table in metadata.sorted_tables:
            assert conn.scalar(select(func.count()).select_from(table)) == 0, table.name


def test_postgresql_tables_and_alembic_version_live_in_the_tests_own_schema(
    db: Database, database_url: str
) -> None:
    if _is_sqlite(db):
        pytest.skip("schemas are a PostgreSQL matter")
    schema = schema_of(database_url)
    assert schema is not None and schema.startswith("t_")
    with db.connect() as conn:
        assert conn.scalar(text("SELECT current_schema()")) == schema
        here = set(
            conn.scalars(
                text("SELECT table_name FROM information_schema.tables WHERE table_schema = :s"),
                {"s": schema},
            )
        )
        version = conn.scalar(text(f'SELECT version_num FROM "{schema}".alembic_version'))
    assert here == {table.name for table in metadata.sorted_tables} | {"alembic_version"}
    assert version is not None


def test_sqlite_runs_in_wal_mode_with_durable_commits(db: Database) -> None:
    if not _is_sqlite(db):
        pytest.skip("journal modes are a SQLite setting")
    with db.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_sqlite_creates_the_directory_of_its_file(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "x.db"
    database = Database(f"sqlite:///{path}")
    database.dispose()
    assert path.is_file()


def test_foreign_keys_are_enforced(db: Database) -> None:
    with pytest.raises(IntegrityError), db.begin() as conn:
        add_version(
            conn,
            version="v0001",
            artifact_key="models/v0001/model.npz",
            checksum="0" * 64,
            job_id=12345,
            last_event_id=0,
            n_users=0,
            n_items=0,
        )


# -- storing events ------------------------------------------------------------------


def test_store_events_stores_a_batch_in_order(db: Database) -> None:
    batch = _labelled(4)
    with db.begin() as conn:
        outcome = store_events(conn, batch)
    assert (outcome.accepted, outcome.duplicates) == (4, 0)
    assert outcome.stored == batch
    with db.connect() as conn:
        stored = labelled_events(conn)
    assert stored.user_ids == [e.user_id for e in batch]
    assert stored.item_ids == [e.item_id for e in batch]
    assert stored.ratings.tolist() == [e.rating for e in batch]


def test_duplicates_within_a_batch_are_counted_and_stored_once(db: Database) -> None:
    a, b = _labelled(2)
    with db.begin() as conn:
        outcome = store_events(conn, [a, a, b, a])
    assert (outcome.accepted, outcome.duplicates) == (2, 2)
    assert outcome.stored == [a, b]
    with db.connect() as conn:
        assert count_events(conn) == 2


def test_duplicates_across_batches_are_counted_and_not_stored_again(db: Database) -> None:
    events = _labelled(3)
    _store(db, events[:2])
    retry = [NewEvent("other", "other", rating=5.0, event_id="e1"), events[2]]
    with db.begin() as conn:
        outcome = store_events(conn, retry)
    assert (outcome.accepted, outcome.duplicates) == (1, 1)
    assert outcome.stored == [events[2]]
    with db.connect() as conn:
        assert count_events(conn) == 3
        assert "other" not in labelled_events(conn).user_ids  # the first copy wins


def _stored_event_ids(db: Database) -> list[str]:
    with db.connect() as conn:
        return list(conn.scalars(text("SELECT event_id FROM events ORDER BY id")))


def test_events_without_an_id_get_a_fresh_one_each(db: Database) -> None:
    same = NewEvent("u", "i", rating=3.0)
    with db.begin() as conn:
        outcome = store_events(conn, [same, same, NewEvent("u", "j")])
    assert (outcome.accepted, outcome.duplicates) == (3, 0)
    ids = _stored_event_ids(db)
    assert len(ids) == 3
    assert all(isinstance(i, str) and i for i in ids)
    assert len(set(ids)) == 3


def test_generated_ids_never_collide_with_later_batches(db: Database) -> None:
    for _ in range(3):
        with db.begin() as conn:
            assert store_events(conn, [NewEvent("u", "i", rating=3.0)]).accepted == 1
    assert len(set(_stored_event_ids(db))) == 3


def test_an_empty_event_id_is_replaced_by_a_generated_one(db: Database) -> None:
    with db.begin() as conn:
        outcome = store_events(conn, [NewEvent("u", "i", event_id=""), NewEvent("u", "j")])
    assert (outcome.accepted, outcome.duplicates) == (2, 0)
    ids = _stored_event_ids(db)
    assert len(set(ids)) == 2 and all(ids)


def test_an_empty_batch_stores_nothing(db: Database) -> None:
    with db.begin() as conn:
        outcome = store_events(conn, [])
    assert (outcome.accepted, outcome.duplicates) == (0, 0)
    assert _stored_event_ids(db) == []


def test_a_transaction_that_fails_after_store_events_leaves_nothing_stored(db: Database) -> None:
    _store(db, _labelled(2, prefix="kept"))

    class Boom(Exception):
        pass

    with pytest.raises(Boom), db.begin() as conn:
        outcome = store_events(conn, _labelled(5))
        assert outcome.accepted == 5
        raise Boom
    with db.connect() as conn:
        assert count_events(conn) == 2
    # The rolled-back ids are free again: a retry stores the whole batch.
    with db.begin() as conn:
        assert store_events(conn, _labelled(5)).accepted == 5


def test_a_batch_with_one_invalid_event_stores_none_of_it(db: Database) -> None:
    batch = [*_labelled(3), NewEvent(None, "i", rating=1.0, event_id="bad")]  # type: ignore[arg-type]
    with pytest.raises(IntegrityError), db.begin() as conn:
        store_events(conn, batch)
    with db.connect() as conn:
        assert count_events(conn) == 0


def _rows_between(db: Database, after: int, up_to: int) -> list[tuple[int, str]]:
    with db.connect() as conn:
        query = text("SELECT id, event_id FROM events WHERE id > :a AND id <= :b ORDER BY id")
        return [(int(row[0]), row[1]) for row in conn.execute(query, {"a": after, "b": up_to})]


def test_the_outcome_bounds_exactly_the_rows_its_batch_stored(db: Database) -> None:
    events = _labelled(6)
    _store(db, events[:2])
    with db.connect() as conn:
        newest = max_event_id(conn)
    # Repeats inside the batch and of stored events, between new ones.
    batch = [events[2], events[0], events[3], events[2], events[1], events[4], events[3]]
    with db.begin() as conn:
        outcome = store_events(conn, batch)
    assert outcome.stored == [events[2], events[3], events[4]]
    assert (outcome.accepted, outcome.duplicates) == (3, 4)
    assert outcome.log_before == newest
    with db.connect() as conn:
        assert outcome.position == max_event_id(conn)
    rows = _rows_between(db, outcome.log_before, outcome.position)
    assert [event_id for _, event_id in rows] == ["e2", "e3", "e4"]


def test_a_batch_of_duplicates_only_leaves_the_position_where_it_was(db: Database) -> None:
    events = _labelled(3)
    _store(db, events)
    with db.begin() as conn:
        outcome = store_events(conn, [events[1], events[1], events[0]])
    assert (outcome.accepted, outcome.duplicates) == (0, 3)
    with db.connect() as conn:
        assert outcome.log_before == outcome.position == max_event_id(conn)


@pytest.mark.parametrize("size", [1, 2, 127, 128, 129, 500, 1023])
def test_a_batch_of_any_size_is_stored_whole_in_order_with_exact_values(
    db: Database, size: int
) -> None:
    """SQLite inserts a batch as statements of 128 rows and powers of two below: every
    size stores each event once, in order, with its ratings and timestamps bit for bit."""
    rng = random.Random(size)
    batch = [
        NewEvent(
            f"u{rng.randrange(50)}",
            f"i{rng.randrange(900)}",
            rating=rng.random() * 5 if k % 3 else None,
            timestamp=1.7e9 + rng.random() if k % 4 else None,
            event_id=f"s{size}-{k}",
        )
        for k in range(size)
    ]
    _store(db, _labelled(3, prefix="before"))
    with db.begin() as conn:
        outcome = store_events(conn, batch)
    assert (outcome.accepted, outcome.duplicates, outcome.stored) == (size, 0, batch)
    with db.connect() as conn:
        assert outcome.position == max_event_id(conn) == outcome.log_before + size
        rows = conn.execute(
            text(
                "SELECT event_id, user_id, item_id, rating, timestamp FROM events "
                "WHERE id > :after ORDER BY id"
            ),
            {"after": outcome.log_before},
        ).all()
    assert [tuple(row) for row in rows] == [
        (e.event_id, e.user_id, e.item_id, e.rating, e.timestamp) for e in batch
    ]


def test_duplicates_spread_over_a_large_batch_leave_exactly_the_new_events(db: Database) -> None:
    """Stored events scattered through a batch of several statements' worth of rows:
    the new ones are stored in order and the outcome names exactly them."""
    events = _labelled(700)
    stored_before = events[::3]
    _store(db, stored_before)
    with db.begin() as conn:
        outcome = store_events(conn, events)
    fresh = [e for k, e in enumerate(events) if k % 3]
    assert outcome.stored == fresh
    assert (outcome.accepted, outcome.duplicates) == (len(fresh), len(stored_before))
    rows = _rows_between(db, outcome.log_before, outcome.position)
    assert [event_id for _, event_id in rows] == [e.event_id for e in fresh]


def test_sqlite_stores_a_batch_in_a_few_statements_not_one_per_row(db: Database) -> None:
    """The driver lets other threads run during each statement, and taking the
    interpreter back costs up to a switch interval while another thread computes: a
    batch of 500 is stored in a handful of statements, whatever its size."""
    if not _is_sqlite(db):
        pytest.skip("PostgreSQL inserts a batch in one statement")
    statements: list[str] = []
    with db.begin() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        driver.set_trace_callback(statements.append)
        try:
            outcome = store_events(conn, _labelled(500))
        finally:
            driver.set_trace_callback(None)
    assert outcome.accepted == 500
    inserts = [sql for sql in statements if sql.lstrip().upper().startswith("INSERT")]
    assert 1 <= len(inserts) <= 8
    assert len(statements) <= 12


def test_concurrent_writers_store_each_event_once_and_ids_become_visible_in_order(
    db: Database,
) -> None:
    """Four writers store overlapping batches while a reader follows the log.

    Every event id is stored once, each writer's outcome names exactly the rows it
    stored (``log_before`` exact: no other writer's row lies between it and the batch),
    and a reader never sees an id before a smaller one that commits later.
    """
    writers, batches, size = 4, 12, 30
    outcomes: list[list[tuple[list[str], IngestOutcome]]] = [[] for _ in range(writers)]
    seen: list[list[int]] = []
    done = threading.Event()

    def write(w: int) -> None:
        rng = random.Random(w)
        for j in range(batches):
            # Half of each batch is shared with the other writers' j-th batches.
            keys = [f"s{j}-{k}" for k in range(size // 2)] + [
                f"w{w}-{j}-{k}" for k in range(size // 2)
            ]
            rng.shuffle(keys)
            batch = [NewEvent(f"u{w}", key, rating=3.0, event_id=key) for key in keys]
            with db.begin() as conn:
                outcomes[w].append((keys, store_events(conn, batch)))

    def follow() -> None:
        while not done.is_set():
            with db.connect() as conn:
                seen.append([int(i) for i in conn.scalars(text("SELECT id FROM events"))])

    reader = threading.Thread(target=follow)
    reader.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    reader.join()

    rows = _rows_between(db, 0, 2**62)
    stored_ids = [event_id for _, event_id in rows]
    expected = {f"s{j}-{k}" for j in range(batches) for k in range(size // 2)} | {
        f"w{w}-{j}-{k}" for w in range(writers) for j in range(batches) for k in range(size // 2)
    }
    assert sorted(stored_ids) == sorted(expected)  # each once
    results = [outcome for per_writer in outcomes for _, outcome in per_writer]
    assert sum(o.accepted for o in results) == len(expected)
    assert sum(o.duplicates for o in results) == writers * batches * size - len(expected)
    for keys, outcome in (pair for per_writer in outcomes for pair in per_writer):
        own = _rows_between(db, outcome.log_before, outcome.position)
        assert [event_id for _, event_id in own] == [e.event_id for e in outcome.stored]
        fresh = {e.event_id for e in outcome.stored}
        assert [e.event_id for e in outcome.stored] == [k for k in keys if k in fresh]
    every_id = [row_id for row_id, _ in rows]
    for snapshot in seen:
        if snapshot:
            assert sorted(snapshot) == [i for i in every_id if i <= max(snapshot)]


def test_max_event_id_is_zero_for_an_empty_store_and_grows_with_it(db: Database) -> None:
    with db.connect() as conn:
        assert max_event_id(conn) == 0
    _store(db, _labelled(3))
    with db.connect() as conn:
        assert max_event_id(conn) == int(labelled_events(conn).ids.max())


# -- reading events ------------------------------------------------------------------


def _mixed(db: Database) -> list[int]:
    """Store ten events, the odd ones unlabelled; returns the row ids in order."""
    batch = [
        NewEvent(f"u{k}", f"i{k}", rating=float(k % 5) + 0.5 if k % 2 == 0 else None)
        for k in range(10)
    ]
    _store(db, batch)
    with db.connect() as conn:
        return list(conn.scalars(text("SELECT id FROM events ORDER BY id")))


def test_labelled_events_skip_unlabelled_events(db: Database) -> None:
    _mixed(db)
    with db.connect() as conn:
        got = labelled_events(conn)
    assert got.user_ids == ["u0", "u2", "u4", "u6", "u8"]
    assert got.ratings.tolist() == [0.5, 2.5, 4.5, 1.5, 3.5]
    assert list(got.ids) == sorted(got.ids)
    assert len(got) == 5


def test_labelled_events_respect_after_and_up_to_bounds(db: Database) -> None:
    ids = _mixed(db)
    with db.connect() as conn:
        after = labelled_events(conn, after_id=ids[2])  # exclusive
        window = labelled_events(conn, after_id=ids[1], up_to_id=ids[6])  # inclusive
        nothing = labelled_events(conn, after_id=ids[-1])
    assert after.user_ids == ["u4", "u6", "u8"]
    assert window.user_ids == ["u2", "u4", "u6"]
    assert window.ids.tolist() == [ids[2], ids[4], ids[6]]
    assert len(nothing) == 0
    assert nothing.ratings.dtype == np.float64


def test_rated_items_are_the_users_distinct_items_labelled_or_not(db: Database) -> None:
    _store(
        db,
        [
            NewEvent("ann", "x", rating=4.0),
            NewEvent("ann", "y"),
            NewEvent("ann", "x", rating=2.0),
            NewEvent("bob", "z", rating=3.0),
        ],
    )
    with db.connect() as conn:
        assert sorted(rated_items(conn, "ann")) == ["x", "y"]
        assert rated_items(conn, "bob") == ["z"]
        assert rated_items(conn, "nobody") == []


def test_popular_items_rank_the_newest_window_by_count(db: Database) -> None:
    old = [NewEvent(f"o{k}", "old-hit") for k in range(50)]
    new = (
        [NewEvent(f"n{k}", "b") for k in range(5)]
        + [NewEvent(f"m{k}", "a") for k in range(3)]
        + [NewEvent(f"p{k}", "c") for k in range(3)]
        + [NewEvent("q", "d")]
    )
    _store(db, old)
    _store(db, new)
    with db.connect() as conn:
        assert popular_items(conn, window=len(new), limit=10) == [
            ("b", 5),
            ("a", 3),  # ties are broken by item id
            ("c", 3),
            ("d", 1),
        ]
        assert popular_items(conn, window=len(new), limit=2) == [("b", 5), ("a", 3)]
        assert popular_items(conn, window=1000, limit=1) == [("old-hit", 50)]


def test_popular_items_count_distinct_users_not_events(db: Database) -> None:
    """One user's thousand events for an item weigh what one event does."""
    spam = [NewEvent("spammer", "pushed", 5.0) for _ in range(1000)]
    liked = [NewEvent(f"fan{k}", "liked", 4.0) for k in range(3)]
    _store(db, spam + liked)
    with db.connect() as conn:
        assert popular_items(conn, window=2000, limit=2) == [("liked", 3), ("pushed", 1)]


def test_popular_items_of_an_empty_store_is_empty(db: Database) -> None:
    with db.connect() as conn:
        assert popular_items(conn, window=100, limit=10) == []


# -- retraining jobs -----------------------------------------------------------------


def _job(db: Database, status: str | None = None, trigger: str = "drift") -> int:
    with db.begin() as conn:
        job_id = create_job(
            conn, policy="adwin", trigger=trigger, runtime="inprocess", params={"factors": 8}
        )
        if status is not None:
            update_job(conn, job_id, status=status)
    return job_id


def test_a_new_job_is_queued_with_its_parameters(db: Database) -> None:
    job_id = _job(db)
    with db.connect() as conn:
        job = get_job(conn, job_id)
    assert job is not None
    assert job["id"] == job_id
    assert (job["policy"], job["trigger"], job["runtime"]) == ("adwin", "drift", "inprocess")
    assert job["status"] == "queued"
    assert job["params"] == {"factors": 8}
    assert job["created_at"] > 0
    assert job["started_at"] is None and job["finished_at"] is None
    assert job["epochs"] == [] and job["alert_ids"] == []


def test_update_job_changes_only_the_given_fields(db: Database) -> None:
    job_id = _job(db)
    other = _job(db)
    with db.begin() as conn:
        update_job(conn, job_id, status="succeeded", model_version="v0003", cost_usd=0.5)
    with db.connect() as conn:
        job, untouched = get_job(conn, job_id), get_job(conn, other)
    assert job is not None and untouched is not None
    assert (job["status"], job["model_version"], job["cost_usd"]) == ("succeeded", "v0003", 0.5)
    assert job["trigger"] == "drift"
    assert untouched["status"] == "queued" and untouched["model_version"] is None


def test_job_epochs_come_back_in_epoch_order_with_their_configs(db: Database) -> None:
    job_id = _job(db)
    config = {"batch_size": 512, "learning_rate": 0.05, "workers": 1}
    with db.begin() as conn:
        add_epoch(conn, job_id, epoch=1, loss=0.5, duration_s=0.2, config=config)
        add_epoch(conn, job_id, epoch=0, loss=0.9, duration_s=0.3, config={"batch_size": 256})
    with db.connect() as conn:
        job = get_job(conn, job_id)
    assert job is not None
    assert [e["epoch"] for e in job["epochs"]] == [0, 1]
    assert [e["loss"] for e in job["epochs"]] == [0.9, 0.5]
    assert job["epochs"][1]["config"] == config
    assert job["epochs"][0]["duration_s"] == 0.3


def test_an_epoch_cannot_be_recorded_twice(db: Database) -> None:
    job_id = _job(db)
    with db.begin() as conn:
        add_epoch(conn, job_id, epoch=0, loss=0.9, duration_s=0.3, config={})
    with pytest.raises(IntegrityError), db.begin() as conn:
        add_epoch(conn, job_id, epoch=0, loss=0.8, duration_s=0.3, config={})


def test_a_job_lists_the_alerts_attached_to_it(db: Database) -> None:
    job_id, other = _job(db), _job(db)
    with db.begin() as conn:
        first = add_alert(
            conn, metric="rmse", before=0.8, after=1.1, events_seen=5, model_version=None
        )
        second = add_alert(
            conn, metric="rmse", before=0.8, after=1.2, events_seen=9, model_version="v0001"
        )
        attach_alert(conn, first, job_id)
        attach_alert(conn, second, job_id)
    with db.connect() as conn:
        job, unrelated = get_job(conn, job_id), get_job(conn, other)
    assert job is not None and unrelated is not None
    assert sorted(job["alert_ids"]) == sorted([first, second])
    assert unrelated["alert_ids"] == []


def test_an_unknown_job_is_none(db: Database) -> None:
    with db.connect() as conn:
        assert get_job(conn, 424242) is None


def test_jobs_are_listed_newest_first_and_counted_by_status(db: Database) -> None:
    ids = [_job(db, "succeeded"), _job(db, "failed"), _job(db, "succeeded")]
    with db.connect() as conn:
        assert [j["id"] for j in list_jobs(conn)] == ids[::-1]
        assert [j["id"] for j in list_jobs(conn, limit=2)] == ids[:0:-1]
        assert count_jobs(conn) == 3
        assert count_jobs(conn, "succeeded") == 2
        assert count_jobs(conn, "running") == 0


def test_active_jobs_are_the_queued_and_running_ones_oldest_first(db: Database) -> None:
    queued, running, _ = _job(db), _job(db, "running"), _job(db, "succeeded")
    with db.begin() as conn:
        add_epoch(conn, running, epoch=0, loss=1.0, duration_s=0.5, config={"workers": 2})
    with db.connect() as conn:
        jobs = active_jobs(conn)
    assert [(j["id"], j["status"]) for j in jobs] == [(queued, "queued"), (running, "running")]
    assert [e["epoch"] for e in jobs[1]["epochs"]] == [0]


# -- alerts and heartbeats -----------------------------------------------------------


def test_alerts_are_listed_newest_first_with_what_was_detected(db: Database) -> None:
    with db.begin() as conn:
        ids = [
            add_alert(
                conn,
                metric="rmse",
                before=0.8,
                after=0.8 + k,
                events_seen=100 * k,
                model_version="v1",
            )
            for k in range(1, 4)
        ]
    with db.connect() as conn:
        alerts = list_alerts(conn)
        assert [a["id"] for a in list_alerts(conn, limit=2)] == ids[:0:-1]
    assert [a["id"] for a in alerts] == ids[::-1]
    newest = alerts[0]
    assert (newest["metric"], newest["before"], newest["after"]) == ("rmse", 0.8, 3.8)
    assert newest["events_seen"] == 300
    assert newest["model_version"] == "v1"
    assert newest["retrain_job_id"] is None
    assert newest["detected_at"] > 0


def test_attach_alert_links_an_alert_to_its_job(db: Database) -> None:
    job_id = _job(db)
    with db.begin() as conn:
        alert = add_alert(conn, metric="rmse", before=1, after=2, events_seen=1, model_version=None)
        attach_alert(conn, alert, job_id)
    with db.connect() as conn:
        assert list_alerts(conn)[0]["retrain_job_id"] == job_id


def _beat(events_seen: int, rmse: float = 0.9) -> dict:
    return {
        "at": 1.0,
        "events_seen": events_seen,
        "events": 50,
        "rmse": rmse,
        "static_rmse": rmse + 0.1,
        "model_version": None,
    }


def test_heartbeats_are_stored_and_listed_by_events_seen(db: Database) -> None:
    with db.begin() as conn:
        add_heartbeats(conn, [_beat(50, 0.9), _beat(100, 0.8), _beat(150, 0.7)])
        add_heartbeats(conn, [])
    with db.connect() as conn:
        beats = list_heartbeats(conn)
        later = list_heartbeats(conn, since_events=50)
    assert [b["events_seen"] for b in beats] == [50, 100, 150]
    assert [b["rmse"] for b in beats] == [0.9, 0.8, 0.7]
    assert beats[0]["static_rmse"] == pytest.approx(1.0)
    assert [b["events_seen"] for b in later] == [100, 150]


def _version(db: Database, name: str, **overrides: object) -> None:
    row = {
        "version": name,
        "artifact_key": f"models/{name}/model.npz",
        "checksum": "ab" * 32,
        "rmse": 0.9,
        "job_id": None,
        "last_event_id": 10,
        "n_users": 3,
        "n_items": 4,
    }
    row.update(overrides)
    with db.begin() as conn:
        add_version(conn, **row)


def test_a_version_row_round_trips(db: Database) -> None:
    job_id = _job(db)
    _version(db, "v0001", job_id=job_id, rmse=None)
    with db.connect() as conn:
        row = get_version(conn, "v0001")
    assert row is not None
    assert row["artifact_key"] == "models/v0001/model.npz"
    assert row["checksum"] == "ab" * 32
    assert (row["job_id"], row["rmse"], row["last_event_id"]) == (job_id, None, 10)
    assert (row["n_users"], row["n_items"]) == (3, 4)
    assert row["created_at"] > 0


def test_versions_are_listed_newest_first(db: Database) -> None:
    for name in ("v0001", "v0002", "v0003"):
        _version(db, name)
    with db.connect() as conn:
        assert [v["version"] for v in list_versions(conn)] == ["v0003", "v0002", "v0001"]


def test_a_version_name_is_registered_once(db: Database) -> None:
    _version(db, "v0001")
    with pytest.raises(IntegrityError):
        _version(db, "v0001", checksum="cd" * 32)
    with db.connect() as conn:
        row = get_version(conn, "v0001")
    assert row is not None and row["checksum"] == "ab" * 32


def test_an_unknown_version_is_none(db: Database) -> None:
    with db.connect() as conn:
        assert get_version(conn, "v9999") is None
        assert list_versions(conn) == []


@pytest.mark.parametrize("rows", [0, 1, 3, 7])
def test_columns_built_a_chunk_of_rows_at_a_time_equal_those_built_at_once(rows: int) -> None:
    result = [(i, f"u{i % 2}", f"i{i}", 0.5 + i) for i in range(rows)]
    with create_engine("sqlite://").connect() as conn:
        conn.exec_driver_sql("CREATE TABLE r (id INTEGER, user_id TEXT, item_id TEXT, rating REAL)")
        for row in result:
            conn.exec_driver_sql("INSERT INTO r VALUES (?, ?, ?, ?)", row)
        query = conn.exec_driver_sql("SELECT id, user_id, item_id, rating FROM r ORDER BY id")
        chunked = LabelledEvents.from_result(query, chunk=3)
    whole = LabelledEvents.from_rows(result)
    assert chunked.user_ids == whole.user_ids and chunked.item_ids == whole.item_ids
    np.testing.assert_array_equal(chunked.ids, whole.ids)
    np.testing.assert_array_equal(chunked.ratings, whole.ratings)
    assert chunked.ids.dtype == np.int64 and chunked.ratings.dtype == np.float64
