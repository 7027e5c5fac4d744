"""Paired comparison of two versions on the same live events, with users as the unit.

Both versions predict every labelled event (each with its own fold-in, before learning
it) and rank the ranking sample's events, so each event gives a paired difference, new
minus old: of the squared error, and on ranked events of the hit (in the top 10 or not)
and of the NDCG@10. Events of one user are not independent (a user whose taste a
version misses is missed on every one of their events), so the mean difference gets a
cluster-robust interval with users as clusters (Liang & Zeger 1986; Cameron & Miller
2015, "A practitioner's guide to cluster-robust inference"): the variance comes from
the spread of the users' summed differences around the mean, not of the events'.

References
----------
Liang, K.-Y. & Zeger, S. L. (1986). Longitudinal data analysis using generalized linear
models. Biometrika 73(1). Cameron, A. C. & Miller, D. L. (2015). A practitioner's guide
to cluster-robust inference. Journal of Human Resources 50(2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.special import ndtri, stdtrit

from drift.ranking import DEFAULT_K, hits, ndcg

__all__ = ["ClusteredMean", "Interval", "PairedComparison", "UserCodes"]


@dataclass(frozen=True)
class Interval:
    """An estimate and its two-sided interval at some confidence."""

    estimate: float
    low: float
    high: float

    def as_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high}


class UserCodes:
    """Users as consecutive codes, shared by the means of one comparison so that a
    batch's users are looked up once."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._index)

    def encode(self, users: Sequence[str]) -> np.ndarray:
        index = self._index
        setdefault = index.setdefault
        return np.fromiter(
            (setdefault(user, len(index)) for user in users), dtype=np.int64, count=len(users)
        )


class ClusteredMean:
    """The mean of per-event values and its cluster-robust interval, users as clusters.

    Only each user's sum and count are kept (two floats a user), so the interval of
    any number of events costs one pass over the users.

    Examples
    --------
    >>> mean = ClusteredMean()
    >>> mean.add(["a", "a", "b", "c"], np.array([1.0, 3.0, 1.0, 3.0]))
    >>> mean.events, mean.clusters, mean.mean
    (4, 3, 2.0)
    >>> interval = mean.interval(0.95)
    >>> interval.estimate, interval.low < 2.0 < interval.high
    (2.0, True)
    """

    def __init__(self, codes: UserCodes | None = None) -> None:
        self.codes = UserCodes() if codes is None else codes
        # Per user code, with room to grow: row 0 the sum, row 1 the count (one array,
        # replaced whole when it grows, so a reader on another thread never sees the
        # two rows of different lengths).
        self._table: np.ndarray = np.zeros((2, 64))
        self._events = 0

    def add(self, users: Sequence[str], values: np.ndarray) -> None:
        """Add one value per event ``(n,)``, each belonging to ``users[j]``."""
        self.add_coded(self.codes.encode(users), values)

    def add_coded(self, codes: np.ndarray, values: np.ndarray) -> None:
        """``add`` with the users already encoded by ``codes``."""
        if not len(codes):
            return
        size = len(self.codes)
        table = self._table
        if size > table.shape[1]:
            grown = np.zeros((2, max(size, 2 * table.shape[1])))
            grown[:, : table.shape[1]] = table
            self._table = table = grown
        table[0, :size] += np.bincount(codes, weights=values, minlength=size)
        table[1, :size] += np.bincount(codes, minlength=size)
        self._events += len(codes)

    @property
    def events(self) -> int:
        return self._events

    @property
    def clusters(self) -> int:
        """Users with at least one event here."""
        return int(np.count_nonzero(self._table[1]))

    @property
    def mean(self) -> float:
        return float(self._table[0].sum()) / self._events if self._events else math.nan

    def interval(self, confidence: float) -> Interval:
        """The mean with its two-sided ``confidence`` interval: CR1 variance (the
        G/(G-1) small-sample factor) and Student's t with G-1 degrees of freedom; an
        infinite interval with fewer than two users."""
        table, events = self._table, self._events
        groups = int(np.count_nonzero(table[1]))
        if groups < 2 or not events:
            return Interval(self.mean, -math.inf, math.inf)
        mean = float(table[0].sum()) / events
        residual = table[0] - table[1] * mean
        variance = groups / (groups - 1) * float(residual @ residual) / events**2
        half = _t_quantile(0.5 + confidence / 2, groups - 1) * math.sqrt(variance)
        return Interval(mean, mean - half, mean + half)


def _t_quantile(probability: float, freedom: int) -> float:
    """Student's t quantile: exact below 8 degrees of freedom, else the normal
    quantile's Cornish-Fisher expansion in 1/ν (Abramowitz & Stegun 26.7.5), within
    3e-4 of it there, for a microsecond where scipy takes hundreds: a shadow's users,
    and so ν, grow batch by batch.

    >>> round(_t_quantile(0.975, 30), 4), round(float(stdtrit(30, 0.975)), 4)
    (2.0423, 2.0423)
    """
    if freedom < 8:
        return _exact_t_quantile(probability, freedom)
    z = _normal_quantile(probability)
    v = float(freedom)
    z2 = z * z
    return z * (
        1.0
        + (z2 + 1.0) / (4.0 * v)
        + ((5.0 * z2 + 16.0) * z2 + 3.0) / (96.0 * v * v)
        + (((3.0 * z2 + 19.0) * z2 + 17.0) * z2 - 15.0) / (384.0 * v**3)
        + ((((79.0 * z2 + 776.0) * z2 + 1482.0) * z2 - 1920.0) * z2 - 945.0) / (92160.0 * v**4)
    )


