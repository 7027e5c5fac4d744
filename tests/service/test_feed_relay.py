"""A serving process's live feed relays what its stream process stored."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from service.livefeed import EventBuffer
from service.store.alerts import add_alert
from service.store.events import NewEvent
from service.store.jobs import list_jobs
from service.stream.feed_relay import StoredFeedRelay
from service.wiring import Driftline
from tests.support.pipelines import replica_factory


@pytest.fixture
def make_replica(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Driftline]]:
    with replica_factory(tmp_path / "data", database_url) as make:
        yield make


def _events(n: int) -> list[NewEvent]:
    rng = np.random.default_rng(4)
    return [
        NewEvent(f"u{rng.integers(30)}", f"i{rng.integers(50)}", float(rng.integers(1, 6)))
        for _ in range(n)
    ]


def test_stored_heartbeats_alerts_and_job_changes_reach_the_feed_once(
    make_replica: Callable[..., Driftline],
) -> None:
    stream = make_replica("writer")  # evaluates, monitors and trains (inline here)
    stream.ingest(_events(120))
    relay = StoredFeedRelay(stream.db, EventBuffer())
    relay.tick()  # the first look marks where the feed starts
    assert relay.feed.newest_id == 0

    stream.ingest(_events(300))  # six heartbeats of 50; the bootstrap job runs
    with stream.db.begin() as conn:
        add_alert(conn, metric="rmse", before=0.9, after=1.2, events_seen=400, model_version=None)
    relay.tick()
    events = relay.feed.since(0)
    beats = [e.data for e in events if e.kind == "heartbeat"]
    assert [b["events_seen"] for b in beats] == [150, 200, 250, 300, 350, 400]
    [alert] = [e.data for e in events if e.kind == "alert"]
    assert (alert["events_seen"], alert["after"]) == (400, 1.2)
    with stream.db.connect() as conn:
        [job] = list_jobs(conn)
    assert [e.data for e in events if e.kind == "job"] == [
        {"id": job["id"], "status": "succeeded", "trigger": "bootstrap"}
    ]
    relay.tick()
    assert relay.feed.newest_id == len(events)  # nothing twice
