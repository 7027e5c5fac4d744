"""The monitor's snapshot row and its record of errors, on both databases."""

from __future__ import annotations

import numpy as np
from sqlalchemy import select

from service.store import Database
from service.store.monitor import (
    load_monitor_state,
    load_record_errors,
    save_monitor_state,
    save_record_errors,
)
from service.store.tables import monitor_errors, monitor_state


def test_the_snapshot_is_replaced_in_place_and_read_back_as_saved(database_url: str) -> None:
    db = Database(database_url)
    replica = 91
    try:
        first = {"monitor": {"errors": "AAAA", "level": 0.25, "candidate": None}}
        newer = {"monitor": {"errors": "BBBB" * 1000, "partial": [0.5, 1e-300]}, "n": 2**40}
        numpy_scalar = {"aggregator": {"pending_sum": np.float64(1.5)}}
        for state, version in ((first, "v1"), (newer, "v2"), (numpy_scalar, "v3")):
            with db.begin() as conn:
                save_monitor_state(conn, replica, version, state)
            with db.connect() as conn:
                saved = load_monitor_state(conn, replica)
            assert saved == {"model_version": version, "state": state}
        with db.connect() as conn:
            assert load_monitor_state(conn, replica + 1) is None
    finally:
        with db.begin() as conn:
            conn.execute(monitor_state.delete().where(monitor_state.c.replica == replica))
        db.dispose()


def _errors(start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    numbers = np.arange(start, stop)
    return (numbers % 100 / 100).astype(np.float16), (numbers % 7).astype(np.uint16)


def _rows(db: Database, replica: int) -> list[tuple[int, int, int]]:
    with db.connect() as conn:
        query = (
            select(monitor_errors.c.epoch, monitor_errors.c.start, monitor_errors.c.stop)
            .where(monitor_errors.c.replica == replica)
            .order_by(monitor_errors.c.start)
        )
        return [tuple(row) for row in conn.execute(query)]


def test_a_record_saved_as_it_grows_reads_back_any_held_span_and_no_gap(
    database_url: str,
) -> None:
    db = Database(database_url)
    replica, epoch = 92, 2**51 + 3
    try:
        for start, stop in ((0, 500), (500, 1_000), (1_000, 1_200)):
            with db.begin() as conn:
                save_record_errors(conn, replica, epoch, start, *_errors(start, stop), held_from=0)
        with db.connect() as conn:
            for start, stop in ((0, 1_200), (250, 1_100), (700, 700)):
                values, keys = load_record_errors(conn, replica, epoch, start, stop)
                expected_values, expected_keys = _errors(start, stop)
                np.testing.assert_array_equal(values, expected_values)
                np.testing.assert_array_equal(keys, expected_keys)
            assert load_record_errors(conn, replica, epoch, 0, 1_300) is None  # not saved
            assert load_record_errors(conn, replica, epoch + 1, 0, 500) is None
        with db.begin() as conn:  # the record now holds from 1,100: the first two rows go
            save_record_errors(conn, replica, epoch, 1_200, *_errors(1_200, 1_300), held_from=1_100)
        assert _rows(db, replica) == [(epoch, 1_000, 1_200), (epoch, 1_200, 1_300)]
        with db.begin() as conn:  # a gap: errors 1,300..1,400 never written
            save_record_errors(conn, replica, epoch, 1_400, *_errors(1_400, 1_500), held_from=1_100)
        with db.connect() as conn:
            assert load_record_errors(conn, replica, epoch, 1_100, 1_500) is None
        with db.begin() as conn:  # a new epoch, written whole, replaces every row
            save_record_errors(
                conn, replica, epoch + 1, 0, *_errors(0, 50), held_from=0, whole=True
            )
        assert _rows(db, replica) == [(epoch + 1, 0, 50)]
    finally:
        with db.begin() as conn:
            conn.execute(monitor_errors.delete().where(monitor_errors.c.replica == replica))
        db.dispose()
