"""The dashboard's live feed on a real ``driftline serve`` on loopback.

Events ingested while a browser-like client holds ``GET /dashboard/events`` open come
back as heartbeat events with increasing ids; a reconnect with ``Last-Event-ID`` gets
exactly what followed, nothing twice; without a key the stream is refused once keys
exist; and a server told to stop with a stream open exits promptly.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from benchmarks.launcher import ServerProcess
from service.auth.keys import create_key
from service.settings import Settings
from service.store import Database

pytestmark = pytest.mark.slow

HEARTBEAT_EVENTS = 20


def _events(start: int, stop: int) -> list[dict]:
    return [
        {"event_id": f"e{i}", "user_id": f"u{i % 13}", "item_id": f"i{i % 17}", "rating": 1 + i % 5}
        for i in range(start, stop)
    ]


def _messages(answer: httpx.Response) -> Iterator[dict]:
    """The server-sent events of a streamed answer, each as {id, event, data}; pings
    (comment lines) are skipped."""
    fields: dict = {}
    for line in answer.iter_lines():
        if not line:
            if fields:
                yield fields
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            fields["data"] = orjson.loads(value)
        elif name == "id":
            fields["id"] = int(value)
        else:
            fields[name] = value


def _take(answer: httpx.Response, kind: str, count: int) -> list[dict]:
    """The next ``count`` events of ``kind`` (others in between are kept too)."""
    taken: list[dict] = []
    for message in _messages(answer):
        taken.append(message)
        if sum(m.get("event") == kind for m in taken) == count:
            return taken
    raise AssertionError(f"the stream ended after {taken}")


def test_heartbeats_stream_live_resume_after_last_event_id_and_need_a_key(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    db = Database(Settings(data_dir=data_dir).resolved_database_url)
    reader = create_key(db, "reader", ["read"]).token
    feeder = create_key(db, "feeder", ["ingest"]).token
    db.dispose()
    env = {
        "DRIFTLINE_HEARTBEAT_EVENTS": str(HEARTBEAT_EVENTS),
        "DRIFTLINE_RETRAIN_ENABLED": "false",
    }
    read = {"Authorization": f"Bearer {reader}"}
    server = ServerProcess(data_dir, env=env).start()
    try:
        feed = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {feeder}"}, timeout=30
        )
        timeout = httpx.Timeout(30, read=10)
        with httpx.Client(base_url=server.url, timeout=timeout) as browser:
            refused = browser.get("/dashboard/events")
            assert refused.status_code == 401

            # A first connection starts at the newest event: only what follows comes.
            with browser.stream("GET", "/dashboard/events", headers=read) as live:
                assert live.status_code == 200
                assert live.headers["content-type"].startswith("text/event-stream")
                assert feed.post("/ingest", json={"events": _events(0, 100)}).status_code == 200
                first = _take(live, "heartbeat", 100 // HEARTBEAT_EVENTS)
            beats = [m for m in first if m["event"] == "heartbeat"]
            ids = [m["id"] for m in first]
            assert ids == sorted(set(ids)) and ids[0] >= 1
            assert [b["data"]["events_seen"] for b in beats] == [20, 40, 60, 80, 100]
            assert all(b["data"]["rmse"] > 0 for b in beats)
            stored = browser.get("/drift/heartbeats", headers=read).json()["heartbeats"]
            assert len(stored) == len(beats)
            assert [
                {**b["data"], "id": row["id"]} for b, row in zip(beats, stored, strict=True)
            ] == stored

            # Events published while no one listened come on the reconnect, once each.
            assert feed.post("/ingest", json={"events": _events(100, 160)}).status_code == 200
            resume = {**read, "Last-Event-ID": str(ids[-1])}
            with browser.stream("GET", "/dashboard/events", headers=resume) as again:
                assert again.status_code == 200
                second = _take(again, "heartbeat", 3)
            assert [m["id"] for m in second] == list(range(ids[-1] + 1, ids[-1] + 1 + len(second)))
            assert [m["data"]["events_seen"] for m in second] == [120, 140, 160]
            assert not {m["id"] for m in second} & set(ids)

            # An id this process never gave (a browser from before a restart): reload.
            future = {**read, "Last-Event-ID": str(10**6)}
            with browser.stream("GET", "/dashboard/events", headers=future) as stale:
                assert next(_messages(stale))["event"] == "reload"

            # Shutting down with a stream open does not wait for the browser.
            with browser.stream("GET", "/dashboard/events", headers=read) as held:
                assert held.status_code == 200
                assert server.process is not None
                began = time.monotonic()
                server.process.terminate()
                server.process.wait(timeout=15)
                assert time.monotonic() - began < 15
        log = server.log_path.read_text()
        assert "Application shutdown complete" in log
        assert "without completing response" not in log  # the stream ended, not cut
        feed.close()
    finally:
        server.stop(kill=True)
