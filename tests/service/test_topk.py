"""``best_rows`` answers exactly what ``functions.mf.top_k`` answers, ties included."""

from __future__ import annotations

import numpy as np
import pytest

from functions.mf import top_k
from service.serving.topk import best_rows


@pytest.mark.parametrize("seed", range(40))
def test_best_rows_matches_top_k_on_ties_and_exclusions(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    # Few distinct values: ties everywhere, across the k-th score too.
    scores = rng.integers(0, 6, n).astype(np.float64) / 2
    excluded = rng.choice(n, int(rng.integers(0, n + 1)), replace=True)
    k = int(rng.integers(0, n + 3))
    expected_rows, expected_scores = top_k(scores, k, exclude=excluded)
    rows, best = best_rows(scores.copy(), k, excluded)
    assert rows.tolist() == expected_rows.tolist()
    assert best.tolist() == expected_scores.tolist()


def test_real_valued_scores_come_back_best_first() -> None:
    scores = np.random.default_rng(0).normal(size=10_000)
    rows, best = best_rows(scores.copy(), 10)
    assert rows.tolist() == np.argsort(-scores)[:10].tolist()
    assert np.all(np.diff(best) <= 0)


@pytest.mark.parametrize("seed", range(20))
def test_the_block_shortcut_of_large_catalogues_answers_as_top_k(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1_000, 6_000))
    distinct = int(rng.choice([3, 50, 10**9]))  # heavy ties, some, none
    scores = rng.integers(0, distinct, n).astype(np.float64)
    excluded = rng.choice(n, int(rng.integers(0, 300)), replace=False)
    k = int(rng.integers(1, 17))
    expected_rows, expected_scores = top_k(scores, k, exclude=excluded)
    rows, best = best_rows(scores.copy(), k, excluded)
    assert rows.tolist() == expected_rows.tolist()
    assert best.tolist() == expected_scores.tolist()
