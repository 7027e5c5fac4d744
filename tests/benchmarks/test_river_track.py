"""river's baseline (``benchmarks.baselines.RiverTrack``): its hit-rate over a segment."""

from __future__ import annotations

import numpy as np

from benchmarks.baselines import RiverTrack
from drift.ranking import RankingSampler
from tests.support.synthetic import stationary_stream


def test_the_hit_rate_since_a_position_counts_only_the_events_ranked_from_there() -> None:
    stream = stationary_stream(n_users=30, n_items=40, n_events=1_200, seed=2)
    river = RiverTrack(ranking=RankingSampler(fraction=1.0, min_rating=3.0))
    for start in range(0, len(stream), 300):
        batch = stream[start : start + 300]
        river.process(
            [e["user_id"] for e in batch],
            [e["item_id"] for e in batch],
            [e["rating"] for e in batch],
            [e["timestamp"] for e in batch],
        )
    positions = [at for at, _ in river.ranked]
    assert positions == sorted(positions) and len(positions) == river.ranker.tracker.count("river")
    assert river.hit_rate_since(0) == river.hit_rate
    later = [rank for at, rank in river.ranked if at >= 600]
    expected = float(np.mean([1 <= rank <= 10 for rank in later]))  # ranks count from 1
    assert river.hit_rate_since(600) == expected
    assert river.hit_rate_since(len(stream)) is None
