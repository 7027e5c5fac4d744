"""Prequential hit-rate@10 and NDCG@10 in the pipeline, its heartbeats and the API.

Retraining runs inline (``background_retrain=False``) so every run is deterministic.
Tests that take ``database_url`` run on SQLite and, when ``DRIFTLINE_TEST_DATABASE_URL``
is set, on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from drift.ranking import NOT_RANKED, RankingSampler
from functions.mf import BiasedMF
from service.app import create_app
from service.serving.history import RatedItems
from service.serving.model import ServingModel
from service.settings import Settings
from service.store.alerts import list_heartbeats
from service.store.events import NewEvent
from service.stream.ranking import PrequentialRanking
from service.wiring import Driftline, build_driftline
from tests.support.datasets import movielens_events
from tests.support.pipelines import pipeline_factory

MOVIELENS_EVENTS = 8_000


def _settings(data_dir: Path, database_url: str | None = None, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "bootstrap_events": 1_000,
        "heartbeat_events": 500,
        "refresh_events": None,
        "max_epochs": 8,
        "retrain_runtime": "inprocess",
        "ranking_sample": 1.0,
    }
    return Settings(**(values | overrides))


def _movielens(start: int, stop: int) -> list[NewEvent]:
    return movielens_events(start, stop)


def _ingest(pipeline: Driftline, events: list[NewEvent], batch: int = 500) -> None:
    for start in range(0, len(events), batch):
        pipeline.ingest(events[start : start + batch])


class _ChanceShadow:
    """Ranks the pipeline's sampled events again, with random scores over the serving
    version's items, the same exclusions and every user placed: what chance achieves."""

    def __init__(self, pipeline: Driftline) -> None:
        self.shadow = PrequentialRanking(pipeline.learner.ranking.sampler, RatedItems())
        self._rng = np.random.default_rng(0)
        self._rank = pipeline.learner.ranking.rank
        pipeline.learner.ranking.rank = self.rank  # type: ignore[method-assign]

    def rank(
        self, stored: Any, view: Any, static: Any, vectors: Any = None, **columns: Any
    ) -> None:
        self._rank(stored, view, static, vectors, **columns)
        if view.model is None:  # nothing to rank against yet: only remember the batch
            self.shadow.history.add([e.user_id for e in stored], [e.item_id for e in stored])
            return
        chance = BiasedMF(factors=1, init_scale=0.0)
        chance.grow([e.user_id for e in stored], view.model.item_ids)
        chance.item_bias[:] = self._rng.random(chance.n_items)
        self.shadow.rank(stored, view, chance, vectors)


