"""The compiled rank arithmetic gives what counting one event at a time gives.

``ranks_excluding`` and ``ranks_of_products`` count each event's row in one compiled pass
and mark exclusions in a scratch row; the sample hash mixes ids and timestamps in one
compiled loop. These tests hold them against straightforward references written here:
a per-event count over Python floats, ``np.einsum`` for the scores, and MurmurHash3's
finaliser in NumPy as the sampler first computed it.
"""

from __future__ import annotations

import numpy as np
import pytest

from drift.ranking import (
    RankingSampler,
    RankingTracker,
    _mix,
    _score_row,
    hits,
    ndcg,
    rank_of,
    ranks_excluding,
    ranks_of,
    ranks_of_products,
    ranks_within,
    sample_point,
)
from tests.support.ranking_reference import reference_rank


def _case(
    seed: int, m: int, n: int, ties: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Scores (rounded to a few values when ``ties``), targets with unknown ones, and
    exclusions in no order with repeats and excluded targets among them."""
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 6, (m, n)).astype(float) if ties else rng.normal(size=(m, n))
    targets = rng.integers(-1, n, m)
    count = int(rng.integers(0, 4 * n))
    owners, rows = rng.integers(0, m, count), rng.integers(0, n, count)
    hit = rng.random(m) < 0.2  # some events leave out their own item
    owners = np.concatenate([owners, np.flatnonzero(hit & (targets >= 0))])
    rows = np.concatenate([rows, targets[hit & (targets >= 0)]])
    return scores, targets, owners, rows


@pytest.mark.parametrize("seed", range(40))
def test_ranks_excluding_matches_counting_each_event(seed: int) -> None:
    rng = np.random.default_rng(1_000 + seed)
    m, n = int(rng.integers(1, 30)), int(rng.integers(1, 300))
    scores, targets, owners, rows = _case(seed, m, n, ties=seed % 2 == 0)
    expected = [
        reference_rank(scores[j], int(targets[j]), set(rows[owners == j].tolist()))
        for j in range(m)
    ]
    assert ranks_excluding(scores, targets, owners, rows).tolist() == expected
    lists = [rows[owners == j] for j in range(m)]
    assert ranks_of(scores, targets, lists).tolist() == expected
    assert [rank_of(scores[j], int(targets[j]), lists[j]) for j in range(m)] == expected


def test_a_nan_score_is_never_ahead_and_a_nan_target_ranks_first() -> None:
    scores = np.array([[0.5, np.nan, 0.2, 0.9], [np.nan, 0.1, 0.3, 0.2]])
    ranks = ranks_excluding(scores, [2, 0], np.array([0]), np.array([3]))
    assert ranks.tolist() == [2, 1]


def test_exclusions_outside_the_catalogue_or_the_events_are_refused() -> None:
    with pytest.raises(ValueError, match="excluded row"):
        ranks_excluding(np.zeros((1, 3)), [0], np.array([0]), np.array([3]))
    with pytest.raises(ValueError, match="no event"):
        ranks_excluding(np.zeros((1, 3)), [0], np.array([1]), np.array([2]))


@pytest.mark.parametrize("factors", [1, 2, 3, 9, 10, 17, 33])
def test_a_score_row_is_summed_exactly_as_einsum_sums_it(factors: int) -> None:
    rng = np.random.default_rng(factors)
    for n in (2, 3, 64, 1_001):
        user, items, shift = rng.normal(size=factors), rng.normal(size=(factors, n)), rng.normal()
        row = np.empty(n)
        _score_row(user, items, shift, row)
        expected = np.einsum("md,dn->mn", user[None, :], items)
        expected += shift
        assert row.tobytes() == expected[0].tobytes()


def _products(
    draw: int, seed: int, most_items: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Users (``m x d``), items (``d x n``), shifts and ``_case``'s targets and
    exclusions; every third seed in small integers, for plenty of exact ties."""
    rng = np.random.default_rng(draw)
    m, n, d = int(rng.integers(1, 25)), int(rng.integers(1, most_items)), int(rng.integers(1, 12))
    if seed % 3 == 0:  # small integers: exact arithmetic, so plenty of exact ties
        users = rng.integers(-1, 2, (m, d)).astype(float)
        items = rng.integers(-1, 2, (d, n)).astype(float)
        shift = rng.integers(0, 2, m).astype(float)
    else:
        users, items, shift = rng.normal(size=(m, d)), rng.normal(size=(d, n)), rng.normal(size=m)
    _, targets, owners, rows = _case(seed, m, n, ties=False)
    return users, items, shift, targets, owners, rows


@pytest.mark.parametrize("seed", range(30))
def test_ranks_of_products_match_ranking_the_einsum_scores(seed: int) -> None:
    users, items, shift, targets, owners, rows = _products(seed, seed, most_items=400)
    m = len(users)
    scores = np.einsum("md,dn->mn", users, items)
    scores += shift[:, None]
    expected = [
        reference_rank(scores[j], int(targets[j]), set(rows[owners == j].tolist()))
        for j in range(m)
    ]
    assert ranks_of_products(users, items, shift, targets, owners, rows).tolist() == expected


@pytest.mark.parametrize("seed", range(40))
def test_ranks_within_a_list_are_the_full_ranks_cut_past_it(seed: int) -> None:
    users, items, shift, targets, owners, rows = _products(100 + seed, seed, most_items=600)
    n = items.shape[1]
    full = ranks_of_products(users, items, shift, targets, owners, rows)
    for within in (1, 3, 10, n + 5):
        cut = np.where(full > within, within + 1, full)
        found = ranks_within(users, items.T, shift, targets, owners, rows, within)
        assert found.tolist() == cut.tolist()
        assert (hits(found, within) == hits(full, within)).all()
        assert (ndcg(found, within) == ndcg(full, within)).all()
    with pytest.raises(ValueError):
        ranks_within(users, items.T, shift, targets, owners, rows, 0)


def _reference_fmix64(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xFF51AFD7ED558CCD)
    x = x ^ (x >> np.uint64(33))
    x = x * np.uint64(0xC4CEB9FE1A85EC53)
    return x ^ (x >> np.uint64(33))


def test_the_compiled_mix_gives_the_numpy_finaliser_bits() -> None:
    rng = np.random.default_rng(4)
    n = 5_000
    users = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    items = rng.integers(0, 2**63, n, dtype=np.uint64)
    stamps: list[float | None] = [float(t) for t in rng.normal(1e9, 1e8, n)]
    stamps[::7] = [None] * len(stamps[::7])
    stamps[1::7] = [int(t) for t in rng.integers(0, 2**40, len(stamps[1::7]))]
    times = np.array([np.nan if t is None else float(t) for t in stamps], dtype=np.float64)
    expected = _reference_fmix64(times.view(np.uint64) ^ np.uint64(0x9E3779B97F4A7C15))
    expected = _reference_fmix64(expected ^ items)
    expected = _reference_fmix64(expected ^ users)
    assert np.array_equal(_mix(users, items, stamps), expected)


def test_the_sample_of_a_batch_is_the_events_whose_own_point_is_below_the_fraction() -> None:
    rng = np.random.default_rng(8)
    n = 4_000
    users = [f"u{k}" for k in rng.zipf(1.3, n) % 300]
    items = [f"i{k}" for k in rng.zipf(1.2, n) % 2_000]
    stamps = [None if k % 11 == 0 else float(k // 3) for k in range(n)]
    ratings = [None if k % 5 == 0 else float(r) for k, r in enumerate(rng.integers(1, 6, n))]
    sampler = RankingSampler(fraction=0.3)
    expected = [
        rating is not None and rating >= 4.0 and sample_point(user, item, stamp) < 0.3
        for user, item, stamp, rating in zip(users, items, stamps, ratings, strict=True)
    ]
    for start in range(0, n, 700):  # batch after batch: digests kept between them
        stop = start + 700
        got = sampler.mask(
            users[start:stop], items[start:stop], stamps[start:stop], ratings[start:stop]
        )
        assert got.tolist() == expected[start:stop]


def test_the_tracker_sums_what_hits_and_ndcg_give_event_by_event() -> None:
    rng = np.random.default_rng(12)
    tracker, hit_sum, gain_sum, count = RankingTracker(k=10), 0.0, 0.0, 0
    for _ in range(300):
        ranks = rng.integers(0, 30, int(rng.integers(0, 40)))
        tracker.record("driftline", ranks)
        hit_sum += float(hits(ranks, 10).sum())
        gain_sum += float(ndcg(ranks, 10).sum())
        count += len(ranks)
    assert tracker.hit_rate("driftline") == hit_sum / count
    assert tracker.ndcg("driftline") == gain_sum / count
