"""``driftline bench soak`` on a shortened stream: two replicas, 30,000 events."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.cluster import haproxy_available
from tests.support.databases import external_url, not_configured_reason

pytestmark = pytest.mark.slow

EVENTS = 30_000


def _missing() -> str | None:
    if external_url() is None:
        return not_configured_reason()
    if not haproxy_available():
        return "bench soak needs HAProxy (Debian package haproxy) on the PATH"
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return "bench soak's S3 is moto's server (test extra)"
    return None


@pytest.mark.skipif(_missing() is not None, reason=_missing() or "")
def test_a_short_soak_stores_every_event_retains_a_bounded_log_and_retrains(
    tmp_path: Path,
) -> None:
    from benchmarks.bench.soak import SoakConfig, run_soak

    # Capped, so that jobs finish while the stream still runs on two shared cores.
    config = SoakConfig(events=EVENTS, rate=1_500, sample_s=2.0, heartbeat_events=100)
    figures = run_soak(config=config, plot=tmp_path / "plots", work_dir=tmp_path / "run")

    assert figures["events_produced"] == figures["events_stored"] == EVENTS
    assert figures["events_lost"] == 0 and figures["dead_letters"] == 0
    assert 0 < figures["events_per_s"] <= 1_500 * 1.1
    # Retention archived the old events: the table holds a bounded tail of the log.
    assert figures["store_archive_mb_end"] > 0
    assert figures["db_event_rows_end"] <= EVENTS // 2, figures["timeline"][-1]
    assert figures["db_mb_end"] > 0
    # Every process was sampled, over the whole run.
    for name in ("replica-0", "replica-1", "haproxy", "broker", "bench"):
        assert figures[f"rss_{name}_mb_end"] > 0, name
        assert isinstance(figures[f"rss_{name}_flat"], bool)
    assert len(figures["timeline"]) >= 5
    # Jobs ran, each with a window, a duration and a cost.
    done = [job for job in figures["jobs"] if job["status"] == "succeeded"]
    assert figures["jobs_run"] == len(done) >= 1
    for job in done:
        assert job["window_events"] > 0 and job["duration_s"] > 0
        assert job["cost_usd"] is not None and job["cost_usd_as_lambda"] > 0
    # /recommend answered throughout, and each interval has its p99.
    assert figures["recommend_requests"] > 0 and figures["recommend_errors"] == 0
    assert figures["recommend_p99_ms"] >= figures["recommend_p50_ms"] > 0
    assert any(row["p99_ms"] is not None for row in figures["recommend_p99_timeline"])
    # The planted drifts, each with its onset and its alerts (or none).
    assert [d["onset"] for d in figures["planted"]] == [EVENTS // 3, 2 * EVENTS // 3]
    assert all(d["alerts"] >= 0 for d in figures["planted"])
    assert sorted(Path(p).name for p in figures["plots"]) == [
        "soak-db.png",
        "soak-memory.png",
        "soak-p99.png",
    ]