@pytest.fixture(scope="module")
def movielens() -> Iterator[tuple[Driftline, _ChanceShadow]]:
    """The first MovieLens ratings through a pipeline that ranks every liked event."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="driftline-ranking-") as tmp:
        pipeline = build_driftline(_settings(Path(tmp)), background_retrain=False)
        chance = _ChanceShadow(pipeline)
        _ingest(pipeline, _movielens(0, MOVIELENS_EVENTS))
        yield pipeline, chance
        pipeline.retrainer.close()
        pipeline.db.dispose()


@pytest.fixture
def make_pipeline(tmp_path: Path, database_url: str) -> Iterator[Callable[..., Driftline]]:
    """Pipelines on one data directory and database (a second call is a restart)."""
    with pipeline_factory(
        lambda **overrides: _settings(tmp_path / "data", database_url, **overrides)
    ) as make:
        yield make


def test_heartbeats_carry_the_hit_rates_of_the_serving_and_the_static_model(
    movielens: tuple[Driftline, _ChanceShadow],
) -> None:
    beats = movielens[0].reads.heartbeats()
    assert len(beats) == MOVIELENS_EVENTS // 500
    assert all(beat["ranked_events"] > 0 for beat in beats)  # every liked event is ranked
    served = [beat for beat in beats if beat["model_version"] is not None]
    assert served and all(
        beat[key] is not None
        for beat in served
        for key in ("hit_rate", "ndcg", "static_hit_rate", "static_ndcg")
    )
    assert any(beat["hit_rate"] > 0 for beat in served)
    # Before the first version nothing can be ranked: those events are misses.
    assert beats[0]["model_version"] is None and beats[0]["hit_rate"] == 0.0


def test_heartbeats_add_up_to_the_running_figures(
    movielens: tuple[Driftline, _ChanceShadow],
) -> None:
    pipeline = movielens[0]
    beats = pipeline.reads.heartbeats()
    tracker = pipeline.learner.ranking.tracker
    counts = np.array([beat["ranked_events"] for beat in beats])
    assert counts.sum() == tracker.count("driftline") == tracker.count("static")
    for key, track, figure in (
        ("hit_rate", "driftline", tracker.hit_rate),
        ("static_hit_rate", "static", tracker.hit_rate),
        ("ndcg", "driftline", tracker.ndcg),
    ):
        pooled = sum(beat[key] * beat["ranked_events"] for beat in beats) / counts.sum()
        assert pooled == pytest.approx(figure(track))


def test_the_serving_model_ranks_movielens_far_better_than_chance(
    movielens: tuple[Driftline, _ChanceShadow],
) -> None:
    """The same events ranked by random scores over the same items, with the same
    exclusions, hit far less often than by a model that has learnt the users' tastes."""
    pipeline, chance = movielens
    tracker, same_events = pipeline.learner.ranking.tracker, chance.shadow.tracker
    assert same_events.count("driftline") > 3_000
    learnt, random = same_events.hit_rate("driftline"), same_events.hit_rate("static")
    assert learnt is not None and random is not None
    assert learnt > 2 * random
    assert tracker.count("driftline") == tracker.count("static") > same_events.count("static")


def test_the_history_holds_what_the_users_rated(
    movielens: tuple[Driftline, _ChanceShadow],
) -> None:
    history = movielens[0].learner.history
    events = _movielens(0, MOVIELENS_EVENTS)
    user = events[-1].user_id
    assert history.items(user) == {e.item_id for e in events if e.user_id == user}
    assert history.pairs == len({(e.user_id, e.item_id) for e in events})


def test_a_heartbeat_without_a_ranked_event_has_no_ranking_figures(
    make_pipeline: Callable[..., Driftline],
) -> None:
    pipeline = make_pipeline(ranking_sample=0.0)
    _ingest(pipeline, _movielens(0, 1_500))
    beats = pipeline.reads.heartbeats()
    assert len(beats) == 3
    for beat in beats:
        assert beat["ranked_events"] == 0
        assert beat["hit_rate"] is None and beat["static_ndcg"] is None
    assert pipeline.learner.ranking.tracker.count("driftline") == 0


def test_ranked_heartbeats_are_stored(make_pipeline: Callable[..., Driftline]) -> None:
    pipeline = make_pipeline(ranking_sample=0.5)
    _ingest(pipeline, _movielens(0, 2_000))
    with pipeline.db.connect() as conn:
        stored = list_heartbeats(conn)
    assert [row["ranked_events"] for row in stored] == [
        beat["ranked_events"] for beat in pipeline.reads.heartbeats()
    ]
    assert stored[-1]["hit_rate"] is not None and 0 < stored[-1]["ranked_events"] < 500


def test_a_restart_reloads_the_history_and_the_pending_ranks(
    make_pipeline: Callable[..., Driftline],
) -> None:
    events = _movielens(0, 2_300)
    first = make_pipeline()
    _ingest(first, events[:2_200])
    first.monitor.flush()
    pending = first.learner.ranking.pending_state()
    second = make_pipeline()
    assert second.learner.history.snapshot == first.learner.history.snapshot
    assert second.learner.ranking.pending_state() == pending  # the partial heartbeat's ranks
    _ingest(second, events[2_200:])
    assert second.learner.ranking.tracker.count("driftline") > 0


def test_a_restart_keeps_only_as_many_pairs_as_the_bound(
    make_pipeline: Callable[..., Driftline],
) -> None:
    _ingest(make_pipeline(serving_history_pairs=None), _movielens(0, 6_000))
    bounded = make_pipeline(serving_history_pairs=4_096)
    assert 0 < bounded.learner.history.pairs <= 4_096


