"""The workers' slowdown distribution, and the order statistic an epoch's latency is.

A worker's duration is its seconds at slowdown 1 times a slowdown drawn from the fleet's
distribution (stragglers and jitter), plus a cold start where no warm container is left.
The distribution is kept as sorted samples with median 1: the prior's draws, or the
ratios a job's records showed pooled with them. An epoch waits for the κ-th fastest of λ
workers, so its q-quantile is one worker's duration quantile at ``Beta(κ, λ-κ+1).ppf(q)``;
where warm and cold workers mix, one worker's duration is the mixture of the two, a cold
start apart (taking the slower group's own quantile instead overstates a steady epoch).
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaincinv

from configurator.space import Candidates, EpochConfig

#: z of the 90 % one-sided quantile: a log-normal's sd from its median and q90.
Z90 = 1.2815515655446004
#: How many invocation records the prior's slowdown distribution counts as: the
#: empirical slowdowns of a job's records outweigh it once there are a few dozen.
PRIOR_WEIGHT_RECORDS = 16
#: Where the slowdown distribution's tail begins, for the sampling error of its upper
#: quantiles (:func:`upper_confidence`).
TAIL_FROM = 0.8
#: Halvings of the bracket of a latency quantile where warm and cold workers mix: to
#: 1/1024 of a cold start.
MIXTURE_BISECTIONS = 10


def positions(slowdowns: np.ndarray) -> np.ndarray:
    """Where each sorted slowdown sits in the distribution (its plotting position)."""
    return (np.arange(len(slowdowns)) + 0.5) / len(slowdowns)


def quantile(slowdowns: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The slowdown distribution's quantile function at ``u`` (vectorised)."""
    return np.interp(u, positions(slowdowns), slowdowns)


def mixture_quantile(
    slowdowns: np.ndarray, u: np.ndarray, cold: np.ndarray, shift: np.ndarray
) -> np.ndarray:
    """Quantile at ``u`` of one worker's duration, in units of its seconds at slowdown
    1, where a share ``cold`` of the workers starts ``shift`` later (vectorised).

    The mixture's CDF, ``(1 - cold)·F(x) + cold·F(x - shift)``, lies between ``F(x)``
    and ``F(x - shift)``, so its quantile lies within ``shift`` above the slowdown
    distribution's own: bisection in that bracket, for the rows that mix.
    """
    base = quantile(slowdowns, u)
    out = base + np.where(cold >= 1, shift, 0.0)
    mixed = np.flatnonzero((cold > 0) & (cold < 1) & (shift > 0))
    if not len(mixed):
        return out
    target, share, d = u[mixed], cold[mixed], shift[mixed]
    lo, hi = base[mixed], base[mixed] + d
    for _ in range(MIXTURE_BISECTIONS):
        mid = (lo + hi) / 2
        below = mixture_cdf(slowdowns, mid, share, d) < target
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    out[mixed] = (lo + hi) / 2
    return out


def mixture_cdf(
    slowdowns: np.ndarray, x: np.ndarray, cold: np.ndarray, shift: np.ndarray
) -> np.ndarray:
    """One worker's chance of being done by ``x`` (in its seconds at slowdown 1) where
    a share ``cold`` of the workers starts ``shift`` later: ``(1 - cold)·F(x) +
    cold·F(x - shift)``, :func:`mixture_quantile`'s inverse."""
    at = positions(slowdowns)
    done = (1 - cold) * np.interp(x, slowdowns, at, left=0, right=1)
    done += cold * np.interp(x - shift, slowdowns, at, left=0, right=1)
    return done


def order_quantiles(
    kappa: np.ndarray, n: np.ndarray, qs: tuple[float, ...]
) -> dict[float, np.ndarray]:
    """Per q, where the κ-th smallest of n uniforms has its q-quantile,
    ``Beta(κ, n-κ+1).ppf(q)``.

    The incomplete beta's inverse is slow and a grid holds few distinct (κ, n) pairs
    among its rows, so it is evaluated once per pair, the pairs found once for every q
    (finding them sorts the rows).
    """
    key = np.asarray(kappa, dtype=np.int64) * 4096 + np.asarray(n, dtype=np.int64)
    pairs, inverse = np.unique(key, return_inverse=True)
    k = (pairs // 4096).astype(np.float64)
    b = (pairs % 4096).astype(np.float64) - k + 1
    row_pair = inverse.ravel()
    return {q: betaincinv(k, b, q)[row_pair] for q in qs}


def upper_confidence(u: np.ndarray, records: float) -> np.ndarray:
    """``u`` raised by its sampling error where it reaches into the stragglers (from
    ``TAIL_FROM``), in a slowdown distribution known from ``records`` invocations: a
    binomial proportion's error, at one-sided 90 %.

    The 90th percentile of an epoch of one or two workers is a quantile of one worker
    deep in the tail, as good as the stragglers the records happened to show, and the
    pick with the fewest workers, the cheapest, is the one that bets on a lucky count.
    The body of the distribution, where many workers' order statistics sit, the records
    and the fitted worker seconds pin down; raising it too would make every config of a
    tight deadline look late while the prior still counts for most of the records.
    """
    shifted = np.minimum(u + Z90 * np.sqrt(u * (1.0 - u) / max(records, 1.0)), 1.0)
    return np.where(u >= TAIL_FROM, shifted, u)


def pooled(slowdowns: np.ndarray, ratios: np.ndarray) -> tuple[np.ndarray, float]:
    """The slowdown distribution and the records it stands for: the records' ``ratios``
    pooled with ``slowdowns`` (the prior's), which count as ``PRIOR_WEIGHT_RECORDS``
    records, so a handful of lucky records cannot erase the tail (nor a handful of
    stragglers double it), and many records rule."""
    repeat = 32  # draws per record: the prior's quantiles stand for 16 records finely
    draws = PRIOR_WEIGHT_RECORDS * repeat
    prior = quantile(slowdowns, (np.arange(draws) + 0.5) / draws)
    out = np.sort(np.concatenate([prior, np.repeat(ratios, repeat)]))
    return out / float(np.median(out)), float(PRIOR_WEIGHT_RECORDS + len(ratios))


def cold_workers(cands: Candidates, previous: EpochConfig | Candidates | None) -> np.ndarray:
    """Per candidate, how many of its workers find no warm container after ``previous``:
    all in a job's first epoch and after a change of kind or memory (containers are per
    kind and memory size); otherwise those beyond the ones the last epoch left free (its
    κ when it did not wait for all λ, whose stragglers still run)."""
    if previous is None:
        return cands.workers.copy()
    if isinstance(previous, EpochConfig):
        previous = Candidates.of([previous])
    warm = np.where(previous.sync_ratio >= 1, previous.workers, previous.kappa)
    same_memory = (cands.memory_mb == previous.memory_mb) & (cands.kind == previous.kind)
    return np.where(same_memory, np.maximum(cands.workers - warm, 0.0), cands.workers)
