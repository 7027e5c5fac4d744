"""Three ``driftline serve`` replicas behind HAProxy, sharing PostgreSQL, S3 and Kafka
(``benchmarks.cluster.LocalCluster``), through crashes and a rolling restart.

A stream with a planted drift goes half through Kafka and half through ``POST /ingest``
at the load balancer while the leader and then a follower are killed with SIGKILL and
started again. Every event must be stored once, the drift must raise one alert (none
before it), retraining jobs must never overlap and all carry a fencing token, and a new
leader must take over within the lease. Then: a new user's ratings reach every replica
within a second, the replicas' top-10 lists agree once the log has drained, and a
rolling restart under load costs no request an error.

The tests share one cluster and run in order.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from itertools import combinations
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from benchmarks.cluster import ClusterConfig, LocalCluster, haproxy_available
from service.serving.timeline import target
from service.store.rollbacks import list_rollbacks
from service.store.rollouts import list_rollouts
from service.store.versions import list_versions
from tests.support.databases import external_url, not_configured_reason
from tests.support.kafka import produce
from tests.support.synthetic import planted_drift_stream

pytestmark = pytest.mark.slow

N_EVENTS = 14_000
DRIFT_AT = 8_000
#: Events per HTTP batch and per Kafka send; the chunks alternate between the two.
CHUNK = 250
#: Where in the stream the leader, then a follower, is killed (before the drift).
KILL_LEADER_AT = 3_000
KILL_FOLLOWER_AT = 5_500
LEASE_S = 3.0
#: The users the stream rated, for the top-10 comparison.
RETURNING_USERS = [f"u{n}" for n in range(0, 200, 4)]


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base = external_url()
    if base is None:
        pytest.skip(not_configured_reason())
    if not haproxy_available():
        pytest.skip("the cluster tests need HAProxy (Debian package haproxy) on the PATH")
    pytest.importorskip("moto.server", reason="the cluster's S3 is moto's server (test extra)")
    work_dir: Path = tmp_path_factory.mktemp("cluster")
    config = ClusterConfig(database_url=base, work_dir=work_dir, leader_lease_s=LEASE_S)
    with LocalCluster(config) as started:
        yield started


def _sql(cluster: LocalCluster, query: str) -> list[tuple]:
    engine = create_engine(cluster.database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(query))]
    finally:
        engine.dispose()


def _post(client: httpx.Client, events: list[dict]) -> tuple[dict, int]:
    """POST a batch, trying again on an error (event ids make a retry harmless);
    returns the answer and how many tries failed."""
    last: object = None
    for failures in range(20):
        try:
            response = client.post("/ingest", json={"events": events})
            if response.status_code == 200:
                return response.json(), failures
            last = (response.status_code, response.text[:200])
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)
    raise AssertionError(f"POST /ingest failed 20 times; last: {last!r}")


def _serving_target(cluster: LocalCluster) -> str | None:
    """The version the registry says serves: the newest published or promoted one,
    unless a rollback came after it (a version the rollout guard runs in shadow or
    holds is not served, and with the stream over it may stay so)."""
    engine = create_engine(cluster.database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            change = target(list_versions(conn), list_rollbacks(conn), list_rollouts(conn))
    finally:
        engine.dispose()
    return None if change is None else change.version


def _idle(cluster: LocalCluster) -> bool:
    """No job queued or running, and the version the registry says serves served by
    every live replica."""
    if _sql(cluster, "SELECT id FROM retrain_jobs WHERE status IN ('queued', 'running')"):
        return False
    serving = _serving_target(cluster)
    if serving is None:
        return True
    versions = {
        (cluster.health(i) or {}).get("model_version")
        for i in range(len(cluster.replicas))
        if cluster.alive(i)
    }
    return versions == {serving}


class _Failover:
    """Kills a replica with SIGKILL, measures how long the cluster has no leader (when
    it was the leader), and starts it again; on a thread, so the stream goes on."""

    def __init__(self, cluster: LocalCluster, victim: int) -> None:
        self.cluster = cluster
        self.victim = victim
        self.was_leader = cluster.leader() == victim
        self.leaderless_s: float | None = None
        self.error: BaseException | None = None
        cluster.kill(victim)
        self.killed_at = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            if self.was_leader:
                self.cluster.wait_leader(timeout=LEASE_S + 30, exclude=self.victim)
                self.leaderless_s = time.monotonic() - self.killed_at
            self.cluster.start(self.victim)
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self) -> None:
        self.thread.join(timeout=180)
        if self.error is not None:
            raise self.error


def test_crashes_mid_stream_lose_nothing_and_alert_once(cluster: LocalCluster) -> None:
    stream = planted_drift_stream(n_events=N_EVENTS, drift_at=DRIFT_AT, seed=5)
    began = time.monotonic()
    failed_posts = 0
    failovers: list[_Failover] = []
    with httpx.Client(base_url=cluster.lb_url, timeout=30) as client:
        for n, start in enumerate(range(0, N_EVENTS, CHUNK)):
            chunk = stream[start : start + CHUNK]
            if n % 2 == 0:
                produce(cluster.bootstrap, cluster.topic, chunk, key=None)
            else:
                answer, failures = _post(client, chunk)
                failed_posts += failures
                assert answer["accepted"] + answer["duplicates"] == len(chunk)
            if start == 1_000:
                # The bootstrap model serves before anything is killed.
                _wait_for(lambda: bool(_sql(cluster, "SELECT id FROM retrain_jobs")), 60, "a job")
                _wait_for(lambda: _idle(cluster), 90, "the bootstrap model to serve")
            if start == KILL_LEADER_AT:
                leader = cluster.wait_leader()
                failovers.append(_Failover(cluster, leader))
            if start == KILL_FOLLOWER_AT:
                leader = cluster.wait_leader(LEASE_S + 30, exclude=failovers[0].victim)
                followers = [i for i in range(3) if cluster.alive(i) and i != leader]
                failovers.append(_Failover(cluster, followers[0]))
    for failover in failovers:
        failover.join()
    streamed = time.monotonic() - began

    def stored() -> int:
        return int(_sql(cluster, "SELECT count(*) FROM events")[0][0])

    _wait_for(lambda: stored() >= N_EVENTS, 120, "every event to be stored")
    time.sleep(1.0)  # anything stored twice would show up now
    _wait_for(lambda: _idle(cluster), 120, "the last retraining job to finish and serve")
    drained = cluster.wait_drained()

    rows = _sql(cluster, "SELECT count(*), count(DISTINCT event_id) FROM events")
    ids = {row[0] for row in _sql(cluster, "SELECT event_id FROM events")}
    assert rows == [(N_EVENTS, N_EVENTS)], rows
    assert ids == {e["event_id"] for e in stream}

    # The log's order is not the stream's: a dead replica's Kafka partitions wait for
    # the group to hand them on while HTTP batches go on, so drifted events can enter
    # the log before earlier ones. The alert must come after drifted events did.
    alerts = _sql(cluster, "SELECT id, events_seen, change_events FROM drift_alerts ORDER BY id")
    assert len(alerts) == 1, alerts
    index = {e["event_id"]: n for n, e in enumerate(stream)}
    log_order = [index[row[0]] for row in _sql(cluster, "SELECT event_id FROM events ORDER BY id")]
    drifted_before_alert = sum(n >= DRIFT_AT for n in log_order[: alerts[0][1]])
    assert drifted_before_alert >= 100, (alerts, drifted_before_alert)

    jobs = _sql(
        cluster,
        "SELECT id, trigger, status, started_at, finished_at, fencing_token "
        "FROM retrain_jobs ORDER BY id",
    )
    assert jobs and all(job[5] is not None for job in jobs), jobs
    ran = sorted((job[3], job[4], job[0]) for job in jobs if job[3] is not None)
    for (_, finished, first), (started, _, second) in zip(ran, ran[1:], strict=False):
        assert finished is not None and finished <= started, (first, second, jobs)
    assert any(job[1] == "drift" and job[2] == "succeeded" for job in jobs), jobs

    leaderless = [f.leaderless_s for f in failovers if f.was_leader]
    assert leaderless and leaderless[0] is not None
    assert leaderless[0] < LEASE_S + 3, leaderless
    assert len(cluster.leaders()) == 1
    print(
        f"\ncluster stream: {N_EVENTS} events in {streamed:.1f}s, drained to {drained}; "
        f"POST retries {failed_posts}; alert at log event {alerts[0][1]} with "
        f"{drifted_before_alert} drifted events before it (drift at stream event {DRIFT_AT}); "
        f"jobs {[(j[0], j[1], j[2], j[5]) for j in jobs]}; "
        f"no leader for {leaderless[0]:.2f}s after the leader's kill (lease {LEASE_S}s)"
    )


def test_a_new_user_s_ratings_reach_every_replica_within_a_second(
    cluster: LocalCluster,
) -> None:
    cluster.wait_healthy()
    user = "fresh-user"
    events = [
        {"event_id": f"fresh-{n}", "user_id": user, "item_id": f"i{n}", "rating": 5.0}
        for n in range(10)
    ]
    answer = httpx.post(f"{cluster.replica_urls[0]}/ingest", json={"events": events}).json()
    written = time.monotonic()
    position = answer["position"]
    assert answer["accepted"] == len(events)
    seen_after: dict[int, float] = {}
    waits = {}
    with httpx.Client(timeout=10) as client:
        pending = {1, 2}
        while pending and time.monotonic() - written < 2.0:
            for i in sorted(pending):
                response = client.get(
                    f"{cluster.replica_urls[i]}/recommend", params={"user_id": user}
                )
                if int(response.headers["X-Driftline-Position"]) >= position:
                    seen_after[i] = time.monotonic() - written
                    pending.discard(i)
            time.sleep(0.01)
        for i in (1, 2):
            began = time.monotonic()
            response = client.get(
                f"{cluster.replica_urls[i]}/recommend",
                params={"user_id": user, "after": position},
            )
            waits[i] = time.monotonic() - began
            assert response.status_code == 200
            assert int(response.headers["X-Driftline-Position"]) >= position
            body = response.json()
            assert body["source"] == "model", body
            assert not {item["item_id"] for item in body["items"]} & {e["item_id"] for e in events}
    assert set(seen_after) == {1, 2}, seen_after
    assert max(seen_after.values()) < 1.0, seen_after
    print(f"\nfreshness: applied on the other replicas after {seen_after} s; ?after= {waits}")


def _top10(url: str, user: str) -> list[str]:
    response = httpx.get(f"{url}/recommend", params={"user_id": user, "k": 10}, timeout=10)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["source"] == "model", body  # a returning user: personalised
    return [item["item_id"] for item in body["items"]]


def test_replicas_agree_on_returning_users_top_10(cluster: LocalCluster) -> None:
    _wait_for(lambda: _idle(cluster), 120, "the replicas to serve one version")
    cluster.wait_drained()
    overlaps = []
    for user in RETURNING_USERS:
        lists = [_top10(url, user) for url in cluster.replica_urls]
        for a, b in combinations(lists, 2):
            overlaps.append(len(set(a) & set(b)) / max(len(a), 1))
    mean = sum(overlaps) / len(overlaps)
    print(f"\ntop-10 overlap between replicas: mean {mean:.3f}, min {min(overlaps):.2f}")
    assert mean >= 0.9, (mean, Counter(round(o, 1) for o in overlaps))


def test_a_rolling_restart_under_load_answers_every_request(cluster: LocalCluster) -> None:
    cluster.wait_healthy()
    codes: Counter[int | str] = Counter()
    counting = threading.Lock()
    stop = threading.Event()

    def hammer() -> None:
        rng = random.Random(0)
        with httpx.Client(base_url=cluster.lb_url, timeout=30) as client:
            while not stop.is_set():
                user = f"u{rng.randrange(200)}"
                try:
                    code: int | str = client.get("/recommend", params={"user_id": user}).status_code
                except httpx.HTTPError as exc:
                    code = type(exc).__name__
                with counting:
                    codes[code] += 1

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    began = time.monotonic()
    try:
        out_of_service = cluster.rolling_restart()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    took = time.monotonic() - began
    errors = {code: n for code, n in codes.items() if not (isinstance(code, int) and code < 300)}
    print(
        f"\nrolling restart in {took:.1f}s (per replica {[round(s, 1) for s in out_of_service]}): "
        f"{sum(codes.values())} requests, non-2xx {errors}"
    )
    assert codes and not errors, codes
