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
from fastapi.testclient import TestClient
from sqlalchemy import update

from retrain.lifecycle import JobAlreadyRunning
from service.api.routes import jobs as jobs_routes
from service.app import create_app
from service.settings import Settings
from service.store.events import NewEvent
from service.store.jobs import get_job, list_jobs
from service.store.leases import Claimant, NotLeaseHolder, claim_lease, read_lease, release_lease
from service.store.requests import add_request, answer_request, claim_unanswered, get_request
from service.store.tables import retrain_requests
from service.stream.requests import (
    ANSWER_WAIT_S,
    NO_ANSWER,
    RequestAnswer,
    answer_to,
    ask,
    give_up,
)
from service.wiring import Driftline
from tests.support.pipelines import replica_factory

ALICE = Claimant("alice", "one")
BOB = Claimant("bob", "one")


@pytest.fixture
def make_replica(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Driftline]]:
    with replica_factory(tmp_path / "data", database_url) as make:
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
    leader = make_replica("a", background=True, max_epochs=100, target_loss=1e-9)
    leader.ingest(_events(300, 1, "e"))
    # The bootstrap job (100 epochs, seconds) when it still runs, or one asked for by hand.
    running = leader.retrainer.active_job_id or leader.retrain_now()
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


# -- POST /retrain on any replica: requests through the database ---------------------------
def test_a_request_is_answered_once_and_claimed_oldest_first(
    make_replica: Callable[..., Driftline],
) -> None:
    db = make_replica("observer", retrain_enabled=False).db
    with db.begin() as conn:
        first = add_request(conn, "b")
        second = add_request(conn, "c", trigger="manual")
    with db.begin() as conn:
        assert [r["id"] for r in claim_unanswered(conn)] == [first, second]
        assert answer_request(conn, first, refusal="no", status=409)
        assert not answer_request(conn, first, job_id=None, refusal="again", status=503)
    with db.connect() as conn:
        row = get_request(conn, first)
        assert [r["id"] for r in claim_unanswered(conn)] == [second]
    assert row is not None and row["requested_by"] == "b" and row["trigger"] == "manual"
    assert (row["refusal"], row["status"], row["job_id"]) == ("no", 409, None)
    assert row["answered_at"] >= row["requested_at"] > 0
    assert RequestAnswer.of(row) == RequestAnswer(409, None, "no")


def test_the_leader_starts_the_job_a_follower_asked_for(
    make_replica: Callable[..., Driftline],
) -> None:
    leader = make_replica("a")
    follower = make_replica("b")
    assert leader.leadership.is_leader and not follower.leadership.is_leader
    leader.ingest(_events(300, 2, "e"))  # a bootstrap job runs (inline) and publishes
    request_id = ask(follower.db, "b")
    follower.follower.tick()  # a follower answers nothing
    assert answer_to(follower.db, request_id) is None
    leader.follower.tick()
    answer = answer_to(follower.db, request_id)
    assert answer is not None and answer.status == 202 and answer.refusal is None
    assert answer.job_id is not None
    with follower.db.connect() as conn:
        job = get_job(conn, answer.job_id)
    assert job is not None and job["trigger"] == "manual"
    assert job["fencing_token"] == leader.leadership.fencing_token()
    # Answered once: a late give-up gets the leader's answer back, and changes nothing.
    assert give_up(follower.db, request_id) == answer
    leader.follower.tick()
    with follower.db.connect() as conn:
        assert len(list_jobs(conn)) == 2  # the bootstrap job and the one asked for


