"""Who rates what: a catalogue with Zipf-like popularity, and users drawn fresh.

Items are fixed for a stream: ``catalogue`` of them, their popularity weights following a
Zipf-Mandelbrot law over a random ranking (so an item's id says nothing of its rank),
their biases leaning with their popularity and their factor vectors drawn from the fit.
Users are never reused: each one is drawn when it joins, with its own factors, bias,
rating scale and a budget of events from the heavy-tailed activity distribution, and it
leaves once the budget is spent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from benchmarks.streams.params import LogNormal, StreamFit

__all__ = [
    "Catalogue",
    "FreshUsers",
    "Users",
    "activity_centre",
    "alias_table",
    "item_id",
    "user_id",
    "zipf_weights",
]


def user_id(serial: int) -> str:
    """The id a user goes by in a generated stream: ``u`` and its serial number."""
    return f"u{serial}"


def item_id(index: int) -> str:
    """The id of an item of the catalogue: ``i`` and its index."""
    return f"i{index}"


def zipf_weights(n: int, exponent: float, offset: float) -> np.ndarray:
    """Zipf-Mandelbrot weights ``(r + offset) ** -exponent`` for ranks 1..n, summing to 1.

    >>> w = zipf_weights(4, 1.0, 0.0)
    >>> [round(float(x), 3) for x in w]
    [0.48, 0.24, 0.16, 0.12]
    """
    weights = (np.arange(1, n + 1, dtype=np.float64) + offset) ** -exponent
    return weights / weights.sum()


def alias_table(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vose's alias table of ``weights`` (``n``): draw a column uniformly, keep it with
    probability ``keep[column]``, else take ``other[column]``; O(1) a draw.

    >>> keep, other = alias_table(np.array([0.5, 0.25, 0.25]))
    >>> [round(float(keep[i]) + float(((other == i) * (1 - keep)).sum()), 2) for i in range(3)]
    [1.5, 0.75, 0.75]
    """
    n = weights.size
    scaled = (weights / weights.sum() * n).tolist()
    keep, other = np.ones(n), np.arange(n, dtype=np.int64)
    small = [i for i, w in enumerate(scaled) if w < 1.0]
    large = [i for i, w in enumerate(scaled) if w >= 1.0]
    while small and large:
        low, high = small.pop(), large[-1]
        keep[low], other[low] = scaled[low], high
        scaled[high] -= 1.0 - scaled[low]
        if scaled[high] < 1.0:
            small.append(large.pop())
    return keep, other


def _centred_log(values: np.ndarray) -> np.ndarray:
    logs = np.log(values)
    return logs - logs.mean()


