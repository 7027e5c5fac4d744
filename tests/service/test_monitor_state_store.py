"""The monitor's snapshot row: updated in place, read back as saved, on both databases."""

from __future__ import annotations

import numpy as np

from service.store import Database
from service.store.monitor import load_monitor_state, save_monitor_state
from service.store.tables import monitor_state


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
