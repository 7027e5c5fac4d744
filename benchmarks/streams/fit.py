"""Fit the generator's parameters to a ratings file; run once, keep the JSON.

``python -m benchmarks.streams.fit RATINGS --out benchmarks/streams/movielens_fit.json``
wrote the committed MovieLens fit. The steps (``docs/generator.md`` has the figures):

1. **Activity and sessions.** Events per user, and the lengths of a user's sessions
   (runs of ratings less than ``SESSION_GAP_S`` apart), each fitted with a log-normal
   by its quantiles; ``active_users`` is the mean number of users whose first and last
   ratings straddle an event, ``session_share`` the mean number of sessions open at an
   event's time over ``active_users``.
2. **Popularity.** Zipf-Mandelbrot exponent, offset and catalogue size chosen on a grid
   so that a stream of the data set's length has its rank-frequency curve and number
   of distinct items.
3. **Taste.** A biased matrix factorisation (alternating ridge regressions, ``factors``
   dimensions) on all ratings, rotated so both factor matrices have diagonal second
   moments (an SVD of their product); the biases' and factors' spreads are measured on
   users and items with at least ``WELL_KNOWN`` ratings, whose estimates the ridge has
   not shrunk to nothing, and the biases' slopes on log activity and log popularity
   by least squares.
4. **Scales.** Users who ever rate in half stars get the half-star scale, the others
   the whole-star one; each scale's cut points are the quantiles of the generated
   latent scores at the data set's cumulative rating shares, so the histograms match.
5. **Noise.** Bisection on ``noise_sd`` until the factorisation's error on a random
   tenth held out of a generated stream equals its error on the data set's.

Only parameters of distributions leave this module; no rating, user or item does.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import NormalDist

import numpy as np

from benchmarks.datasets import RatingStream, load_ratings
from benchmarks.streams.generator import GeneratorConfig, StreamGenerator, generate_stream
from benchmarks.streams.params import LogNormal, RatingScale, StreamFit
from benchmarks.streams.population import activity_centre, zipf_weights
from benchmarks.streams.stats import stream_statistics

__all__ = ["fit_ratings", "main"]

#: A user's ratings more than this far apart start a new session.
SESSION_GAP_S = 1_800.0
#: Users and items with fewer ratings are left out of the spreads of biases and factors.
WELL_KNOWN = 10
HALF_LEVELS = tuple(x / 2 for x in range(1, 11))
WHOLE_LEVELS = (1.0, 2.0, 3.0, 4.0, 5.0)


@dataclass(frozen=True)
class Encoded:
    """A ratings file as codes: user and item index and rating per event (``n``)."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    timestamps: np.ndarray
    n_users: int
    n_items: int


