"""Prequential ranking: the rank arithmetic, hit-rate@10 and NDCG@10, the fixed sample."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from drift import ranking
from drift.ranking import (
    NOT_RANKED,
    RankingSampler,
    RankingTracker,
    hits,
    ndcg,
    rank_of,
    ranks_of,
    sample_point,
)
from functions.mf import top_k


def test_rank_counts_the_items_scored_above_the_target() -> None:
    scores = [0.5, 0.9, 0.1, 0.7]
    assert [rank_of(scores, target) for target in range(4)] == [3, 1, 4, 2]


def test_a_tie_goes_to_the_lower_row_as_top_k_breaks_it() -> None:
    scores = [0.7, 0.2, 0.7, 0.7]
    assert [rank_of(scores, target) for target in (0, 2, 3)] == [1, 2, 3]


def test_excluded_items_do_not_count_against_the_target() -> None:
    scores = [0.9, 0.8, 0.7, 0.6, 0.5]
    assert rank_of(scores, 4) == 5
    assert rank_of(scores, 4, exclude=[0, 2]) == 3
    assert rank_of(scores, 4, exclude=[0, 0, 2]) == 3  # a repeated exclusion counts once
    assert rank_of(scores, 2, exclude=[3, 4]) == 3  # items below it change nothing


def test_an_unknown_or_excluded_target_is_not_ranked() -> None:
    assert rank_of([0.3, 0.2], -1) == NOT_RANKED
    assert rank_of([0.3, 0.2], 1, exclude=[1]) == NOT_RANKED
    assert rank_of(np.empty(0), -1) == NOT_RANKED


def test_ranks_of_a_batch_match_one_at_a_time() -> None:
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(6, 40)).round(1)  # rounded: plenty of ties
    targets = np.array([0, 5, 39, -1, 7, 12])
    excluded = [rng.choice(40, size=n, replace=False) for n in (0, 3, 10, 2, 39, 5)]
    batch = ranks_of(scores, targets, excluded)
    singles = [rank_of(scores[j], targets[j], excluded[j]) for j in range(6)]
    assert batch.tolist() == singles


def test_rank_within_k_exactly_when_top_k_lists_the_target() -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        scores = rng.integers(0, 15, size=50).astype(float)  # many ties
        target = int(rng.integers(0, 50))
        exclude = rng.choice(50, size=int(rng.integers(0, 20)), replace=False)
        exclude = exclude[exclude != target]
        listed, _ = top_k(scores, 10, exclude=exclude)
        assert (rank_of(scores, target, exclude) <= 10) == (target in listed.tolist())


def test_ranks_of_refuses_shapes_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="m x n_items"):
        ranks_of(np.zeros(3), [0])
    with pytest.raises(ValueError, match="targets"):
        ranks_of(np.zeros((2, 3)), [0])
    with pytest.raises(ValueError, match="past"):
        ranks_of(np.zeros((1, 3)), [3])
    with pytest.raises(ValueError, match="exclusion"):
        ranks_of(np.zeros((2, 3)), [0, 1], [[1]])


def test_hits_and_ndcg_by_hand() -> None:
    ranks = [1, 2, 3, 10, 11, NOT_RANKED]
    assert hits(ranks).tolist() == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    expected = [1.0, 1 / math.log2(3), 0.5, 1 / math.log2(11), 0.0, 0.0]
    assert ndcg(ranks) == pytest.approx(expected)
    assert hits([3, 4], k=3).tolist() == [1.0, 0.0]
    assert ndcg([3, 4], k=3) == pytest.approx([0.5, 0.0])


def test_tracker_keeps_running_figures_per_track() -> None:
    tracker = RankingTracker()
    tracker.record("driftline", [1, 3])
    tracker.record("driftline", [NOT_RANKED, 20])
    tracker.record("river", [2])
    assert tracker.tracks() == ["driftline", "river"]
    assert tracker.count("driftline") == 4
    assert tracker.hit_rate("driftline") == pytest.approx(0.5)
    assert tracker.ndcg("driftline") == pytest.approx((1.0 + 0.5) / 4)
    assert tracker.hit_rate("static") is None and tracker.ndcg("static") is None
    assert tracker.summary()["river"] == {
        "hit_rate": 1.0,
        "ndcg": pytest.approx(1 / math.log2(3)),
        "count": 1,
    }


def test_tracker_refuses_an_empty_list() -> None:
    with pytest.raises(ValueError, match="k"):
        RankingTracker(k=0)


def _events(n: int) -> tuple[list[str], list[str], list[float], list[float]]:
    rng = np.random.default_rng(11)
    users = [f"u{x}" for x in rng.integers(0, 300, n)]
    items = [f"i{x}" for x in rng.integers(0, 2_000, n)]
    stamps = (1_500_000_000 + np.arange(n) * 7.0).tolist()
    ratings = rng.choice([1.0, 2.5, 4.0, 4.5, 5.0], n).tolist()
    return users, items, stamps, ratings


def test_the_sample_is_the_same_every_time_and_only_liked_events() -> None:
    users, items, stamps, ratings = _events(20_000)
    sampler = RankingSampler(fraction=0.1, min_rating=4.0)
    first = sampler.mask(users, items, stamps, ratings)
    again = RankingSampler(fraction=0.1, min_rating=4.0).mask(users, items, stamps, ratings)
    np.testing.assert_array_equal(first, again)
    liked = np.asarray(ratings) >= 4.0
    assert not first[~liked].any()
    assert first[liked].mean() == pytest.approx(0.1, abs=0.01)


def test_the_sample_is_the_same_in_another_process_with_another_string_hash() -> None:
    users, items, stamps, ratings = _events(300)
    here = RankingSampler(fraction=0.3).mask(users, items, stamps, ratings)
    code = (
        "import sys, json; from drift.ranking import RankingSampler\n"
        "u, i, t, r = json.load(sys.stdin)\n"
        "print(''.join('1' if x else '0' for x in RankingSampler(0.3).mask(u, i, t, r)))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    there = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps([users, items, stamps, ratings]),
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.strip()
    assert there == "".join("1" if x else "0" for x in here)


def test_a_smaller_sample_is_part_of_a_larger_one() -> None:
    users, items, stamps, ratings = _events(5_000)
    small = RankingSampler(fraction=0.05).mask(users, items, stamps, ratings)
    large = RankingSampler(fraction=0.2).mask(users, items, stamps, ratings)
    assert small.any() and not (small & ~large).any()
    assert RankingSampler(fraction=1.0).mask(users, items, stamps, ratings).sum() == sum(
        r >= 4.0 for r in ratings
    )
    assert not RankingSampler(fraction=0.0).mask(users, items, stamps, ratings).any()


def test_the_sample_reads_an_integer_and_a_float_timestamp_alike() -> None:
    assert sample_point("u", "i", 964982703) == sample_point("u", "i", 964982703.0)
    assert sample_point("u", "i", 964982703) != sample_point("u", "i", 964982704)
    assert sample_point("u", "i", None) != sample_point("u", "i", 0.0)
    assert not RankingSampler(1.0).includes("u", "i", 1.0, None)  # unlabelled


def test_the_points_hold_when_the_kept_digests_start_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past its limit the digest cache starts a new table; a batch with more new ids
    than the new table's first allocation must still get every point."""
    users, items, stamps, _ = _events(2_000)
    expected = np.array([sample_point(*event) for event in zip(users, items, stamps, strict=True)])
    monkeypatch.setattr(ranking, "_ID_CACHE_LIMIT", 300)
    sampler = RankingSampler(fraction=0.37)
    for start in range(0, 2_000, 500):  # every batch passes the limit of the table before
        end = start + 500
        np.testing.assert_array_equal(
            sampler.points(users[start:end], items[start:end], stamps[start:end]),
            expected[start:end],
        )


def test_an_event_is_in_the_sample_exactly_when_its_point_is_below_the_fraction() -> None:
    users, items, stamps, ratings = _events(3_000)
    sampler = RankingSampler(fraction=0.37)
    points = np.array([sample_point(*event) for event in zip(users, items, stamps, strict=True)])
    liked = np.asarray(ratings) >= 4.0
    expected = liked & (points < 0.37)
    np.testing.assert_array_equal(sampler.mask(users, items, stamps, ratings), expected)


def test_a_fraction_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="fraction"):
        RankingSampler(fraction=1.5)
