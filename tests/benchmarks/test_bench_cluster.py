"""``driftline bench cluster`` at a tiny size: one and two replicas, a few seconds each."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.cluster import haproxy_available
from benchmarks.load import INSTALL_HINT
from tests.support.databases import external_url, not_configured_reason

pytestmark = pytest.mark.slow


def _missing() -> str | None:
    if external_url() is None:
        return not_configured_reason()
    if not haproxy_available():
        return "bench cluster needs HAProxy (Debian package haproxy) on the PATH"
    if shutil.which("wrk") is None:
        return INSTALL_HINT
    try:
        import moto.server  # noqa: F401
    except ImportError:
        return "bench cluster's S3 is moto's server (test extra)"
    return None


@pytest.mark.skipif(_missing() is not None, reason=_missing() or "")
def test_a_tiny_cluster_run_reports_every_figure_sanely(tmp_path: Path) -> None:
    from benchmarks.bench.cluster import run_cluster

    figures = run_cluster(
        limit=4_000,
        batch_size=500,
        seconds=2,
        sizes=(1, 2),
        ingest_seconds=2,
        fresh_users=3,
        train_events=1_500,
        work_dir=tmp_path,
    )
    for n in (1, 2):
        for key in ("recommend_rps", "ingest_events_per_s", "restart_healthy_s"):
            assert figures[f"r{n}_{key}"] > 0, (key, figures)
        assert figures[f"r{n}_recommend_p99_ms"] >= figures[f"r{n}_recommend_p50_ms"] > 0
        assert figures[f"r{n}_recommend_errors"] == 0
        assert figures[f"r{n}_ingest_failed_requests"] == 0
        assert figures[f"r{n}_ingest_batch_p99_ms"] >= figures[f"r{n}_ingest_batch_p50_ms"]
        assert figures[f"r{n}_restart_fold_in_events"] >= 0
        assert figures[f"r{n}_restart_lag_events"] >= 0
        assert figures[f"r{n}_retrain_jobs"] == 1  # the benchmark's own, nothing else
    # Freshness and failover need a second replica.
    assert "r1_fresh_poll_p50_ms" not in figures and "r1_failover_s" not in figures
    for kind in ("poll", "after"):
        assert figures[f"r2_fresh_{kind}_samples"] == 3
        assert figures[f"r2_fresh_{kind}_p99_ms"] >= figures[f"r2_fresh_{kind}_p50_ms"] >= 0
    assert figures["r2_fresh_after_stale"] == 0
    assert 0 < figures["r2_failover_s"] < figures["leader_lease_s"] + 30
    assert figures["read_scaling_1_to_2"] > 0
    assert figures["cores"] >= 1 and "cores" in figures["note"]
