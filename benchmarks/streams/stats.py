"""The figures that say whether two rating streams look alike.

The rating histogram, the popularity curve (events per item) and the activity curve
(events per user), each summarised by its Gini coefficient, the share of events on its
top 1 % and a few quantiles, as ``driftline bench generator`` and ``docs/generator.md``
show them side by side.

Examples
--------
>>> gini(np.array([1, 1, 1, 1])), round(gini(np.array([0, 0, 0, 4])), 2)
(0.0, 0.75)
>>> top_share(np.array([5, 1, 1, 1, 1, 1, 1, 1, 1, 1]), 0.1)
0.357...
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.datasets import RatingStream

__all__ = ["compare", "curve", "gini", "histogram", "stream_statistics", "top_share"]

#: The half-star levels every histogram reports, so two histograms line up.
LEVELS = tuple(x / 2 for x in range(1, 11))
QUANTILES = (0.1, 0.5, 0.9, 0.99)


def gini(counts: np.ndarray) -> float:
    """Gini coefficient of non-negative counts: 0 when all equal, near 1 when one has all."""
    values = np.sort(np.asarray(counts, dtype=np.float64))
    n = values.size
    if n == 0 or values.sum() == 0:
        return 0.0
    ranks = np.arange(1, n + 1)
    return float(((2 * ranks - n - 1) * values).sum() / (n * values.sum()))


def top_share(counts: np.ndarray, fraction: float = 0.01) -> float:
    """Share of all events held by the top ``fraction`` of the counts (at least one)."""
    values = np.sort(np.asarray(counts, dtype=np.float64))[::-1]
    top = max(1, int(round(fraction * values.size)))
    return float(values[:top].sum() / values.sum()) if values.sum() else 0.0


def histogram(ratings: np.ndarray) -> dict[str, float]:
    """Share of ratings at each half-star level (keys ``"0.5"`` to ``"5.0"``)."""
    shares = {f"{level:.1f}": 0.0 for level in LEVELS}
    levels, counts = np.unique(np.round(np.asarray(ratings) * 2) / 2, return_counts=True)
    for level, count in zip(levels.tolist(), counts.tolist(), strict=True):
        shares[f"{level:.1f}"] = count / len(ratings)
    return shares


def curve(counts: np.ndarray) -> dict[str, float]:
    """A popularity or activity curve in a few figures."""
    values = np.asarray(counts, dtype=np.float64)
    figures = {
        "count": int(values.size),
        "gini": round(gini(values), 4),
        "top_1pct_share": round(top_share(values, 0.01), 4),
        "max_share": round(float(values.max() / values.sum()), 5),
        "mean": round(float(values.mean()), 2),
    }
    for q in QUANTILES:
        figures[f"p{round(q * 100)}"] = float(np.quantile(values, q))
    return figures


def stream_statistics(stream: RatingStream) -> dict[str, Any]:
    """Histogram, popularity and activity figures of a stream."""
    _, per_item = np.unique(np.asarray(stream.item_ids), return_counts=True)
    _, per_user = np.unique(np.asarray(stream.user_ids), return_counts=True)
    return {
        "events": len(stream),
        "rating_mean": round(float(stream.ratings.mean()), 4),
        "rating_sd": round(float(stream.ratings.std()), 4),
        "histogram": {k: round(v, 4) for k, v in histogram(stream.ratings).items()},
        "popularity": curve(per_item),
        "activity": curve(per_user),
    }


def compare(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """Distances between two ``stream_statistics``: the histograms' total variation
    distance (0 alike, 1 disjoint) and the differences of the curves' summaries."""
    levels = set(ours["histogram"]) | set(theirs["histogram"])
    tv = 0.5 * sum(
        abs(ours["histogram"].get(k, 0.0) - theirs["histogram"].get(k, 0.0)) for k in levels
    )
    result = {"histogram_tv_distance": round(tv, 4)}
    for name in ("popularity", "activity"):
        for key in ("gini", "top_1pct_share"):
            result[f"{name}_{key}_difference"] = round(ours[name][key] - theirs[name][key], 4)
    return result
