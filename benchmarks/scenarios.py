"""Rating streams with drifts planted at known onsets, for ``driftline bench drift`` and
the demo.

Each scenario rewrites a stream from its onset on, so the events before the onset are
exactly the control's and a detector's alerts there are false alarms. Ratings stay
within the stream's own range, and an inversion maps its scale onto itself: 0.5-5 on
ml-latest-small and the synthetic stream, 1-5 on MovieLens 1M.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from benchmarks.datasets import RatingStream

__all__ = ["SCENARIOS", "PlantedDrift", "plant", "synthetic_stream"]

#: The range of a stream without ratings to read it from.
RATING_RANGE = (0.5, 5.0)


@dataclass(frozen=True)
class PlantedDrift:
    """A stream with a drift planted from ``onset`` on.

    Attributes
    ----------
    stream
        The rewritten stream.
    onset
        Index of the first drifted event; None for the control.
    drifted
        Which events the drift changed (for per-segment figures).
    """

    stream: RatingStream
    onset: int | None
    drifted: np.ndarray


def _range(ratings: np.ndarray) -> tuple[float, float]:
    """The lowest and highest rating of a stream, its scale's ends."""
    if not ratings.size:
        return RATING_RANGE
    return float(ratings.min()), float(ratings.max())


def _invert(ratings: np.ndarray) -> np.ndarray:
    """Taste inversion: r becomes (low + high) - r on the stream's scale, so the top
    rating becomes the lowest (5 stars become half a star on ml-latest-small, 1 star
    on MovieLens 1M)."""
    low, high = _range(ratings)
    return low + high - ratings


def _chosen(ids: list[str], share: float, seed: int) -> set[str]:
    population = sorted(set(ids))
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(population), size=int(round(share * len(population))), replace=False)
    return {population[i] for i in picked}


def sudden(stream: RatingStream, onset: int, seed: int) -> PlantedDrift:
    """30 % of users invert their taste at ``onset``."""
    users = _chosen(stream.user_ids, 0.3, seed)
    drifted = np.array([user in users for user in stream.user_ids]) & (
        np.arange(len(stream)) >= onset
    )
    ratings = np.where(drifted, _invert(stream.ratings), stream.ratings)
    return PlantedDrift(_with_ratings(stream, ratings), onset, drifted)


def gradual(stream: RatingStream, onset: int, seed: int, ramp: int = 20_000) -> PlantedDrift:
    """The same users invert, each event with a probability ramping 0 to 1 over ``ramp``."""
    users = _chosen(stream.user_ids, 0.3, seed)
    position = np.arange(len(stream))
    chance = np.clip((position - onset) / ramp, 0.0, 1.0)
    coin = np.random.default_rng(seed + 1).random(len(stream))
    drifted = np.array([user in users for user in stream.user_ids]) & (coin < chance)
    ratings = np.where(drifted, _invert(stream.ratings), stream.ratings)
    return PlantedDrift(_with_ratings(stream, ratings), onset, drifted)


def item_shift(stream: RatingStream, onset: int, seed: int) -> PlantedDrift:
    """20 % of items are rated 1.5 stars lower from ``onset`` on (clipped to the range)."""
    items = _chosen(stream.item_ids, 0.2, seed)
    drifted = np.array([item in items for item in stream.item_ids]) & (
        np.arange(len(stream)) >= onset
    )
    low, high = _range(stream.ratings)
    ratings = np.where(drifted, np.clip(stream.ratings - 1.5, low, high), stream.ratings)
    return PlantedDrift(_with_ratings(stream, ratings), onset, drifted)


def new_cohort(stream: RatingStream, onset: int, seed: int, share: float = 0.3) -> PlantedDrift:
    """From ``onset`` on, ``share`` of the events come from a burst of new users whose
    taste is the population's inverted: each takes over 50 consecutive draws."""
    rng = np.random.default_rng(seed)
    after = np.flatnonzero(np.arange(len(stream)) >= onset)
    taken = np.sort(rng.choice(after, size=int(share * after.size), replace=False))
    drifted = np.zeros(len(stream), dtype=bool)
    drifted[taken] = True
    users = list(stream.user_ids)
    for rank, index in enumerate(taken):
        users[index] = f"cohort-{rank // 50}"
    ratings = np.where(drifted, _invert(stream.ratings), stream.ratings)
    rewritten = RatingStream(users, list(stream.item_ids), ratings, stream.timestamps.copy())
    return PlantedDrift(rewritten, onset, drifted)


def control(stream: RatingStream, onset: int, seed: int) -> PlantedDrift:
    """Nothing planted: every alert is a false alarm."""
    return PlantedDrift(stream, None, np.zeros(len(stream), dtype=bool))


SCENARIOS: dict[str, Callable[[RatingStream, int, int], PlantedDrift]] = {
    "sudden": sudden,
    "gradual": gradual,
    "item_shift": item_shift,
    "new_cohort": new_cohort,
    "control": control,
}


def plant(name: str, stream: RatingStream, at: float = 0.6, seed: int = 7) -> PlantedDrift:
    """Scenario ``name`` planted at fraction ``at`` of ``stream``.

    Examples
    --------
    >>> base = synthetic_stream(n_events=2_000, seed=1)
    >>> planted = plant("sudden", base, at=0.5)
    >>> planted.onset, bool(planted.drifted[:1_000].any()), bool(planted.drifted.any())
    (1000, False, True)
    """
    try:
        build = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose from {sorted(SCENARIOS)}") from None
    return build(stream, int(at * len(stream)), seed)


def synthetic_stream(
    n_users: int = 2_000,
    n_items: int = 1_500,
    n_events: int = 100_000,
    factors: int = 6,
    noise: float = 0.6,
    seed: int = 0,
) -> RatingStream:
    """A stationary stream from a biased matrix-factorisation model.

    Items are drawn by a Zipf-like popularity and users uniformly, so the stream has a
    head and a long tail but no sessions; ratings are the model's score plus Gaussian
    noise, rounded to half stars and clipped to the range.
    """
    rng = np.random.default_rng(seed)
    low, high = RATING_RANGE
    user_bias = rng.normal(0.0, 0.4, n_users)
    item_bias = rng.normal(0.0, 0.4, n_items)
    user_vecs = rng.normal(0.0, 0.5, (n_users, factors))
    item_vecs = rng.normal(0.0, 0.5, (n_items, factors))
    popularity = 1.0 / np.arange(1, n_items + 1) ** 0.8
    users = rng.integers(0, n_users, n_events)
    items = rng.choice(n_items, size=n_events, p=popularity / popularity.sum())
    score = 3.5 + user_bias[users] + item_bias[items]
    score += np.einsum("ij,ij->i", user_vecs[users], item_vecs[items])
    ratings = np.clip(np.round((score + rng.normal(0.0, noise, n_events)) * 2) / 2, low, high)
    return RatingStream(
        [f"su{u}" for u in users],
        [f"si{i}" for i in items],
        ratings,
        np.arange(n_events, dtype=np.float64) + 1.6e9,
    )


def _with_ratings(stream: RatingStream, ratings: np.ndarray) -> RatingStream:
    return RatingStream(list(stream.user_ids), list(stream.item_ids), ratings, stream.timestamps)
