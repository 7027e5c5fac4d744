"""Snapshots of the online state: a bit-for-bit round trip, a restart that replays only
the log after one, retention, and a fallback when one cannot be used."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import update

from functions.artifacts import sha256_hex
from service.serving.history import RatedItems
from service.serving.popular import PopularItems
from service.serving.rows import LruRows
from service.store.events import NewEvent
from service.store.tables import online_snapshots
from service.stream.snapshot import (
    SNAPSHOTS_PREFIX,
    SnapshotError,
    capture,
    from_bytes,
    to_bytes,
)
from service.wiring import Driftline
from tests.support.pipelines import replica_factory

USERS = [f"u{n}" for n in range(40)]
ITEMS = [f"i{n}" for n in range(60)]


@pytest.fixture
def make_replica(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Driftline]]:
    with replica_factory(tmp_path / "data", database_url, snapshot_every_events=None) as make:
        yield make


def _events(n: int, seed: int, prefix: str) -> list[NewEvent]:
    rng = np.random.default_rng(seed)
    return [
        NewEvent(
            USERS[rng.integers(len(USERS))],
            ITEMS[rng.integers(len(ITEMS))],
            float(rng.integers(1, 6)) if rng.random() < 0.9 else None,
            event_id=f"{prefix}-{j}",
        )
        for j in range(n)
    ]


def _ingest(pipeline: Driftline, events: list[NewEvent], batch: int = 37) -> None:
    for start in range(0, len(events), batch):
        pipeline.ingest(events[start : start + batch])


def _served(replica: Driftline) -> dict[str, Any]:
    """Everything a replica answers with: predictions, top-10 lists, rated and popular
    items, and the arrays behind them."""
    learner = replica.learner
    serving, view = learner.serving, learner.serving.view
    users = [u for u in USERS for _ in ITEMS] + ["stranger"]
    items = ITEMS * len(USERS) + ["i0"]
    return {
        "version": view.version,
        "predictions": serving.predict(users, items).tolist(),
        "recommendations": [replica.recommender.recommend(user, 10) for user in USERS],
        "item_bias": view.item_bias.tolist(),
        "vectors": {user: vector.tolist() for user, vector in view.user_vectors.items()},
        "history": {user: sorted(learner.history.items(user)) for user in USERS},
        "popular": learner.popular.ranking,
        "labelled_seen": learner.labelled_seen,
        "applied": learner.applied,
    }


def _bootstrapped(make_replica: Callable[..., Driftline], name: str = "a") -> Driftline:
    """A replica serving its bootstrap version, with some of the log learnt after it."""
    replica = make_replica(name)
    _ingest(replica, _events(400, 1, "boot"))
    assert replica.learner.current is not None
    replica.trigger.enabled = False  # one version throughout
    return replica


def test_rows_round_trip_and_continue_alike() -> None:
    rows = LruRows({"total": (2,)}, limit=3)
    rows.rows_for(["a", "b", "c", "d"])
    rows["total"][:] = np.arange(rows.capacity * 2.0).reshape(-1, 2)
    rows.evict()
    copy = LruRows({"total": (2,)}, limit=3)
    copy.load_state(rows.export_state("x_"), "x_")
    assert copy.index == rows.index and copy.by_recency() == rows.by_recency()
    assert np.array_equal(copy["total"], rows["total"])
    assert copy.rows_for(["e", "b"]).tolist() == rows.rows_for(["e", "b"]).tolist()
    assert copy.evict() == rows.evict()
    with pytest.raises(ValueError):
        broken = rows.export_state("x_")
        broken["x_free"] = broken["x_free"][:-1]
        copy.load_state(broken, "x_")


def test_history_and_popular_round_trip() -> None:
    history, popular = RatedItems(max_pairs=50), PopularItems(window=30)
    events = _events(200, 3, "h")
    history.add([e.user_id for e in events], [e.item_id for e in events])
    popular.add([e.user_id for e in events], [e.item_id for e in events])
    history_copy, popular_copy = RatedItems(max_pairs=50), PopularItems(window=30)
    history_copy.load_state(history.export_state())
    popular_copy.load_state(popular.export_state())
    assert history_copy.users() == history.users() and history_copy.pairs == history.pairs
    assert dict(history_copy.snapshot) == dict(history.snapshot)
    assert popular_copy.ranking == popular.ranking
    more = _events(50, 4, "m")
    for target in (history, history_copy):
        target.add([e.user_id for e in more], [e.item_id for e in more])
    for ranked in (popular, popular_copy):
        ranked.add([e.user_id for e in more], [e.item_id for e in more])
    assert dict(history_copy.snapshot) == dict(history.snapshot)
    assert popular_copy.ranking == popular.ranking


def test_a_snapshot_round_trip_predicts_and_learns_bit_for_bit(
    make_replica: Callable[..., Driftline],
) -> None:
    replica = _bootstrapped(make_replica)
    learner = replica.learner
    snapshot = capture(learner)
    assert snapshot is not None and snapshot.position == learner.applied
    data = to_bytes(snapshot)
    loaded = from_bytes(data, sha256_hex(data))
    assert learner.current is not None
    original = learner.serving
    copy = replica.swapper.builder._model(learner.current)
    copy.load_state(loaded.serving, loaded.serving_scalars)
    users = [u for u in USERS for _ in ITEMS]
    items = ITEMS * len(USERS)

    def answers(model: Any) -> list[Any]:
        return [model.recommend(user, 10, learner.history.items(user)) for user in USERS]

    assert np.array_equal(copy.predict(users, items), original.predict(users, items))
    assert answers(copy) == answers(original)
    more = [e for e in _events(300, 5, "more") if e.rating is not None]
    batch = ([e.user_id for e in more], [e.item_id for e in more])
    ratings = np.array([e.rating for e in more])
    with learner.lock:
        learnt = original.predict_then_learn(*batch, ratings)
    assert np.array_equal(copy.predict_then_learn(*batch, ratings), learnt)
    assert np.array_equal(copy.predict(users, items), original.predict(users, items))
    assert np.array_equal(copy.view.item_bias, original.view.item_bias)
    assert answers(copy) == answers(original)
    with pytest.raises(SnapshotError):
        from_bytes(data, "0" * 64)
    with pytest.raises(SnapshotError):
        from_bytes(data[:200], sha256_hex(data[:200]))


def test_a_restart_replays_only_the_log_after_the_snapshot_and_answers_alike(
    make_replica: Callable[..., Driftline], caplog: pytest.LogCaptureFixture
) -> None:
    leader = _bootstrapped(make_replica)
    row = leader.snapshots.write()
    assert row is not None and row["position"] == leader.learner.applied
    after = _events(150, 6, "after")
    _ingest(leader, after)
    with caplog.at_level(logging.INFO, logger="service.stream.snapshot"):
        restarted = make_replica("b", retrain_enabled=False)
    assert restarted.reads.cluster_status()["replayed_at_start"] == len(after)
    assert f"restored online state at position {row['position']}" in caplog.text
    assert _served(restarted) == _served(leader)
    later = _events(120, 7, "later")
    _ingest(restarted, later, batch=23)
    leader.catch_up()
    assert _served(restarted) == _served(leader)
    assert len(leader.registry.versions()) == 1


def test_the_leader_writes_every_n_events_and_keeps_the_newest(
    make_replica: Callable[..., Driftline],
) -> None:
    leader = _bootstrapped(make_replica)
    writer = leader.snapshots
    assert writer is not None
    writer.every, writer.retention = 50, 2
    assert leader.leadership.is_leader
    written = []
    for round_ in range(4):
        _ingest(leader, _events(60, 10 + round_, f"r{round_}"))
        row = writer.tick()
        assert row is not None
        written.append(row)
        assert writer.tick() is None  # not due again until 50 more events
    kept = writer.snapshots.rows()
    assert [r["key"] for r in kept] == [r["key"] for r in written[::-1][:2]]
    assert sorted(leader.registry.store.list(SNAPSHOTS_PREFIX)) == sorted(r["key"] for r in kept)
    follower = make_replica("b", retrain_enabled=False)
    follower.snapshots.every = 1
    assert not follower.leadership.is_leader and follower.snapshots.tick() is None


def test_an_unusable_snapshot_falls_back_to_the_replay(
    make_replica: Callable[..., Driftline], caplog: pytest.LogCaptureFixture
) -> None:
    leader = _bootstrapped(make_replica)
    row = leader.snapshots.write()
    assert row is not None
    _ingest(leader, _events(80, 8, "after"))
    head = leader.learner.applied
    replayed = head - max(0, leader.learner.current.last_event_id - 50_000)
    leader.registry.store.put(row["key"], b"not a snapshot")
    with caplog.at_level(logging.WARNING, logger="service.stream.snapshot"):
        corrupt = make_replica("b", retrain_enabled=False)
    assert "not restoring from snapshot" in caplog.text
    assert corrupt.reads.cluster_status()["replayed_at_start"] == replayed
    assert corrupt.learner.applied == head and corrupt.learner.current is not None
    assert corrupt.recommender.recommend(USERS[0], 10).items
    leader.registry.store.delete(row["key"])
    missing = make_replica("c", retrain_enabled=False)
    assert missing.reads.cluster_status()["replayed_at_start"] == replayed
    with leader.db.begin() as conn:  # a snapshot of another version is not used
        conn.execute(update(online_snapshots).values(version="v9999"))
    leader.snapshots.write()
    with leader.db.begin() as conn:
        conn.execute(update(online_snapshots).values(version="v9999"))
    other = make_replica("d", retrain_enabled=False)
    assert other.reads.cluster_status()["replayed_at_start"] == replayed