@dataclass(frozen=True)
class Catalogue:
    """``n`` items: popularity (``n``, sums to 1), bias (``n``), factors (``n x k``), and
    a uniform draw per item that a planted drift compares with its share."""

    popularity: np.ndarray
    bias: np.ndarray
    factors: np.ndarray
    mark: np.ndarray
    _alias: tuple[np.ndarray, np.ndarray] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_alias", alias_table(self.popularity))

    @classmethod
    def draw(cls, fit: StreamFit, rng: np.random.Generator, n: int | None = None) -> Catalogue:
        n = fit.catalogue if n is None else n
        if n < 1:
            raise ValueError(f"need at least one item, got {n}")
        weights = zipf_weights(n, fit.popularity_exponent, fit.popularity_offset)
        popularity = weights[rng.permutation(n)]
        bias = fit.item_bias_slope * _centred_log(popularity) + rng.normal(0.0, fit.item_bias_sd, n)
        factors = rng.normal(0.0, 1.0, (n, fit.factors)) * np.asarray(fit.item_factor_sd)
        return cls(popularity, bias, factors, rng.random(n))

    def __len__(self) -> int:
        return self.popularity.size

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` item indices drawn by popularity (int64)."""
        keep, other = self._alias
        # One uniform draw an event: its whole part picks the column, its fraction the
        # coin, so the first n draws of a chunk never depend on the chunk's length.
        scaled = rng.random(size) * len(self)
        column = scaled.astype(np.int64)
        return np.where(scaled - column < keep[column], column, other[column])


@dataclass(frozen=True)
class Users:
    """Columns of a set of users: serial number, budget of events, bias (``n``), factors
    (``n x k``), whether they rate in half stars, and a uniform draw per user that a
    planted drift compares with its share."""

    serial: np.ndarray
    budget: np.ndarray
    bias: np.ndarray
    factors: np.ndarray
    half_star: np.ndarray
    mark: np.ndarray

    def __len__(self) -> int:
        return self.serial.size

    def take(self, rows: np.ndarray) -> Users:
        return Users(
            self.serial[rows],
            self.budget[rows],
            self.bias[rows],
            self.factors[rows],
            self.half_star[rows],
            self.mark[rows],
        )

    @staticmethod
    def concat(parts: list[Users]) -> Users:
        return Users(
            *(
                np.concatenate([getattr(p, name) for p in parts])
                for name in ("serial", "budget", "bias", "factors", "half_star", "mark")
            )
        )


class FreshUsers:
    """Users in order of arrival, drawn in blocks: the ``n``-th user of a seed is the same
    whatever the stream around it, and none is ever drawn twice.

    >>> from benchmarks.streams.params import load_fit
    >>> fresh = FreshUsers(load_fit(), np.random.default_rng(0))
    >>> first, second = fresh.take(2), fresh.take(3)
    >>> first.serial.tolist(), second.serial.tolist()
    ([0, 1], [2, 3, 4])
    >>> bool((first.budget >= 20).all())
    True
    """

    def __init__(self, fit: StreamFit, rng: np.random.Generator, block: int = 4_096) -> None:
        self.fit = fit
        self.rng = rng
        self.block = block
        self.drawn = 0
        self._blocks: list[Users] = []  # drawn, not yet taken; the first from _used on
        self._used = 0

    def _draw_block(self) -> Users:
        fit, rng, n = self.fit, self.rng, self.block
        budget = fit.activity.draw(rng, n)
        activity = np.log(budget) - activity_centre(fit.activity)
        bias = fit.user_bias_slope * activity + rng.normal(0.0, fit.user_bias_sd, n)
        factors = rng.normal(0.0, 1.0, (n, fit.factors)) * np.asarray(fit.user_factor_sd)
        intercept, slope = fit.half_star_logit
        half = rng.random(n) < 1.0 / (1.0 + np.exp(-(intercept + slope * activity)))
        serial = np.arange(self.drawn, self.drawn + n, dtype=np.int64)
        self.drawn += n
        return Users(serial, budget, bias, factors, half, rng.random(n))

    def _ready(self, n: int) -> None:
        while sum(len(b) for b in self._blocks) - self._used < n:
            self._blocks.append(self._draw_block())

    def budgets(self, n: int) -> list[int]:
        """Budgets of the next ``n`` users, without taking them."""
        self._ready(n)
        ahead = np.concatenate([b.budget for b in self._blocks])[self._used : self._used + n]
        return ahead.tolist()

    def take(self, n: int) -> Users:
        """The next ``n`` users."""
        self._ready(n)
        parts = []
        while n > 0:
            first = self._blocks[0]
            stop = min(self._used + n, len(first))
            parts.append(first.take(np.arange(self._used, stop)))
            n -= stop - self._used
            self._used = stop
            if stop == len(first):
                self._blocks.pop(0)
                self._used = 0
        if not parts:
            return self._draw_empty()
        return parts[0] if len(parts) == 1 else Users.concat(parts)

    def _draw_empty(self) -> Users:
        self._ready(1)
        return self._blocks[0].take(np.arange(0))


def activity_centre(activity: LogNormal) -> float:
    """The log of the median budget: a user's log activity is measured from it."""
    return float(np.log(activity.floor + np.exp(activity.mu)))
