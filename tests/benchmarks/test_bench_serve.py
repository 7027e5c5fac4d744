"""The serving benchmark's parts: wrk's figures, the naive baseline, the synthetic catalogue."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from benchmarks import load
from benchmarks.bench.catalogue import synthetic_version
from benchmarks.load import INSTALL_HINT, LoadGeneratorMissing, drive, require_wrk
from benchmarks.naive_serving import create_app, save_arrays


def test_without_wrk_the_benchmark_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(load.shutil, "which", lambda _: None)
    with pytest.raises(LoadGeneratorMissing, match="apt-get install wrk"):
        require_wrk()
    assert "brew install wrk" in INSTALL_HINT


def test_wrks_figures_are_read_from_its_json_line() -> None:
    out = (
        "Running 1s test\n"
        'WRK_JSON {"requests": 500, "duration_us": 2000000, "non_2xx": 3, "connect_errors": 1,'
        ' "read_errors": 0, "write_errors": 0, "timeouts": 2, "p50_us": 1500, "p90_us": 2500,'
        ' "p99_us": 9000, "max_us": 12000}\n'
    )
    result = load._parse(out, "")
    assert result.rps == 250 and result.non_2xx == 3 and result.socket_errors == 3
    assert (result.p50_ms, result.p99_ms) == (1.5, 9.0)
    with pytest.raises(RuntimeError, match="no figures"):
        load._parse("garbage", "")


def _naive(tmp_path: Path) -> TestClient:
    rng = np.random.default_rng(0)
    arrays = tmp_path / "naive.npz"
    save_arrays(
        arrays,
        user_ids=["a", "b"],
        item_ids=[f"i{j}" for j in range(20)],
        user_factors=rng.normal(size=(2, 3)),
        item_factors=rng.normal(size=(20, 3)),
        item_bias=rng.normal(size=20),
        global_mean=3.0,
        rated={"a": ["i1", "i2", "i3"]},
    )
    return TestClient(create_app(arrays))


def test_the_naive_baseline_ranks_the_unrated_items_best_first(tmp_path: Path) -> None:
    client = _naive(tmp_path)
    answer = client.get("/recommend", params={"user_id": "a", "k": 5}).json()
    items = [entry["item_id"] for entry in answer["items"]]
    scores = [entry["score"] for entry in answer["items"]]
    assert len(items) == 5 and not {"i1", "i2", "i3"} & set(items)
    assert scores == sorted(scores, reverse=True)
    assert client.get("/recommend", params={"user_id": "zed"}).json()["items"] == []


def test_the_synthetic_catalogue_has_the_asked_shape_and_reproduces() -> None:
    model = synthetic_version(items=500, users=20, factors=6, seed=1)
    assert (model.n_items, model.n_users, model.factors) == (500, 20, 6)
    again = synthetic_version(items=500, users=20, factors=6, seed=1)
    assert np.array_equal(model.item_factors, again.item_factors)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("wrk") is None, reason=INSTALL_HINT)
def test_wrk_drives_a_real_server_with_random_users(tmp_path: Path) -> None:
    from benchmarks.bench.serve import NaiveServer

    client = _naive(tmp_path)
    client.close()
    with NaiveServer(tmp_path / "naive.npz", "asyncio", "h11", tmp_path / "log") as server:
        result = drive(server.url, ["a", "b", "zed"], seconds=1, connections=4, threads=1)
    assert result.requests > 0 and result.non_2xx == 0 and result.p99_ms >= result.p50_ms


def test_the_moved_items_phase_times_requests_after_events_moved_biases() -> None:
    from benchmarks.bench.catalogue import moved_items_cost

    figures = moved_items_cost(5_000, 300, 8, 2_000, requests=20)
    assert figures["catalogue_ann_events_since_index"] == 2_000
    assert 0 < figures["catalogue_ann_moved_items"] <= 5_000
    assert figures["catalogue_ann_after_events_ms"] > 0
