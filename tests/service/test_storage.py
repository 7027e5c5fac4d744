"""Storage stays bounded: a job's objects go when it ends, old versions by retention."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.settings import Settings
from service.store.events import NewEvent
from service.wiring import Driftline, build_driftline
from tests.support.synthetic import stationary_stream

JOBS = 20


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.fixture(
    params=["sim", pytest.param("local", marks=pytest.mark.slow)],
    ids=["sim", "local"],
)
def runtime(request: pytest.FixtureRequest) -> str:
    """Simulated Lambda in this process; in the slow variant, worker processes."""
    return str(request.param)


@pytest.fixture
def pipeline(tmp_path: Path, database_url: str, runtime: str) -> Iterator[Driftline]:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        retrain_runtime=runtime,
        retrain_workers=4,
        # Jobs' own objects and retention, not the configurator's warm-start history.
        retrain_configurator="static",
        max_epochs=3,
        bootstrap_events=200,
        refresh_events=None,
        retention_versions=3,
        registry_poll_seconds=None,
        # Each job's version serves at once, so retention prunes after every swap; the
        # guard's shadow is tested on its own (tests/service/test_rollout_guard.py).
        guard_enabled=False,
    )
    built = build_driftline(settings, background_retrain=False)
    yield built
    built.retrainer.close()
    built.db.dispose()


def test_object_store_size_stays_flat_across_twenty_jobs(pipeline: Driftline) -> None:
    stream = stationary_stream(n_users=300, n_items=200, n_events=200 * (JOBS + 1), seed=9)
    events = [
        NewEvent(e["user_id"], e["item_id"], e["rating"], e["timestamp"], e["event_id"])
        for e in stream
    ]
    objects = pipeline.settings.data_dir / "objects"
    pipeline.ingest(events[:200])  # the bootstrap job
    sizes = []
    for job in range(1, JOBS):
        pipeline.ingest(events[200 * job : 200 * (job + 1)])
        pipeline.retrain_now()
        pipeline.retrainer.wait()
        sizes.append(_size(objects))
    versions = pipeline.registry.versions()
    assert len(versions) == JOBS
    kept = [v["version"] for v in versions if v["deleted_at"] is None]
    assert pipeline.learner.serving.version in kept and versions[-1]["version"] in kept
    assert len(kept) <= 3 + 1  # the newest three, and the first (the static baseline)
    leftovers = [p.relative_to(objects).parts[0] for p in objects.rglob("*") if p.is_file()]
    assert set(leftovers) == {"models"}  # no snapshots, shards, deltas or checkpoints
    assert max(sizes[5:]) <= 1.2 * sizes[4], sizes
    print(f"object store after {JOBS} jobs: {sizes[-1]:,} bytes")


def test_deleted_versions_are_listed_and_never_loaded(pipeline: Driftline) -> None:
    stream = stationary_stream(n_users=50, n_items=40, n_events=1200, seed=4)
    events = [
        NewEvent(e["user_id"], e["item_id"], e["rating"], e["timestamp"], e["event_id"])
        for e in stream
    ]
    pipeline.ingest(events[:200])
    for start in range(200, 1200, 200):
        pipeline.ingest(events[start : start + 200])
        pipeline.retrain_now()
        pipeline.retrainer.wait()
    versions = pipeline.registry.versions()
    deleted = [v for v in versions if v["deleted_at"] is not None]
    assert deleted
    assert pipeline.registry.newest_loadable().version == versions[0]["version"]
    assert pipeline.registry.oldest_loadable().version == versions[-1]["version"]
    with pytest.raises(Exception, match="deleted by retention"):
        pipeline.registry.load(deleted[0]["version"])