@lru_cache(maxsize=64)
def _exact_t_quantile(probability: float, freedom: int) -> float:
    return float(stdtrit(freedom, probability))


@lru_cache(maxsize=16)
def _normal_quantile(probability: float) -> float:
    return float(ndtri(probability))


class PairedComparison:
    """A new version against an old one on the same events (new minus old).

    ``rmse_diff`` is relative (the new RMSE over the old, minus one) with its interval
    taken from the squared errors' paired interval; ``hit_rate_diff`` and
    ``ndcg_diff`` are absolute differences of the means.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> users = [f"u{j % 40}" for j in range(2_000)]
    >>> truth = rng.normal(3.5, 1.0, 2_000)
    >>> old, new = truth + rng.normal(0, 1.0, 2_000), truth + rng.normal(0, 0.8, 2_000)
    >>> pair = PairedComparison()
    >>> pair.add_errors(users, (old - truth) ** 2, (new - truth) ** 2)
    >>> figures = pair.rmse_diff(0.95)
    >>> figures.high < 0  # the new version is clearly better
    True
    """

    def __init__(self, k: int = DEFAULT_K) -> None:
        self.k = k
        self._codes = UserCodes()
        self.squared = ClusteredMean(self._codes)
        self.hits = ClusteredMean(self._codes)
        self.gains = ClusteredMean(self._codes)
        self._old_squared = 0.0
        self._old_hits = 0.0
        self._old_gains = 0.0

    def codes_of(self, users: Sequence[str]) -> np.ndarray:
        """Each user's code in this comparison ``(n,)``: look a batch's users up once,
        then pass their events' codes to ``add_errors`` and ``add_ranks``."""
        return self._codes.encode(users)

    def add_errors(
        self,
        users: Sequence[str] | np.ndarray,
        old_squared: np.ndarray,
        new_squared: np.ndarray,
    ) -> None:
        """Each event's squared error by the old and the new version ``(n,)``; each
        event's user as an id or as its code (``codes_of``)."""
        self.squared.add_coded(self._coded(users), new_squared - old_squared)
        self._old_squared += float(np.sum(old_squared))

    def add_ranks(
        self, users: Sequence[str] | np.ndarray, old_ranks: np.ndarray, new_ranks: np.ndarray
    ) -> None:
        """Each ranked event's rank by the old and the new version ``(m,)``
        (``drift.ranking``: 1 is first, 0 not ranked); users as for ``add_errors``."""
        if not len(old_ranks):
            return
        old_hits, new_hits = hits(old_ranks, self.k), hits(new_ranks, self.k)
        old_gains, new_gains = ndcg(old_ranks, self.k), ndcg(new_ranks, self.k)
        coded = self._coded(users)
        self.hits.add_coded(coded, new_hits - old_hits)
        self.gains.add_coded(coded, new_gains - old_gains)
        self._old_hits += float(old_hits.sum())
        self._old_gains += float(old_gains.sum())

    def _coded(self, users: Sequence[str] | np.ndarray) -> np.ndarray:
        if isinstance(users, np.ndarray) and users.dtype.kind == "i":
            return users
        return self._codes.encode(list(users))

    @property
    def events(self) -> int:
        return self.squared.events

    @property
    def ranked_events(self) -> int:
        return self.hits.events

    @property
    def old_mse(self) -> float:
        return self._old_squared / self.events if self.events else math.nan

    @property
    def old_hit_rate(self) -> float:
        return self._old_hits / self.ranked_events if self.ranked_events else math.nan

    def rmse_diff(self, confidence: float) -> Interval:
        """The new RMSE relative to the old (−0.01: 1 % lower) with its interval."""
        paired, level = self.squared.interval(confidence), self.old_mse
        if not level > 0:
            return Interval(math.nan, -math.inf, math.inf)

        def relative(difference: float) -> float:
            if math.isinf(difference):
                return difference
            return math.sqrt(max(0.0, 1.0 + difference / level)) - 1.0

        return Interval(relative(paired.estimate), relative(paired.low), relative(paired.high))

    def hit_rate_diff(self, confidence: float) -> Interval:
        return self.hits.interval(confidence)

    def ndcg_diff(self, confidence: float) -> Interval:
        return self.gains.interval(confidence)

    def figures(self, confidence: float) -> dict[str, Any]:
        """What the comparison found so far, JSON-ready (infinities as None)."""
        ranked = self.ranked_events
        mse = self.old_mse
        return {
            "events_compared": self.events,
            "users": self.squared.clusters,
            "ranked_events": ranked,
            "confidence": confidence,
            "old_rmse": _finite(math.sqrt(mse)) if mse == mse else None,
            "old_hit_rate": _finite(self.old_hit_rate),
            "rmse_diff": _interval(self.rmse_diff(confidence)),
            "hit_rate_diff": _interval(self.hit_rate_diff(confidence)) if ranked else None,
            "ndcg_diff": _interval(self.ndcg_diff(confidence)) if ranked else None,
        }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _interval(interval: Interval) -> dict[str, float | None]:
    return {key: _finite(value) for key, value in interval.as_dict().items()}
