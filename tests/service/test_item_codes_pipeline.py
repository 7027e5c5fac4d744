"""The ingest path with items taken by their codes learns, ranks and monitors exactly as
with items taken by their strings, across retrains and the codes starting afresh."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from functions.ids import IdCodes
from service.settings import Settings
from service.store.alerts import list_heartbeats
from service.wiring import Driftline, build_driftline
from tests.support.datasets import movielens_events

EVENTS = 6_000


def _run(folder: Path, codes: IdCodes | None) -> dict[str, Any]:
    settings = Settings(
        data_dir=folder,
        bootstrap_events=1_000,
        heartbeat_events=250,
        refresh_events=2_500,
        max_epochs=4,
        retrain_runtime="inprocess",
        ranking_sample=0.5,
        seed=7,
    )
    pipeline: Driftline = build_driftline(settings, background_retrain=False)
    try:
        pipeline.learner.item_codes = codes
        events = movielens_events(0, EVENTS)
        for start in range(0, len(events), 400):
            pipeline.ingest(events[start : start + 400])
        learner = pipeline.learner
        with pipeline.db.connect() as conn:
            beats = [
                {key: value for key, value in row.items() if key not in ("id", "at")}
                for row in list_heartbeats(conn)
            ]
        return {
            "rmse": learner.tracker.summary(),
            "ranking": {
                track: learner.ranking.tracker.hit_rate(track) for track in ("driftline", "static")
            },
            "popular": learner.popular.ranking,
            "history": dict(learner.history.snapshot.items()),
            "heartbeats": beats,
            "version": learner.serving.version,
        }
    finally:
        pipeline.retrainer.close()
        pipeline.db.dispose()


@pytest.mark.slow
def test_items_by_code_give_what_items_by_string_give(tmp_path: Path) -> None:
    plain = _run(tmp_path / "plain", None)
    assert plain["version"] is not None and len(plain["heartbeats"]) > 10
    assert plain["ranking"]["driftline"] is not None
    for name, codes in (("coded", IdCodes()), ("afresh", IdCodes(limit=300))):
        coded = _run(tmp_path / name, codes)
        assert codes.generation > 0 or name == "coded"
        assert coded == plain
