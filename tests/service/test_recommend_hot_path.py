"""``Driftline.recommend`` reads memory only, and reflects each ingested event at once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from service.settings import Settings
from service.store.events import NewEvent, popular_items, rated_items
from service.wiring import Driftline, build_driftline
from tests.support.synthetic import stationary_stream


@pytest.fixture
def pipeline(tmp_path: Path, database_url: str) -> Iterator[Driftline]:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        bootstrap_events=200,
        factors=8,
        max_epochs=5,
        refresh_events=None,
        retrain_runtime="thread",
        popular_window=150,
    )
    built = build_driftline(settings, background_retrain=False)
    stream = stationary_stream(n_users=40, n_items=30, n_events=300, seed=4)
    events = [
        NewEvent(e["user_id"], e["item_id"], e["rating"], e["timestamp"], e["event_id"])
        for e in stream
    ]
    for start in range(0, len(events), 100):
        built.ingest(events[start : start + 100])
    assert built.learner.serving.version is not None
    db = built.db  # a test may take it away
    yield built
    built.retrainer.close()
    db.dispose()


class NoDatabase:
    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"recommend touched the database ({name})")


def test_recommend_answers_known_and_unknown_users_without_the_database(
    pipeline: Driftline, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = pipeline.db
    with db.connect() as conn:
        rated = {user: set(rated_items(conn, user)) for user in ("u1", "u7")}
        popular = [item for item, _ in popular_items(conn, 150, limit=5)]
    monkeypatch.setattr(pipeline, "db", NoDatabase())
    for user in ("u1", "u7"):
        answer = pipeline.recommender.recommend(user, 5)
        assert answer.source == "model" and len(answer.items) == 5
        assert not {item for item, _ in answer.items} & rated[user]
    stranger = pipeline.recommender.recommend("nobody-knows-me", 5)
    assert stranger.source == "popular"
    assert [item for item, _ in stranger.items] == popular


def test_an_ingested_event_is_in_the_next_answer(pipeline: Driftline) -> None:
    before = pipeline.recommender.recommend("u3", 5)
    vector = pipeline.learner.serving.view.user_vector("u3")
    best, score = before.items[0]
    pipeline.ingest([NewEvent("u3", best, 1.0)])
    after = pipeline.recommender.recommend("u3", 5)
    assert best not in [item for item, _ in after.items]
    assert not np.array_equal(pipeline.learner.serving.view.user_vector("u3"), vector)
    scores_before, scores_after = dict(before.items), dict(after.items)
    shared = set(scores_before) & set(scores_after)
    assert all(scores_before[i] != scores_after[i] for i in shared)

    top = pipeline.recommender.recommend("new-user", 3).items[0][0]
    pipeline.ingest([NewEvent("new-user", top)])  # implicit: no rating, no fold-in
    answer = pipeline.recommender.recommend("new-user", 3)
    assert answer.source == "popular" and top not in [item for item, _ in answer.items]
    pipeline.ingest([NewEvent("new-user", "i2", 5.0)])  # labelled: the user is placed
    assert pipeline.recommender.recommend("new-user", 3).source == "model"


def test_popular_items_come_back_after_a_restart(pipeline: Driftline) -> None:
    ranking = pipeline.learner.popular.ranking
    restarted = build_driftline(pipeline.settings, background_retrain=False)
    try:
        assert restarted.learner.popular.ranking == ranking
        assert restarted.recommender.recommend("stranger", 5) == pipeline.recommender.recommend(
            "stranger", 5
        )
        assert restarted.learner.history.items("u1") == pipeline.learner.history.items("u1")
    finally:
        restarted.retrainer.close()
        restarted.db.dispose()


def test_a_kept_answer_outlives_other_users_batches_but_not_the_users_own_event(
    pipeline: Driftline,
) -> None:
    first = pipeline.recommender.recommend("u5", 5)
    view = pipeline.learner.serving.view
    assert ("u5", 5) in view.answers
    assert pipeline.recommender.recommend("u5", 5) == first
    pipeline.ingest([NewEvent("u9", first.items[0][0], 5.0)])  # another user's event
    assert (
        pipeline.learner.serving.view is not view
        and ("u5", 5) in pipeline.learner.serving.view.answers
    )
    pipeline.ingest([NewEvent("u5", first.items[0][0], 1.0)])
    assert first.items[0][0] not in [
        item for item, _ in pipeline.recommender.recommend("u5", 5).items
    ]


def test_events_another_replica_stored_reach_the_history_and_popular_items(
    pipeline: Driftline,
) -> None:
    other = build_driftline(
        pipeline.settings.model_copy(update={"replica_id": "other"}), background_retrain=False
    )
    try:
        assert pipeline.tail.look() is False  # nothing new yet
        pipeline.ingest([NewEvent("u2", "i3", 4.0)])
        assert pipeline.tail.look() is False  # its own events are applied already
        other.ingest(
            [NewEvent("u1", "hit", None)] + [NewEvent(f"fan{j}", "hit") for j in range(40)]
        )
        assert "hit" not in pipeline.learner.history.items("u1")
        assert pipeline.tail.look() is True
        assert pipeline.learner.applied == other.learner.applied
        assert "hit" in pipeline.learner.history.items("u1")
        assert pipeline.recommender.recommend("stranger", 1).items[0][0] == "hit"
        assert "hit" not in [item for item, _ in pipeline.recommender.recommend("u1", 30).items]
        assert pipeline.tail.look() is False
    finally:
        other.retrainer.close()
        other.db.dispose()