def test_a_request_while_a_job_runs_is_refused_409_and_a_stale_one_503(
    make_replica: Callable[..., Driftline],
) -> None:
    leader = make_replica(
        "a", background=True, max_epochs=200, target_loss=1e-9, bootstrap_events=100_000
    )
    follower = make_replica("b")
    follower_asks_first = ask(follower.db, "b")
    leader.follower.tick()
    nothing = answer_to(follower.db, follower_asks_first)
    assert nothing is not None and nothing.status == 409  # nothing stored to train on
    leader.ingest(_events(300, 3, "e"))
    running = leader.retrain_now()
    request_id = ask(follower.db, "b")
    leader.follower.tick()
    refused = answer_to(follower.db, request_id)
    assert refused is not None and (refused.status, refused.job_id) == (409, None)
    assert refused.refusal is not None and str(running) in refused.refusal
    leader.retrainer.preempt("the test is over", force=True)
    leader.retrainer.wait(timeout=60)
    # A request its asker left long ago (its process stopped) starts nothing.
    stale = ask(follower.db, "b")
    with follower.db.begin() as conn:
        conn.execute(
            update(retrain_requests)
            .where(retrain_requests.c.id == stale)
            .values(requested_at=retrain_requests.c.requested_at - 2 * ANSWER_WAIT_S)
        )
    with follower.db.connect() as conn:
        jobs_before = len(list_jobs(conn))
    leader.follower.tick()
    assert answer_to(follower.db, stale) == RequestAnswer(503, None, NO_ANSWER)
    with follower.db.connect() as conn:
        assert len(list_jobs(conn)) == jobs_before


@pytest.fixture
def make_app(tmp_path: Path, database_url: str) -> Iterator[Callable[..., TestClient]]:
    """``make(replica_id, **overrides)``: a started service sharing the test's database
    and object store with the others made; all are stopped after the test."""
    started: list[TestClient] = []

    def make(replica_id: str, **overrides: Any) -> TestClient:
        values: dict[str, Any] = {
            "data_dir": tmp_path / "data",
            "database_url": database_url,
            "replica_id": replica_id,
            "bootstrap_events": 100_000,  # no job but those asked for
            "refresh_events": None,
            "factors": 8,
            "max_epochs": 200,
            "target_loss": 1e-9,
            "retrain_runtime": "thread",
            "retrain_configurator": "static",
        }
        client = TestClient(create_app(Settings(**{**values, **overrides})))
        client.__enter__()
        started.append(client)
        return client

    try:
        yield make
    finally:
        for client in reversed(started):
            client.app.state.driftline.retrainer.preempt("the test is over", force=True)
            client.__exit__(None, None, None)


def test_post_retrain_on_a_follower_gets_the_job_the_leader_started(
    make_app: Callable[..., TestClient],
) -> None:
    leader = make_app("a")
    follower = make_app("b")
    assert leader.app.state.driftline.leadership.is_leader
    assert not follower.app.state.driftline.leadership.is_leader
    events = [
        {"user_id": e.user_id, "item_id": e.item_id, "rating": e.rating, "event_id": e.event_id}
        for e in _events(300, 4, "e")
    ]
    assert follower.post("/ingest", json={"events": events}).status_code == 200
    asked = time.monotonic()
    started = follower.post("/retrain")
    assert started.status_code == 202, started.text
    assert time.monotonic() - asked < 2.0  # the leader's follower ticks every 0.2 s
    job_id = started.json()["job_id"]
    assert started.json()["status"] == "started"
    assert leader.app.state.driftline.retrainer.active_job_id == job_id  # the leader runs it
    assert follower.app.state.driftline.retrainer.active_job_id is None
    assert leader.get(f"/jobs/{job_id}").json()["trigger"] == "manual"
    refused = follower.post("/retrain")  # while that job runs
    assert refused.status_code == 409, refused.text
    assert str(job_id) in refused.json()["detail"]
    assert leader.post("/retrain").status_code == 409  # the leader refuses it directly


def test_post_retrain_answers_503_when_no_leader_answers(
    make_app: Callable[..., TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    lonely = make_app("b")
    db = lonely.app.state.driftline.db
    with db.begin() as conn:
        release_lease(conn, lonely.app.state.driftline.leadership.claimant)
    with db.begin() as conn:
        claim_lease(conn, Claimant("gone", "one"), 600)  # a leader that answers nothing
    assert not lonely.app.state.driftline.leadership.claim()
    monkeypatch.setattr(jobs_routes, "ANSWER_WAIT_S", 0.3)
    answer = lonely.post("/retrain")
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    assert answer.json()["detail"] == NO_ANSWER
    with db.connect() as conn:
        assert claim_unanswered(conn) == []  # given up: no later leader starts it
        assert list_jobs(conn) == []
