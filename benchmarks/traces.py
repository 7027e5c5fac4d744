"""Arrival-rate traces for replays, shaped after SandPiper's Table II.

SandPiper (Ali et al., §II-A, Table II, Fig. 3) drives its retraining study with data
updates per second (DUPS) modelled on four public traces. Their published statistics are

=========  =====  =====  =========
trace      min    max    average
=========  =====  =====  =========
Wiki       218    331    279.68
Berkeley   10     240    74.95
Twitter    1214   6978   3346.76
WITS       90     2335   423.45
=========  =====  =====  =========

The raw traces are not redistributable, so each one here is a seeded synthetic shape
with the character the paper describes (Wiki smooth, Twitter with a recurring
minute-of-hour pattern, WITS with unpredictable flash crowds and a high peak-to-median
ratio), calibrated so that its minimum, maximum and time average over one period equal
the table's row. Calibration: build a shape, rescale it affinely to ``[0, 1]`` (this
pins the minimum and maximum), then raise it to the power ``gamma`` that makes its mean
the table's ``(avg - min) / (max - min)``; the power keeps 0 and 1 where they are, and
the mean falls monotonically in ``gamma``, so a bisection finds it.

A trace holds one rate per second of its period (the paper's updates "arrive every
second"): the rate is piecewise constant and repeats after the period. ``speed``
compresses time: at speed ``x`` the trace plays ``x`` times faster, so every rate is
multiplied by ``x`` and the period divided by ``x``; the same events arrive at the same
points of the trace, only sooner.

Examples
--------
>>> trace = make_trace("wiki", seed=0)
>>> round(trace.min_rate), round(trace.max_rate), round(trace.mean_rate, 2)
(218, 331, 279.68)
>>> fast = trace.scaled(10)
>>> round(fast.mean_rate, 1), fast.period_s
(2796.8, 360.0)
>>> make_trace("constant", rate=250).time_until(1000)
4.0

References
----------
SandPiper: a scalable and cost-efficient continual-learning framework for recommendation
systems, Table II ("Breakdown of data updates per second").
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "DEFAULT_CONSTANT_RATE",
    "DEFAULT_PERIOD_S",
    "TABLE_II",
    "TRACES",
    "Trace",
    "TraceStats",
    "calibrate",
    "make_trace",
]

DEFAULT_PERIOD_S = 3600
DEFAULT_CONSTANT_RATE = 1000.0


@dataclass(frozen=True)
class TraceStats:
    """Events per second of one trace: minimum, maximum and time average."""

    min_rate: float
    max_rate: float
    mean_rate: float

    def __post_init__(self) -> None:
        if not 0 < self.min_rate <= self.mean_rate <= self.max_rate:
            raise ValueError(f"need 0 < min <= mean <= max, got {self}")


TABLE_II: dict[str, TraceStats] = {
    "wiki": TraceStats(218.0, 331.0, 279.68),
    "berkeley": TraceStats(10.0, 240.0, 74.95),
    "twitter": TraceStats(1214.0, 6978.0, 3346.76),
    "wits": TraceStats(90.0, 2335.0, 423.45),
}


@dataclass(frozen=True, eq=False)
class Trace:
    """A periodic, piecewise-constant arrival rate.

    Parameters
    ----------
    name
        The trace's name, for reports.
    rates
        Events per second for each second of one period at speed 1 (``period`` floats,
        all positive).
    speed
        Time compression: rates are multiplied by ``speed``, the period divided by it.
    """

    name: str
    rates: np.ndarray
    speed: float = 1.0
    _cumulative: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rates = np.asarray(self.rates, dtype=float)
        if rates.ndim != 1 or rates.size == 0:
            raise ValueError("rates must be a non-empty 1-d array")
        if not np.all(np.isfinite(rates)) or rates.min() <= 0:
            raise ValueError("rates must be finite and positive")
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise ValueError(f"speed must be a positive number, got {self.speed!r}")
        rates.setflags(write=False)
        cumulative = np.concatenate([[0.0], np.cumsum(rates)])
        cumulative.setflags(write=False)
        object.__setattr__(self, "rates", rates)
        object.__setattr__(self, "_cumulative", cumulative)

    @property
    def period_s(self) -> float:
        """Seconds of wall time one period takes at this speed."""
        return self.rates.size / self.speed

    @property
    def min_rate(self) -> float:
        return float(self.rates.min()) * self.speed

    @property
    def max_rate(self) -> float:
        return float(self.rates.max()) * self.speed

    @property
    def mean_rate(self) -> float:
        """Time average over one period (events per second)."""
        return float(self._cumulative[-1] / self.rates.size) * self.speed

    def scaled(self, speed: float) -> Trace:
        """The same trace played ``speed`` times faster than this one."""
        return Trace(self.name, self.rates, self.speed * speed)

    def rate(self, t: float) -> float:
        """Events per second at ``t`` seconds after the start."""
        second = int(math.floor(t * self.speed)) % self.rates.size
        return float(self.rates[second]) * self.speed

    def cumulative(self, t: float) -> float:
        """Events due by ``t`` seconds after the start: the integral of ``rate`` over [0, t]."""
        tau = max(t, 0.0) * self.speed
        size = self.rates.size
        cycles, rest = divmod(tau, size)
        second = min(int(rest), size - 1)
        within = rest - second
        total = self._cumulative[-1]
        return float(cycles * total + self._cumulative[second] + within * self.rates[second])

    def time_until(self, n: float) -> float:
        """Seconds after the start at which ``n`` events are due (inverse of ``cumulative``)."""
        if n <= 0:
            return 0.0
        total = float(self._cumulative[-1])
        cycles, rest = divmod(float(n), total)
        if rest == 0.0:
            cycles, rest = cycles - 1, total
        second = int(np.searchsorted(self._cumulative, rest, side="left")) - 1
        second = min(max(second, 0), self.rates.size - 1)
        within = (rest - self._cumulative[second]) / self.rates[second]
        return float((cycles * self.rates.size + second + within) / self.speed)

    def due_by(self, t: float) -> int:
        """Whole events due by ``t`` (tolerant of rounding at the boundaries)."""
        return int(math.floor(self.cumulative(t) + 1e-9))


def calibrate(shape: np.ndarray, stats: TraceStats, tol: float = 1e-10) -> np.ndarray:
    """Rescale ``shape`` so its min, max and mean are exactly those of ``stats``.

    The shape is mapped affinely onto ``[0, 1]``, raised to the power ``gamma`` whose mean
    is the target fraction ``(mean - min) / (max - min)`` (found by bisection on
    ``log gamma``), and mapped onto ``[min, max]``.

    >>> rates = calibrate(np.sin(np.linspace(0, 6.28, 1000)), TraceStats(10, 20, 13))
    >>> float(rates.min()), float(rates.max()), round(float(rates.mean()), 6)
    (10.0, 20.0, 13.0)
    """
    shape = np.asarray(shape, dtype=float)
    low, high = float(shape.min()), float(shape.max())
    span = stats.max_rate - stats.min_rate
    if high == low or span == 0:
        return np.full(shape.shape, stats.mean_rate if span == 0 else stats.min_rate)
    unit = (shape - low) / (high - low)
    target = (stats.mean_rate - stats.min_rate) / span
    lo, hi = math.log(1e-4), math.log(1e4)  # mean(unit ** gamma) falls as gamma grows
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        mean = float(np.mean(unit ** math.exp(mid)))
        if abs(mean - target) < tol:
            break
        if mean > target:
            lo = mid
        else:
            hi = mid
    else:
        raise ValueError(f"cannot calibrate this shape to a mean fraction of {target:.4f}")
    return stats.min_rate + span * unit ** math.exp(mid)


def _smooth_noise(rng: np.random.Generator, size: int, window: int) -> np.ndarray:
    """Gaussian noise smoothed by a circular moving average, scaled to unit variance."""
    noise = rng.standard_normal(size)
    kernel = np.ones(window) / window
    padded = np.concatenate([noise[-window:], noise, noise[:window]])
    smooth = np.convolve(padded, kernel, mode="same")[window:-window]
    return smooth / smooth.std()


def _wiki_shape(rng: np.random.Generator, size: int) -> np.ndarray:
    """Smooth and diurnal-like: one slow cycle per period, a gentle harmonic, little noise."""
    phase = 2 * np.pi * np.arange(size) / size
    slow = 0.5 - 0.5 * np.cos(phase) + 0.1 * np.sin(3 * phase + rng.uniform(0, 2 * np.pi))
    return slow + 0.03 * _smooth_noise(rng, size, max(size // 30, 1))


def _berkeley_shape(rng: np.random.Generator, size: int) -> np.ndarray:
    """Web traffic: a log-normal level wandering over minutes with per-second jitter."""
    level = 0.8 * _smooth_noise(rng, size, max(size // 60, 1))
    jitter = 0.25 * rng.standard_normal(size)
    return np.exp(level + jitter)


def _twitter_shape(rng: np.random.Generator, size: int) -> np.ndarray:
    """A profile that recurs every minute, its level set by the minute of the hour."""
    seconds = np.arange(size)
    in_minute = seconds % 60
    burst = np.exp(-in_minute / 6.0) + 0.35 * np.exp(-(((in_minute - 30) / 4.0) ** 2))
    minute_levels = np.exp(0.3 * rng.standard_normal(60))  # one per minute of the hour
    level = minute_levels[(seconds // 60) % 60]
    return 0.6 + level * burst + 0.05 * rng.standard_normal(size)


def _wits_shape(rng: np.random.Generator, size: int) -> np.ndarray:
    """A quiet, noisy baseline hit by flash crowds at random times with heavy-tailed peaks."""
    seconds = np.arange(size)
    shape = 1.0 + 0.08 * _smooth_noise(rng, size, 10) + 0.05 * rng.standard_normal(size)
    n_crowds = max(int(rng.poisson(8 * size / 3600)), 1)
    for start in rng.uniform(0, size, n_crowds):
        height = rng.lognormal(mean=1.0, sigma=0.8)
        rise, decay = rng.uniform(3, 15), rng.uniform(15, 120)
        offset = (seconds - start) % size  # wraps around so the trace stays periodic
        pulse = np.where(offset < rise, offset / rise, np.exp(-(offset - rise) / decay))
        shape += height * pulse
    return shape


def _calibrated(
    name: str, builder: Callable[[np.random.Generator, int], np.ndarray]
) -> Callable[..., Trace]:
    def build(*, seed: int = 0, period_s: int = DEFAULT_PERIOD_S, rate: float | None = None):
        if rate is not None:
            raise ValueError(f"--rate applies to the constant trace only, not {name!r}")
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])  # own draws per trace
        return Trace(name, calibrate(builder(rng, period_s), TABLE_II[name]))

    return build


def _constant(
    *, seed: int = 0, period_s: int = DEFAULT_PERIOD_S, rate: float | None = None
) -> Trace:
    del seed  # nothing random about it
    rate = DEFAULT_CONSTANT_RATE if rate is None else rate
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number, got {rate!r}")
    return Trace("constant", np.full(period_s, float(rate)))


TRACES: dict[str, Callable[..., Trace]] = {
    "constant": _constant,
    "wiki": _calibrated("wiki", _wiki_shape),
    "berkeley": _calibrated("berkeley", _berkeley_shape),
    "twitter": _calibrated("twitter", _twitter_shape),
    "wits": _calibrated("wits", _wits_shape),
}


def make_trace(
    name: str,
    *,
    speed: float = 1.0,
    seed: int = 0,
    period_s: int = DEFAULT_PERIOD_S,
    rate: float | None = None,
) -> Trace:
    """The trace ``name`` from ``TRACES``, played at ``speed``.

    ``rate`` is the constant trace's rate (default ``DEFAULT_CONSTANT_RATE``); the other
    traces take their rates from Table II and reject it. Raises ``KeyError`` for an
    unknown name and ``ValueError`` for bad arguments.
    """
    if name not in TRACES:
        raise KeyError(f"unknown trace {name!r}; choose from {', '.join(sorted(TRACES))}")
    if period_s < 1:
        raise ValueError(f"period_s must be >= 1, got {period_s!r}")
    return TRACES[name](seed=seed, period_s=period_s, rate=rate).scaled(speed)