def _catalogue() -> BiasedMF:
    """Five items whose scores fall with their row (zero factors, falling biases)."""
    model = BiasedMF(factors=2, init_scale=0.0, seed=0)
    model.grow(["u1", "u2"], [f"i{n}" for n in range(5)])
    model.item_bias[:] = [5.0, 4.0, 3.0, 2.0, 1.0]
    return model


def test_items_rated_before_in_the_history_or_the_batch_are_left_out() -> None:
    model = _catalogue()
    history = RatedItems()
    history.add(["u1"], ["i0"])
    ranking = PrequentialRanking(RankingSampler(fraction=1.0), history)
    view = ServingModel(model, "v1").view  # online biases start at zero: rows tie
    batch = [
        NewEvent("u1", "i1", None, 1.0),  # implicit: excluded too, as /recommend does
        NewEvent("u2", "i0", 4.0, 2.0),
        NewEvent("u1", "i3", 5.0, 3.0),
        NewEvent("u1", "i0", 4.5, 4.0),  # rated before: never shown again
        NewEvent("u1", "i4", 2.0, 5.0),  # not liked: not ranked
    ]
    ranking.rank(batch, view, model)
    assert ranking.pending_state() == [[1, 1], [2, 2], [NOT_RANKED, NOT_RANKED], [-1, -1]]
    assert ranking.tracker.count("static") == 3
    assert history.items("u1") == {"i0", "i1", "i3", "i4"}


def test_the_never_retrained_model_ranks_a_user_it_never_saw_by_its_item_biases() -> None:
    model = _catalogue()  # knows u1 and u2; items rank by bias, i0 first
    ranking = PrequentialRanking(RankingSampler(fraction=1.0), RatedItems())
    view = ServingModel(model.copy(), "v1").view
    batch = [NewEvent("new", "i2", 5.0, 1.0), NewEvent("new", "i0", 5.0, 2.0)]
    ranking.rank(batch, view, model)
    static_ranks = [pair[1] for pair in ranking.pending_state()]
    # As its predictions for such a user, μ + b_i: i2 third, i0 first (i2 now rated).
    assert static_ranks == [3, 1]
    assert ranking.take(2)["static_hit_rate"] == 1.0


def test_before_a_first_version_nothing_is_ranked_and_both_tracks_agree() -> None:
    ranking = PrequentialRanking(RankingSampler(fraction=1.0), RatedItems())
    ranking.rank([NewEvent("u1", "i1", 5.0, 1.0)], ServingModel(None, None).view, None)
    assert ranking.pending_state() == [[NOT_RANKED, NOT_RANKED]]
    assert ranking.take(1) == {
        "hit_rate": 0.0,
        "ndcg": 0.0,
        "static_hit_rate": 0.0,
        "static_ndcg": 0.0,
        "ranked_events": 1,
    }


def test_healthz_and_metrics_show_hit_rate_and_ndcg_beside_rmse(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "data", retrain_runtime="thread", bootstrap_events=500)
    with TestClient(create_app(settings)) as client:
        events = _movielens(0, 1_500)
        for start in range(0, len(events), 500):
            body = {
                "events": [
                    {
                        "event_id": e.event_id,
                        "user_id": e.user_id,
                        "item_id": e.item_id,
                        "rating": e.rating,
                        "timestamp": e.timestamp,
                    }
                    for e in events[start : start + 500]
                ]
            }
            assert client.post("/ingest", json=body).status_code == 200
        health = client.get("/healthz").json()
        driftline = health["prequential"]["driftline"]
        assert driftline["rmse"] is not None and driftline["ranked_events"] > 0
        assert 0.0 <= driftline["hit_rate"] <= 1.0 and 0.0 <= driftline["ndcg"] <= 1.0
        assert health["prequential"]["static"]["ranked_events"] == driftline["ranked_events"]
        metrics = client.get("/metrics").text
        assert 'driftline_prequential_hit_rate{model="driftline"}' in metrics
        assert 'driftline_prequential_ndcg{model="static"}' in metrics
        beats = client.get("/drift/heartbeats").json()["heartbeats"]
        assert beats and all("hit_rate" in beat and "ranked_events" in beat for beat in beats)
