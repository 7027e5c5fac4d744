"""Replicas sharing one database: the leader lease, fencing, and the log applied in order.

Each pipeline here stands for one replica process (its own ``REPLICA_ID``); they share
the database and the object store, as ``driftline serve`` replicas do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrain.lifecycle import JobAlreadyRunning
from service.settings import Settings
from service.store.events import NewEvent
from service.store.jobs import list_jobs
from service.store.leases import Claimant, NotLeaseHolder, claim_lease, read_lease, release_lease
from service.wiring import Driftline
from tests.support.pipelines import pipeline_factory, small_settings

ALICE = Claimant("alice", "one")
BOB = Claimant("bob", "one")


@pytest.fixture
def make_replica(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Driftline]]:
    def settings(replica_id: str, **overrides: Any) -> Settings:
        return small_settings(tmp_path / "data", database_url, replica_id=replica_id, **overrides)

    with pipeline_factory(settings) as make:
        yield make


def _events(n: int, seed: int, prefix: str) -> list[NewEvent]:
    rng = np.random.default_rng(seed)
    return [
        NewEvent(
            f"u{rng.integers(40)}",
            f"i{rng.integers(60)}",
            float(rng.integers(1, 6)),
            event_id=f"{prefix}-{j}",
        )
        for j in range(n)
    ]


def test_the_lease_has_one_holder_and_a_new_token_for_every_new_one(
    make_replica: Callable[..., Driftline],
) -> None:
    observer = make_replica("observer")
    db = observer.db
    with db.begin() as conn:
        release_lease(conn, observer.leadership.claimant)  # its own claim: let go
    with db.begin() as conn:
        first = claim_lease(conn, ALICE, 0.3)
    with db.begin() as conn:
        assert claim_lease(conn, BOB, 0.3).holder == "alice"  # held: bob waits
    with db.begin() as conn:
        assert claim_lease(conn, ALICE, 0.3).token == first.token  # renewed, same token
    time.sleep(0.5)
    with db.begin() as conn:
        taken = claim_lease(conn, BOB, 10)  # expired: bob takes over
    assert (taken.holder, taken.token) == ("bob", first.token + 1)
    with db.begin() as conn:
        assert claim_lease(conn, ALICE, 10).holder == "bob"
    restarted = Claimant("bob", "two")  # bob's process restarted: no wait for expiry
    with db.begin() as conn:
        again = claim_lease(conn, restarted, 10)
    assert (again.incarnation, again.token) == ("two", first.token + 2)
    with db.begin() as conn:
        release_lease(conn, restarted)
    with db.begin() as conn:
        assert claim_lease(conn, ALICE, 10).token == first.token + 3


def test_a_deposed_leaders_job_is_refused_by_the_database(
    make_replica: Callable[..., Driftline],
) -> None:
    leader = make_replica("a")
    follower = make_replica("b")
    assert leader.leadership.is_leader and not follower.leadership.is_leader
    leader.ingest(_events(300, 0, "e"))  # a bootstrap job runs (inline) and publishes
    with leader.db.begin() as conn:
        release_lease(conn, leader.leadership.claimant)  # as if its lease ran out
    assert follower.leadership.claim()
    # The old leader has not noticed yet: its start still carries the old token.
    with pytest.raises(NotLeaseHolder):
        leader.retrain_now()
    with leader.db.connect() as conn:
        tokens = [job["fencing_token"] for job in list_jobs(conn)]
    assert tokens == [1]  # the bootstrap job, under the first token; nothing more
    job_id = follower.retrain_now()
    with follower.db.connect() as conn:
        assert {j["id"]: j["fencing_token"] for j in list_jobs(conn)}[job_id] == 2
    # At its next renewal the old leader steps down, and its trigger asks no more.
    assert leader.leadership.claim() is False
    assert follower.trigger.leading() and not leader.trigger.leading()
    assert read_lease_holder(leader) == "b"


def test_one_job_at_a_time_in_the_whole_cluster(
    make_replica: Callable[..., Driftline],
) -> None:
    leader = make_replica("a", background=True, max_epochs=200, target_loss=1e-9)
    leader.ingest(_events(300, 1, "e"))
    deadline = time.monotonic() + 30
    while leader.retrainer.active_job_id is not None and time.monotonic() < deadline:
        time.sleep(0.05)  # the bootstrap job
    running = leader.retrain_now()
    with pytest.raises(JobAlreadyRunning) as refused:
        leader.retrain_now()
    assert refused.value.job_id == running


def test_replicas_apply_one_log_in_one_order_and_agree(
    make_replica: Callable[..., Driftline],
) -> None:
    # No jobs: each replica swaps versions in at its own moment, which moves their
    # states apart a little (the cluster test measures that); the log alone must not.
    a = make_replica("a", retrain_enabled=False)
    b = make_replica("b", retrain_enabled=False)
    batches = [_events(60, seed, f"s{seed}") for seed in range(10)]
    for j, batch in enumerate(batches):
        (a if j % 3 else b).ingest(batch)  # interleaved: each stores what it is sent
        assert (a if j % 3 else b).learner.applied == max(a.learner.applied, b.learner.applied)
    a.tail.look()
    b.tail.look()
    assert a.learner.applied == b.learner.applied > 0
    assert a.learner.labelled_seen == b.learner.labelled_seen == 600
    users = [f"u{j}" for j in range(40)]
    items = [f"i{j}" for j in range(60)]
    for user in users[:10]:
        assert a.recommender.recommend(user, 10).items == b.recommender.recommend(user, 10).items
    pairs = ([u for u in users for _ in items], [i for _ in users for i in items])
    np.testing.assert_allclose(
        a.learner.serving.predict(*pairs), b.learner.serving.predict(*pairs), rtol=0, atol=1e-12
    )


def read_lease_holder(replica: Driftline) -> str | None:
    with replica.db.connect() as conn:
        lease = read_lease(conn)
    return None if lease is None else lease.holder
