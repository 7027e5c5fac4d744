"""The generator's parameters: distributions, never data.

A :class:`StreamFit` is what :mod:`benchmarks.streams.fit` learns from a ratings file and
what :mod:`benchmarks.streams.generator` draws from. It holds only the parameters of
distributions (a mean, standard deviations, an exponent, cut points) and a few summary
figures of the source for comparison; no rating, user or item of the source survives in
it, so it ships where the data set may not. ``movielens_fit.json`` beside this module is
the fit to MovieLens ml-latest-small (``docs/generator.md``).

Examples
--------
>>> fit = load_fit()
>>> fit.factors, len(fit.user_factor_sd), fit.half_star.levels[0], fit.whole_star.levels[-1]
(8, 8, 0.5, 5.0)
>>> StreamFit.from_dict(fit.to_dict()) == fit
True
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["DEFAULT_FIT", "LogNormal", "RatingScale", "StreamFit", "load_fit"]

#: The fit to MovieLens ml-latest-small, committed beside this module.
DEFAULT_FIT = Path(__file__).resolve().parent / "movielens_fit.json"


@dataclass(frozen=True)
class LogNormal:
    """A count ``floor + ceil(exp(N(mu, sigma)))``: at least ``floor + 1``, heavy-tailed.

    >>> LogNormal(1.0, 0.0, floor=19).draw(np.random.default_rng(0), 3).tolist()
    [22, 22, 22]
    """

    mu: float
    sigma: float
    floor: int = 0
    cap: int = 1_000_000

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mu) and math.isfinite(self.sigma) and self.sigma >= 0):
            raise ValueError(f"need a finite mu and sigma >= 0, got {self}")
        if self.floor < 0 or self.cap < 1:
            raise ValueError(f"need floor >= 0 and cap >= 1, got {self}")

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` counts (int64)."""
        raw = np.ceil(np.exp(rng.normal(self.mu, self.sigma, size)))
        return self.floor + np.clip(raw, 1, self.cap).astype(np.int64)


@dataclass(frozen=True)
class RatingScale:
    """How a latent score becomes a rating: ``levels[k]`` when it falls between cut
    points ``thresholds[k - 1]`` and ``thresholds[k]`` (an ordinal model's link).

    >>> scale = RatingScale((1.0, 2.0, 3.0), (1.5, 2.5))
    >>> scale.rate(np.array([0.0, 2.0, 9.0])).tolist()
    [1.0, 2.0, 3.0]
    >>> scale.invert(np.array([1.0, 3.0])).tolist()
    [3.0, 1.0]
    """

    levels: tuple[float, ...]
    thresholds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.thresholds) != len(self.levels) - 1:
            raise ValueError("need one threshold fewer than levels")
        if list(self.levels) != sorted(set(self.levels)):
            raise ValueError("levels must increase")
        if list(self.thresholds) != sorted(self.thresholds):
            raise ValueError("thresholds must not decrease")

    def rate(self, latent: np.ndarray) -> np.ndarray:
        """Ratings (float64) of latent scores (``n``)."""
        cut = np.searchsorted(np.asarray(self.thresholds), latent, side="right")
        return np.asarray(self.levels)[cut]

    def invert(self, ratings: np.ndarray) -> np.ndarray:
        """Taste inversion on this scale: the top level becomes the bottom one."""
        return self.levels[0] + self.levels[-1] - ratings


@dataclass(frozen=True)
class StreamFit:
    """Parameters of the generating model (``docs/generator.md`` has the equations).

    A rating is ``scale.rate(z)`` with the latent score

        z = global_mean + b_u + b_i + p_u . q_i + noise_sd * e,   e ~ N(0, 1)

    where ``b_u ~ N(user_bias_slope * a_u, user_bias_sd)`` (``a_u`` the user's centred
    log activity), ``b_i ~ N(item_bias_slope * w_i, item_bias_sd)`` (``w_i`` the item's
    centred log popularity), ``p_u ~ N(0, diag(user_factor_sd**2))`` and
    ``q_i ~ N(0, diag(item_factor_sd**2))`` (``factors`` dimensions each), and ``scale``
    is ``half_star`` for a user with probability ``logistic(half_star_logit[0] +
    half_star_logit[1] * a_u)`` (heavy raters use half stars more), ``whole_star``
    otherwise.
    Item ``r`` (by popularity rank) is drawn with weight ``(r + popularity_offset) **
    -popularity_exponent`` among ``catalogue`` items; a user makes ``activity`` events
    in sessions of ``session`` events; ``active_users`` users are active at once, each in
    a session in a round with probability ``session_share``.
    """

    source: str
    events: int
    users: int
    items: int
    global_mean: float
    factors: int
    user_bias_sd: float
    user_bias_slope: float
    item_bias_sd: float
    item_bias_slope: float
    user_factor_sd: tuple[float, ...]
    item_factor_sd: tuple[float, ...]
    noise_sd: float
    half_star_logit: tuple[float, float]
    half_star: RatingScale
    whole_star: RatingScale
    catalogue: int
    popularity_exponent: float
    popularity_offset: float
    activity: LogNormal
    session: LogNormal
    active_users: int
    session_share: float = 0.25
    reference: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if len(self.user_factor_sd) != self.factors or len(self.item_factor_sd) != self.factors:
            raise ValueError("one factor standard deviation per factor")
        if len(self.half_star_logit) != 2:
            raise ValueError("half_star_logit is an intercept and a slope")
        if not 0.0 < self.session_share <= 1.0:
            raise ValueError("session_share must be in (0, 1]")
        if self.catalogue < 1 or self.active_users < 1:
            raise ValueError("need at least one item and one active user")
        for name in ("user_bias_sd", "item_bias_sd", "noise_sd", "popularity_offset"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0")

    @property
    def latent_per_star(self) -> float:
        """Latent units a star spans in the middle of the half-star scale: how a shift
        asked for in stars is made on the latent score."""
        levels, cuts = self.half_star.levels, self.half_star.thresholds
        stars = (levels[-1] + levels[-2]) / 2 - (levels[0] + levels[1]) / 2
        return (cuts[-1] - cuts[0]) / stars if stars > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StreamFit:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown fit parameters: {', '.join(unknown)}")
        values = dict(data)
        for name in ("half_star", "whole_star"):
            scale = values[name]
            values[name] = RatingScale(tuple(scale["levels"]), tuple(scale["thresholds"]))
        for name in ("activity", "session"):
            values[name] = LogNormal(**values[name])
        for name in ("user_factor_sd", "item_factor_sd", "half_star_logit"):
            values[name] = tuple(values[name])
        return cls(**values)

    def save(self, path: Path | str) -> None:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        Path(path).write_text(text + "\n", encoding="utf-8")


def load_fit(path: Path | str | None = None) -> StreamFit:
    """The fit in ``path`` (default: the MovieLens fit shipped with the package)."""
    return StreamFit.from_dict(json.loads(Path(path or DEFAULT_FIT).read_text(encoding="utf-8")))