@dataclass(frozen=True)
class Factorisation:
    """``mean + user_bias[u] + item_bias[i] + user_factors[u] . item_factors[i]``."""

    mean: float
    user_bias: np.ndarray
    item_bias: np.ndarray
    user_factors: np.ndarray
    item_factors: np.ndarray

    def predict(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        dot = np.einsum("ij,ij->i", self.user_factors[users], self.item_factors[items])
        return self.mean + self.user_bias[users] + self.item_bias[items] + dot


def encode(stream: RatingStream) -> Encoded:
    users, user_codes = np.unique(np.asarray(stream.user_ids), return_inverse=True)
    items, item_codes = np.unique(np.asarray(stream.item_ids), return_inverse=True)
    return Encoded(
        user_codes, item_codes, stream.ratings, stream.timestamps, users.size, items.size
    )


def _ridge(
    groups: np.ndarray, n_groups: int, features: np.ndarray, target: np.ndarray, reg: float
) -> np.ndarray:
    """Per group, the ridge solution of ``features @ w ~ target`` (``n_groups x d``)."""
    d = features.shape[1]
    gram = np.zeros((n_groups, d, d))
    for a in range(d):
        for b in range(a, d):
            column = np.bincount(
                groups, weights=features[:, a] * features[:, b], minlength=n_groups
            )
            gram[:, a, b] = gram[:, b, a] = column
    moment = np.stack(
        [
            np.bincount(groups, weights=features[:, a] * target, minlength=n_groups)
            for a in range(d)
        ],
        axis=1,
    )
    gram += reg * np.eye(d)
    return np.linalg.solve(gram, moment[:, :, None])[:, :, 0]


def factorise(
    data: Encoded, mask: np.ndarray, factors: int, reg: float, seed: int, iterations: int = 15
) -> Factorisation:
    """Alternating ridge regressions of biases and factors on the ratings in ``mask``."""
    rng = np.random.default_rng(seed)
    u, i, r = data.users[mask], data.items[mask], data.ratings[mask]
    mean = float(r.mean())
    user_factors = rng.normal(0.0, 0.1, (data.n_users, factors))
    item_factors = rng.normal(0.0, 0.1, (data.n_items, factors))
    user_bias, item_bias = np.zeros(data.n_users), np.zeros(data.n_items)
    ones = np.ones((r.size, 1))
    for _ in range(iterations):
        solved = _ridge(
            u, data.n_users, np.hstack([ones, item_factors[i]]), r - mean - item_bias[i], reg
        )
        user_bias, user_factors = solved[:, 0], solved[:, 1:]
        solved = _ridge(
            i, data.n_items, np.hstack([ones, user_factors[u]]), r - mean - user_bias[u], reg
        )
        item_bias, item_factors = solved[:, 0], solved[:, 1:]
    return Factorisation(mean, user_bias, item_bias, user_factors, item_factors)


def held_out_rmse(data: Encoded, factors: int, reg: float, seed: int) -> float:
    """The factorisation's RMSE on a random tenth of the ratings, fit on the rest."""
    held = np.random.default_rng(seed).random(data.ratings.size) < 0.1
    model = factorise(data, ~held, factors, reg, seed)
    error = data.ratings[held] - model.predict(data.users[held], data.items[held])
    return float(np.sqrt(np.mean(error**2)))


def _quantile_lognormal(counts: np.ndarray, floor: int) -> LogNormal:
    """A log-normal whose upper quantiles (50 % to 99 %) match ``counts - floor``."""
    probabilities = np.array([0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99])
    z = np.array([NormalDist().inv_cdf(p) for p in probabilities])
    logs = np.log(np.maximum(np.quantile(counts - floor, probabilities), 1.0))
    sigma, mu = np.polyfit(z, logs, 1)
    return LogNormal(float(mu), float(max(sigma, 0.0)), floor=floor)


def _session_ids(data: Encoded) -> tuple[np.ndarray, np.ndarray]:
    """Events in user-then-time order, and the session (a user's ratings split at gaps
    over ``SESSION_GAP_S``) each of them belongs to."""
    order = np.lexsort((data.timestamps, data.users))
    users, stamps = data.users[order], data.timestamps[order]
    starts = np.ones(users.size, dtype=bool)
    starts[1:] = (users[1:] != users[:-1]) | (np.diff(stamps) > SESSION_GAP_S)
    return order, np.cumsum(starts) - 1


def _sessions(data: Encoded) -> np.ndarray:
    """Session lengths."""
    return np.bincount(_session_ids(data)[1])


def _straddling(first: np.ndarray, last: np.ndarray, at: np.ndarray) -> float:
    """Mean number of spans ``[first, last]`` that hold a time of ``at``."""
    started = np.searchsorted(np.sort(first), at, side="right")
    ended = np.searchsorted(np.sort(last), at, side="left")
    return float(np.mean(started - ended))


def _concurrency(data: Encoded, samples: int = 2_000) -> tuple[int, float]:
    """Users active at once (between their first and last ratings) and sessions open at
    once, both averaged over the times of events."""
    at = np.sort(data.timestamps)[:: max(1, data.timestamps.size // samples)]
    first = np.full(data.n_users, np.inf)
    last = np.full(data.n_users, -np.inf)
    np.minimum.at(first, data.users, data.timestamps)
    np.maximum.at(last, data.users, data.timestamps)
    order, session = _session_ids(data)
    stamps = data.timestamps[order]
    opened = np.full(session[-1] + 1, np.inf)
    closed = np.full(session[-1] + 1, -np.inf)
    np.minimum.at(opened, session, stamps)
    np.maximum.at(closed, session, stamps)
    return max(1, round(_straddling(first, last, at))), _straddling(opened, closed, at)


def _rank_curve(counts: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    ordered = np.sort(counts)[::-1]
    padded = np.concatenate([ordered, np.zeros(max(0, ranks.max() - ordered.size))])
    return np.log(np.maximum(padded[ranks - 1], 0.5))


def fit_popularity(per_item: np.ndarray, events: int, seed: int) -> tuple[float, float, int]:
    """Exponent, offset and catalogue size of the Zipf-Mandelbrot law whose sampled
    rank-frequency curve, at ``events`` events, is closest to ``per_item``'s."""
    rng = np.random.default_rng(seed)
    ranks = np.unique(np.geomspace(1, per_item.size, 60).astype(int))
    target = _rank_curve(per_item, ranks)
    best = (np.inf, 1.0, 0.0, per_item.size)
    for multiple in (1.0, 1.25, 1.5, 2.0, 3.0, 4.0):
        size = int(per_item.size * multiple)
        for exponent in np.linspace(0.3, 2.5, 23):
            for offset in (0.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1_000.0):
                sampled = rng.multinomial(events, zipf_weights(size, exponent, offset))
                rated = sampled[sampled > 0]
                loss = float(np.mean((_rank_curve(rated, ranks) - target) ** 2))
                loss += np.log(rated.size / per_item.size) ** 2
                if loss < best[0]:
                    best = (loss, float(exponent), offset, size)
    return best[1], best[2], best[3]


def _spread(values: np.ndarray) -> float:
    return float(np.sqrt(np.mean((values - values.mean()) ** 2)))


def _slope(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope of ``y`` on ``x`` and the residuals' spread."""
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), _spread(y - slope * x - intercept)


def _logistic(x: np.ndarray, y: np.ndarray, steps: int = 25) -> tuple[float, float]:
    """Intercept and slope of a logistic regression of ``y`` (bool) on ``x`` (Newton)."""
    design = np.column_stack([np.ones_like(x), x])
    weights = np.zeros(2)
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-design @ weights))
        hessian = design.T @ (design * (p * (1 - p))[:, None]) + 1e-6 * np.eye(2)
        weights += np.linalg.solve(hessian, design.T @ (y - p))
    return float(weights[0]), float(weights[1])


def _scale(levels: tuple[float, ...], ratings: np.ndarray, latent: np.ndarray) -> RatingScale:
    """Cut points at the quantiles of ``latent`` where ``ratings``' cumulative shares lie."""
    shares = np.array([np.mean(ratings <= level) for level in levels[:-1]])
    cuts = np.quantile(latent, np.clip(shares, 0.0, 1.0))
    return RatingScale(tuple(levels), tuple(float(c) for c in cuts))


def fit_scales(fit: StreamFit, data: Encoded, half_users: np.ndarray, seed: int) -> StreamFit:
    """``fit`` with its cut points set so generated ratings match ``data``'s histograms.

    A scale no user of the data set keeps to takes the histogram of all ratings, rounded
    to its levels, so it stays usable."""
    generator = StreamGenerator(GeneratorConfig(events=1, seed=seed, fit=fit))
    latent, half = generator.latents(400_000)
    half_event = half_users[data.users]
    halves, wholes = data.ratings[half_event], data.ratings[~half_event]
    if halves.size == 0:
        halves = data.ratings
    if wholes.size == 0:
        wholes = np.clip(np.round(data.ratings), 1.0, 5.0)
    return replace(
        fit,
        half_star=_scale(HALF_LEVELS, halves, latent[half] if half.any() else latent),
        whole_star=_scale(WHOLE_LEVELS, wholes, latent[~half] if (~half).any() else latent),
    )


def calibrate_noise(
    fit: StreamFit, data: Encoded, half_users: np.ndarray, reg: float, seed: int
) -> StreamFit:
    """Bisect ``noise_sd`` so a generated stream of the data set's length is as hard to
    predict (held-out RMSE of the same factorisation) as the data set."""
    target = held_out_rmse(data, fit.factors, reg, seed)
    low, high = 0.0, 2.0
    for _ in range(8):
        middle = 0.5 * (low + high)
        trial = fit_scales(replace(fit, noise_sd=middle), data, half_users, seed)
        stream = generate_stream(GeneratorConfig(events=data.ratings.size, seed=seed, fit=trial))
        error = held_out_rmse(encode(stream), fit.factors, reg, seed)
        low, high = (middle, high) if error < target else (low, middle)
    return fit_scales(replace(fit, noise_sd=0.5 * (low + high)), data, half_users, seed)


def fit_ratings(
    path: Path | str, factors: int = 8, seed: int = 0, source: str | None = None
) -> StreamFit:
    """The generator's parameters fitted to the ratings file at ``path``."""
    stream = load_ratings(path)
    data = encode(stream)
    per_user = np.bincount(data.users, minlength=data.n_users)
    per_item = np.bincount(data.items, minlength=data.n_items)
    activity = _quantile_lognormal(per_user, floor=int(per_user.min()) - 1)
    session = _quantile_lognormal(_sessions(data), floor=0)
    exponent, offset, catalogue = fit_popularity(per_item, data.ratings.size, seed)
    everything = np.ones(data.ratings.size, dtype=bool)
    reg = min((1.0, 3.0, 10.0, 30.0), key=lambda r: held_out_rmse(data, factors, r, seed))
    model = factorise(data, everything, factors, reg, seed)
    left, singular, right = np.linalg.svd(
        model.user_factors @ model.item_factors.T, full_matrices=False
    )
    root = np.sqrt(singular[:factors])
    users_p, items_q = left[:, :factors] * root, right[:factors].T * root
    known_users, known_items = per_user >= WELL_KNOWN, per_item >= WELL_KNOWN
    user_activity = np.log(per_user) - activity_centre(activity)
    user_slope, user_sd = _slope(user_activity[known_users], model.user_bias[known_users])
    item_log = np.log(per_item[known_items])
    item_slope, item_sd = _slope(item_log - item_log.mean(), model.item_bias[known_items])
    active_users, open_sessions = _concurrency(data)
    half_users = (
        np.bincount(data.users, weights=(data.ratings * 2) % 2 == 1, minlength=data.n_users) > 0
    )
    fit = StreamFit(
        source=source or str(path),
        events=int(data.ratings.size),
        users=data.n_users,
        items=data.n_items,
        global_mean=model.mean,
        factors=factors,
        user_bias_sd=user_sd,
        user_bias_slope=user_slope,
        item_bias_sd=item_sd,
        item_bias_slope=item_slope,
        user_factor_sd=tuple(float(x) for x in np.sqrt(np.mean(users_p[known_users] ** 2, axis=0))),
        item_factor_sd=tuple(float(x) for x in np.sqrt(np.mean(items_q[known_items] ** 2, axis=0))),
        noise_sd=0.5,
        half_star_logit=_logistic(user_activity, half_users.astype(np.float64)),
        half_star=RatingScale(HALF_LEVELS, tuple(x + 0.25 for x in HALF_LEVELS[:-1])),
        whole_star=RatingScale(WHOLE_LEVELS, tuple(x + 0.5 for x in WHOLE_LEVELS[:-1])),
        catalogue=catalogue,
        popularity_exponent=exponent,
        popularity_offset=offset,
        activity=activity,
        session=session,
        active_users=active_users,
        session_share=float(np.clip(open_sessions / active_users, 1.0 / active_users, 1.0)),
        reference={"regularisation": reg, **stream_statistics(stream)},
    )
    return calibrate_noise(fit, data, half_users, reg, seed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ratings", type=Path, help="ratings file (MovieLens CSV or TSV)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--factors", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--source", help="what to call the data set in the JSON")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    fit = fit_ratings(args.ratings, args.factors, args.seed, args.source)
    fit.save(args.out)
    print(f"wrote {args.out} in {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
