"""Synthetic rating streams with a known (planted) drift, for tests.

Ratings come from a biased low-rank model, the same family Driftline learns::

    rating = 3.5 + user_bias[u] + item_bias[i] + user_vec[u] . item_vec[i] + noise

clipped to [0.5, 5.0] and rounded to the nearest half star, like MovieLens. At
``drift_at`` every item's bias and latent vector are redrawn at once: the catalogue's
appeal changes overnight, so a model fit before the drift predicts badly after it.
Because the truth is known, a test can assert not just "an alert came" but "it came
after the drift point and never before".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.store.events import NewEvent

__all__ = ["ItemMeanBaseline", "planted_drift_stream", "stationary_stream", "write_ratings_tsv"]

GLOBAL_MEAN = 3.5
USER_BIAS_SD = 0.3
ITEM_BIAS_SD = 0.5
# Variance of the user-item dot product, independent of the number of factors.
INTERACTION_VARIANCE = 0.25
START_TIMESTAMP = 1_600_000_000.0


@dataclass(frozen=True)
class _StreamShape:
    """Arguments of a synthetic stream, validated once."""

    n_users: int
    n_items: int
    n_events: int
    drift_at: int
    factors: int
    noise: float
    seed: int

    def __post_init__(self) -> None:
        for name in ("n_users", "n_items", "n_events", "factors"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 <= self.drift_at <= self.n_events:
            raise ValueError(f"drift_at must be in [0, n_events], got {self.drift_at!r}")
        if not self.noise >= 0:
            raise ValueError(f"noise must be >= 0, got {self.noise!r}")


def planted_drift_stream(
    n_users: int = 200,
    n_items: int = 300,
    n_events: int = 20_000,
    drift_at: int = 10_000,
    factors: int = 4,
    noise: float = 0.3,
    seed: int = 0,
) -> list[dict]:
    """A rating stream whose generating model changes abruptly at event ``drift_at``.

    Parameters
    ----------
    n_users, n_items
        Population sizes; ids are ``"u0".."u<n_users-1>"`` and ``"i0".."i<n_items-1>"``.
    n_events
        Number of events.
    drift_at
        Index of the first event drawn from the redrawn item model.
    factors
        Latent dimension of the generating model.
    noise
        Standard deviation of the Gaussian noise added before clipping and rounding.
    seed
        Seed; the same arguments always give the same stream.

    Returns
    -------
    list of dict
        Events ``{"event_id", "user_id", "item_id", "rating", "timestamp"}`` in
        strictly increasing timestamp order. A user rates an item at most once while
        ``n_events <= n_users * n_items``.

    Examples
    --------
    >>> events = planted_drift_stream(n_events=4, drift_at=2)
    >>> sorted(events[0])
    ['event_id', 'item_id', 'rating', 'timestamp', 'user_id']
    >>> all(0.5 <= e["rating"] <= 5.0 for e in events)
    True
    """
    shape = _StreamShape(n_users, n_items, n_events, drift_at, factors, noise, seed)
    return _generate(shape)


def as_new_events(stream: list[dict]) -> list[NewEvent]:
    """A generated stream as the ``NewEvent`` records ``Driftline.ingest`` takes."""
    return [
        NewEvent(e["user_id"], e["item_id"], e["rating"], e["timestamp"], e["event_id"])
        for e in stream
    ]


def stationary_stream(
    n_users: int = 200,
    n_items: int = 300,
    n_events: int = 20_000,
    factors: int = 4,
    noise: float = 0.3,
    seed: int = 0,
) -> list[dict]:
    """The same stream as ``planted_drift_stream`` with the same seed, without the drift.

    Up to the drift point of ``planted_drift_stream`` both streams are identical, so a
    test can compare them event for event.
    """
    shape = _StreamShape(n_users, n_items, n_events, n_events, factors, noise, seed)
    return _generate(shape)


def _generate(shape: _StreamShape) -> list[dict]:
    rng = np.random.default_rng(shape.seed)
    scale = (INTERACTION_VARIANCE / shape.factors) ** 0.25
    user_bias = rng.normal(0.0, USER_BIAS_SD, shape.n_users)
    user_vecs = rng.normal(0.0, scale, (shape.n_users, shape.factors))
    # Both item models are always drawn so the stream before the drift does not depend
    # on whether a drift follows.
    item_bias = rng.normal(0.0, ITEM_BIAS_SD, (2, shape.n_items))
    item_vecs = rng.normal(0.0, scale, (2, shape.n_items, shape.factors))
    users, items = _pick_pairs(rng, shape)
    timestamps = START_TIMESTAMP + np.cumsum(rng.exponential(1.0, shape.n_events))
    epoch = (np.arange(shape.n_events) >= shape.drift_at).astype(np.intp)
    raw = (
        GLOBAL_MEAN
        + user_bias[users]
        + item_bias[epoch, items]
        + np.einsum("nk,nk->n", user_vecs[users], item_vecs[epoch, items])
        + rng.normal(0.0, shape.noise, shape.n_events)
    )
    ratings = np.round(np.clip(raw, 0.5, 5.0) * 2.0) / 2.0
    return [
        {
            "event_id": f"s{shape.seed}-{n}",
            "user_id": f"u{u}",
            "item_id": f"i{i}",
            "rating": r,
            "timestamp": t,
        }
        for n, (u, i, r, t) in enumerate(
            zip(users.tolist(), items.tolist(), ratings.tolist(), timestamps.tolist(), strict=True)
        )
    ]


def _pick_pairs(rng: np.random.Generator, shape: _StreamShape) -> tuple[np.ndarray, np.ndarray]:
    """Uniformly random (user, item) pairs, without repeats when there are enough pairs."""
    n_pairs = shape.n_users * shape.n_items
    if shape.n_events <= n_pairs:
        flat = rng.choice(n_pairs, size=shape.n_events, replace=False)
    else:
        flat = rng.integers(0, n_pairs, size=shape.n_events)
    return flat // shape.n_items, flat % shape.n_items


class ItemMeanBaseline:
    """Predicts an item's mean rating (the global mean for unseen items).

    The simplest model that a planted item drift must break: it is what the item
    biases of a fitted matrix factorisation reduce to.

    Examples
    --------
    >>> events = [{"item_id": "i1", "rating": 4.0}, {"item_id": "i1", "rating": 5.0}]
    >>> baseline = ItemMeanBaseline().fit(events)
    >>> baseline.predict([{"item_id": "i1"}, {"item_id": "i9"}]).tolist()
    [4.5, 4.5]
    """

    def __init__(self) -> None:
        self.global_mean = GLOBAL_MEAN
        self.item_means: dict[str, float] = {}

    def fit(self, events: list[dict]) -> ItemMeanBaseline:
        """Learn per-item means from ``events``; returns ``self``."""
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for event in events:
            sums[event["item_id"]] = sums.get(event["item_id"], 0.0) + event["rating"]
            counts[event["item_id"]] = counts.get(event["item_id"], 0) + 1
        if counts:
            self.global_mean = sum(sums.values()) / sum(counts.values())
        self.item_means = {item: sums[item] / counts[item] for item in sums}
        return self

    def predict(self, events: list[dict]) -> np.ndarray:
        """Predicted ratings for ``events``, shape ``(len(events),)``."""
        return np.array(
            [self.item_means.get(e["item_id"], self.global_mean) for e in events], dtype=float
        )


def write_ratings_tsv(path: Path, stream: list[dict]) -> Path:
    """``stream`` as a MovieLens-style ratings file (user, item, rating, whole-second
    timestamp, tab-separated), for the benchmarks that replay a file; returns ``path``."""
    path.write_text(
        "".join(
            f"{e['user_id']}\t{e['item_id']}\t{e['rating']}\t{int(e['timestamp'])}\n"
            for e in stream
        )
    )
    return path
