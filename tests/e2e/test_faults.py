"""Faults under a real ``driftline serve`` process: a lost database and a ``kill -9``.

Whatever happens, a batch answered 200 is stored exactly once, a batch answered anything
else is stored entirely or not at all, and the service comes back without help.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from benchmarks.launcher import ServerProcess
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

BATCH = 50
QUIET = {  # no retraining: these tests are about storage, and training would only slow them
    "DRIFTLINE_RETRAIN_ENABLED": "false",
    "DRIFTLINE_HEARTBEAT_EVENTS": "100",
}


def _batch(prefix: str) -> list[dict]:
    return [
        {
            "event_id": f"{prefix}-{k}",
            "user_id": f"u{k % 13}",
            "item_id": f"i{k % 17}",
            "rating": 0.5 + k % 10 * 0.5,
        }
        for k in range(BATCH)
    ]


def _stored_ids(database_url: str) -> list[str]:
    """Every stored event id, read straight from the database."""
    engine = create_engine(database_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return list(conn.scalars(text("SELECT event_id FROM events")))
    finally:
        engine.dispose()


def _events_stored(http: httpx.Client) -> int:
    response = http.get("/healthz")
    assert response.status_code == 200, response.text
    return int(response.json()["events_stored"])


# -- the database goes away and comes back -----------------------------------------


def test_a_lost_database_is_a_503_stores_nothing_and_recovers_by_itself(
    tmp_path: Path, postgresql_url: str
) -> None:
    direct = make_url(postgresql_url)
    acknowledged: list[list[dict]] = []
    with TcpProxy(direct.port or 5432, direct.host or "127.0.0.1") as proxy:
        through_proxy = direct.set(host="127.0.0.1", port=proxy.port)
        env = {**QUIET, "DRIFTLINE_DATABASE_URL": through_proxy.render_as_string(False)}
        server = ServerProcess(tmp_path / "data", env=env).start()
        try:
            with httpx.Client(base_url=server.url, timeout=30) as http:
                first = _batch("before")
                answer = http.post("/ingest", json={"events": first})
                assert answer.json()["accepted"] == BATCH and answer.json()["duplicates"] == 0
                acknowledged.append(first)

                proxy.cut()
                for attempt in range(3):  # the broken pooled connection, then refusals
                    refused = http.post("/ingest", json={"events": _batch(f"down{attempt}")})
                    assert refused.status_code == 503, refused.text
                    assert "database is unreachable" in refused.json()["detail"]
                health = http.get("/healthz")
                assert health.status_code == 503, health.text
                assert health.json()["database"].startswith("unreachable")
                assert proxy.refused > 0
                assert len(_stored_ids(postgresql_url)) == BATCH  # nothing half-written

                proxy.restore()
                deadline = time.monotonic() + 10
                for attempt in itertools.count():
                    batch = _batch(f"after{attempt}")
                    answer = http.post("/ingest", json={"events": batch})
                    if answer.status_code == 200:
                        assert (
                            answer.json()["accepted"] == BATCH and answer.json()["duplicates"] == 0
                        )
                        acknowledged.append(batch)
                        break
                    assert answer.status_code == 503, answer.text
                    assert time.monotonic() < deadline, "ingestion did not recover in 10 s"
                    time.sleep(0.2)
                more = _batch("later")
                assert http.post("/ingest", json={"events": more}).status_code == 200
                acknowledged.append(more)

                assert http.get("/healthz").status_code == 200
                assert _events_stored(http) == BATCH * len(acknowledged)
                recommended = http.get("/recommend", params={"user_id": "u1", "k": 3})
                assert recommended.status_code == 200
        finally:
            server.stop()
    expected = sorted(e["event_id"] for batch in acknowledged for e in batch)
    assert sorted(_stored_ids(postgresql_url)) == expected


# -- kill -9 in the middle of ingestion ------------------------------------------------

CLIENTS = 4
KILL_AFTER = 40  # acknowledged batches before the kill


class _Clients:
    """Client threads posting fresh batches until the server stops answering."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acknowledged: list[list[dict]] = []
        self.unanswered: list[list[dict]] = []  # in flight or refused when the server died
        self.unexpected: list[str] = []
        self.enough = threading.Event()
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._post, args=(n,), daemon=True) for n in range(CLIENTS)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in self.threads)

    def _post(self, worker: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            for n in itertools.count():
                batch = _batch(f"c{worker}-b{n}")
                try:
                    answer = http.post("/ingest", json={"events": batch})
                except httpx.HTTPError:
                    with self._lock:
                        self.unanswered.append(batch)
                    return
                with self._lock:
                    if answer.status_code != 200 or answer.json()["accepted"] != BATCH:
                        self.unexpected.append(f"{answer.status_code} {answer.text}")
                        return
                    self.acknowledged.append(batch)
                    if len(self.acknowledged) >= KILL_AFTER:
                        self.enough.set()


def test_kill_9_during_ingestion_keeps_every_acknowledged_batch_exactly_once(
    tmp_path: Path, database_url: str
) -> None:
    env = {**QUIET, "DRIFTLINE_DATABASE_URL": database_url}
    server = ServerProcess(tmp_path / "data", env=env).start()
    clients = _Clients(server.url)
    try:
        clients.start()
        assert clients.enough.wait(timeout=120), clients.unexpected
        server.stop(kill=True)  # SIGKILL: no shutdown hook runs
        clients.join()
    finally:
        server.stop(kill=True)
    assert clients.unexpected == []
    assert len(clients.unanswered) == CLIENTS  # every client was cut off by the kill
    acknowledged = [e for batch in clients.acknowledged for e in batch]

    with (
        ServerProcess(tmp_path / "data", env=env) as restarted,
        httpx.Client(base_url=restarted.url, timeout=60) as http,
    ):
        stored = _events_stored(http)
        assert len(acknowledged) <= stored <= len(acknowledged) + CLIENTS * BATCH
        # Every acknowledged event is there: sent again, each is a duplicate.
        for start in range(0, len(acknowledged), 5000):
            chunk = acknowledged[start : start + 5000]
            again = http.post("/ingest", json={"events": chunk}).json()
            assert (again["accepted"], again["duplicates"]) == (0, len(chunk))
        # A batch cut off by the kill was stored entirely or not at all.
        for batch in clients.unanswered:
            again = http.post("/ingest", json={"events": batch}).json()
            assert again["accepted"] in (0, BATCH), again
            assert again["accepted"] + again["duplicates"] == BATCH
        total = len(acknowledged) + CLIENTS * BATCH
        assert _events_stored(http) == total
    ids = _stored_ids(database_url)
    assert len(ids) == len(set(ids)) == total
