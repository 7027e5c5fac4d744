"""The analytic epoch model: what an epoch of a config vector takes, costs and achieves.

What is arithmetic is derived, not learnt (CE-scaling §III-B's time and cost model,
adapted to selective sync):

* a worker's duration is the worker model's :class:`~functions.performance.PerformanceModel`
  (the sim runtime's too) of its shard (``⌈n/λ⌉`` ratings in ``⌈n/(λb)⌉`` minibatches,
  snapshot and shard read, delta written) at the CPU share its memory buys, times a
  slowdown drawn from the workers' slowdown distribution (stragglers and jitter), plus a
  cold start where no warm container is left;
* an epoch's latency is the κ-th fastest of λ such durations, an order statistic: its
  q-quantile is one worker's duration quantile at ``Beta(κ, λ-κ+1).ppf(q)``, plus the
  coordinator's own seconds (``a + b·κ``: reading and averaging κ deltas); a 90th
  percentile that reaches into the stragglers is raised by what the records, few as
  they are, may not have shown of them. Where warm
  and cold workers mix (a config following itself with κ < λ finds only κ containers
  free), one worker's duration is the mixture of the two, a cold start apart; taking
  the slower of the two groups' own quantiles instead overstated a steady epoch by
  10-15 % and made a tight deadline's true optimum look infeasible;
* its cost is Lambda's bill of all λ workers (stragglers finish and are billed too):
  ``λ · (E[duration] · memory/1024 · price per GB-s + price per request)``;
* its loss progress (relative fall of the training loss) saturates with the SGD steps
  a worker takes, ``1 - exp(-η · ⌈n/(λb)⌉ / τ)``, and the share ``1 - κ/λ`` of updates
  that arrive a epoch late counts half (the coordinator damps a stale update by
  ``1/(1 + staleness)``).

:func:`recalibrate` refits it after every epoch from that epoch's λ invocation records:
the per-sample and fixed seconds (the worker model's least squares, when the records hold
two amounts of work; a common scale when they hold one), the empirical slowdown
distribution, the cold-start seconds, the coordinator's seconds and the progress curve.
What it still gets wrong is the residual GPs' job (:mod:`configurator.surrogate`).

References
----------
SandPiper (papers/004) §IV-B, Eq. 3; CE-scaling (papers/003) §III-B, Eq. 2-4; S.
Venkataraman et al., "Ernest: efficient performance prediction for large-scale advanced
analytics", NSDI 2016 (how far an analytic scaling model goes).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

import numpy as np
from scipy.special import betainc, betaincinv, ndtri

from configurator.base import JobContext, Observation, WorkerRun
from configurator.space import Candidates, EpochConfig
from functions.performance import DEFAULT_MODEL, PerformanceModel, Work, fit_performance_model
from functions.pricing import LambdaPrices, lambda_prices

#: Bytes one rating takes in a shard: user and item codes and the rating, 8 bytes each.
SAMPLE_BYTES = 24
#: z of the 90 % one-sided quantile: a log-normal's sd from its median and q90.
Z90 = 1.2815515655446004
#: Slowdown draws that stand for the prior's distribution (a seeded sample).
PRIOR_DRAWS = 4096
#: The prior's straggler tail where the worker model has none (a model fitted on local
#: processes never sees one): a tenth of invocations 2-4x slower, a pessimistic default
#: for a fleet of functions until the job's own records say otherwise. Its weight, in
#: records: the empirical slowdowns of the records outweigh it once there are a few
#: dozen.
PRIOR_STRAGGLER_P = 0.1
PRIOR_STRAGGLER_SLOWDOWN = (2.0, 4.0)
PRIOR_WEIGHT_RECORDS = 16
#: Invocation records per epoch, and epochs, a recalibration looks at: recent ones, so
#: that the model follows a job whose window grew, and few, so it takes milliseconds.
RECORDS_PER_EPOCH = 64
RECENT_EPOCHS = 8
#: Where the slowdown distribution's tail begins, for the sampling error of its upper
#: quantiles (``_upper_confidence``).
TAIL_FROM = 0.8
#: Halvings of the bracket of a latency quantile where warm and cold workers mix: to
#: 1/1024 of a cold start.
MIXTURE_BISECTIONS = 10
#: Epochs whose records stand for the slowdown distribution: a property of the fleet,
#: not of the window, so more of them (a job of one or two workers an epoch needs a
#: few dozen epochs to show its stragglers).
SLOWDOWN_EPOCHS = 32


#: The prior's knee of an epoch's progress in learning rate × steps per worker. Where
#: SGD's progress stops paying is set by the loss's curvature, not by the window: on
#: MovieLens's biased MF (the real worker updates of ``benchmarks/gpopt/progress``),
#: a worker with 4,500 ratings gains most at ``lr·steps`` between 1 and 2, and one
#: with 300 still gains in proportion at 0.2. The knee used to be the one that put
#: the job's default (4 workers, batch 1,024, rate 0.05) at it: twelve times this on
#: a 1M-rating window, where batch 256 then looked twice as good as batch 512 and
#: jobs stayed on it while it progressed little more than half as much.
PRIOR_KNEE = 1.0


@dataclass(frozen=True)
class ProgressCurve:
    """Relative loss progress of an epoch: ``level · (1 - exp(-η·steps/tau)) · worth``.

    ``steps`` is the SGD steps one worker takes (``⌈⌈n/λ⌉/b⌉``) and ``worth`` is
    ``κ/λ + (1 - κ/λ)·late_credit·exp(-η·steps/tau)``. ``level`` is the next epoch's;
    ``decay`` is the job's phase, by how much each epoch progresses less than the one
    before (progress shrinks as the loss nears its floor); ``tau`` is where the steps
    stop paying; ``late_credit`` is what a straggler's update is worth against a fresh
    one: the coordinator damps it to ½ (one epoch stale), but it was computed against a
    model the fresh updates have moved since, by as much as they progressed, so it is
    worth less the larger the updates. Measured with the real worker on a 20k MovieLens
    window (λ = 4, shards of 4,500 ratings), κ/λ ½ against BSP at a learning rate of 0.2
    puts a late update's credit (``worth``'s factor after ``1 - κ/λ``) between -0.3
    (batch 256) and 0.26 (batch 4,096), at 0.05 between 0.32 and 0.52; this form says
    0.02-0.33 and 0.20-0.45, a constant ½ said 0.5 throughout. What the job's own
    epochs show refits ``late_credit``.
    """

    level: float = 0.02
    tau: float = PRIOR_KNEE
    decay: float = 1.0
    late_credit: float = 0.5

    def phase_log(self, epochs: np.ndarray, now: int) -> np.ndarray:
        """Log of how much more epoch ``epochs`` progressed than epoch ``now`` will, the
        config aside: what an observation's residual must not count as the config's."""
        return (now - np.asarray(epochs, dtype=np.float64)) * -math.log(self.decay)

    def shape(self, cands: Candidates, samples: int | np.ndarray) -> np.ndarray:
        steps = np.ceil(np.ceil(samples / cands.workers) / cands.batch_size)
        fresh = cands.kappa / cands.workers
        gained = 1.0 - np.exp(-cands.learning_rate * steps / self.tau)
        worth = fresh + (1 - fresh) * self.late_credit * (1.0 - gained)
        return gained * worth


#: What an epoch runs after: nothing (a job's first), one config, or one per candidate.
Predecessor: TypeAlias = EpochConfig | Candidates | None


@dataclass(frozen=True)
class Prediction:
    """Per candidate (``m`` of them): the analytic model's belief about its epoch.

    Logs are natural logs. ``*_sd`` are the spreads of the epoch's outcome itself (an
    order statistic's, a sum's); the surrogate adds what it does not know.
    """

    log_latency: np.ndarray
    log_latency_sd: np.ndarray
    log_cost: np.ndarray
    log_cost_sd: np.ndarray
    log_progress: np.ndarray
    log_progress_sd: np.ndarray
    #: A straggler's duration (the 99th percentile slowdown): past the time limit, out.
    worker_tail_s: np.ndarray


@dataclass(frozen=True)
class EpochModel:
    """The analytic model; see the module docstring.

    Parameters
    ----------
    worker
        Seconds of one invocation at slowdown 1 (the worker performance model).
    slowdowns
        Sorted samples of the workers' slowdown (median 1): the prior's draws, or the
        ratios measured against ``worker`` once there are records.
    coordinator_s
        ``(a, b)``: the coordinator's seconds per epoch, ``a + b·κ``.
    progress
        The progress curve.
    prices
        Lambda's prices (``functions/prices.json``).
    """

    worker: PerformanceModel
    slowdowns: np.ndarray
    #: How many invocation records ``slowdowns`` stands for (the prior's weight and the
    #: job's): how far its tail can be trusted.
    slowdown_records: float = PRIOR_WEIGHT_RECORDS
    coordinator_s: tuple[float, float] = (0.0, 0.0)
    progress: ProgressCurve = ProgressCurve()
    progress_sd: float = 0.25
    prices: LambdaPrices | None = None

    @classmethod
    def prior(cls, worker: PerformanceModel | None = None, seed: int = 0) -> EpochModel:
        """The uncalibrated model: ``worker`` (the worker model's ``DEFAULT_MODEL``,
        measured on the local runtime) and its own slowdown distribution."""
        worker = worker or DEFAULT_MODEL
        if worker.straggler_p == 0:
            worker = worker.replace(
                straggler_p=PRIOR_STRAGGLER_P, straggler_slowdown=PRIOR_STRAGGLER_SLOWDOWN
            )
        rng = np.random.default_rng(seed)
        draws = np.sort([worker.draw_slowdown(rng) for _ in range(PRIOR_DRAWS)])
        return cls(worker, draws / float(np.median(draws)), prices=lambda_prices())

    @property
    def _prices(self) -> LambdaPrices:
        return self.prices or lambda_prices()

    # -- what one worker does ---------------------------------------------------------
    def shard_work(
        self, cands: Candidates, context: JobContext, samples: int | np.ndarray
    ) -> tuple[np.ndarray, ...]:
        """``(scaled seconds at slowdown 1, shard samples)`` per candidate."""
        n = np.ceil(samples / cands.workers)
        batches = np.ceil(n / cands.batch_size)
        w = self.worker
        moved = context.snapshot_bytes + n * SAMPLE_BYTES + _delta_bytes(n, context)
        io = w.request_latency_s * 3 + moved / w.bandwidth_bytes_per_s
        share = np.minimum(np.minimum(cands.memory_mb / w.mb_per_vcpu, w.max_vcpus), w.worker_vcpus)
        compute = (n * w.compute_s_per_sample + batches * w.compute_s_per_batch) / share
        return w.overhead_s + io + compute, n

    def _positions(self) -> np.ndarray:
        """Where each sorted slowdown sits in the distribution (its plotting position)."""
        return (np.arange(len(self.slowdowns)) + 0.5) / len(self.slowdowns)

    def slowdown_quantile(self, u: np.ndarray) -> np.ndarray:
        """The slowdown distribution's quantile function at ``u`` (vectorised)."""
        return np.interp(u, self._positions(), self.slowdowns)

    def mixture_quantile(self, u: np.ndarray, cold: np.ndarray, shift: np.ndarray) -> np.ndarray:
        """Quantile at ``u`` of one worker's duration, in units of its seconds at slowdown
        1, where a share ``cold`` of the workers starts ``shift`` later (vectorised).

        The mixture's CDF, ``(1 - cold)·F(x) + cold·F(x - shift)``, lies between ``F(x)``
        and ``F(x - shift)``, so its quantile lies within ``shift`` above the slowdown
        distribution's own: bisection in that bracket, for the rows that mix.
        """
        base = self.slowdown_quantile(u)
        out = base + np.where(cold >= 1, shift, 0.0)
        mixed = np.flatnonzero((cold > 0) & (cold < 1) & (shift > 0))
        if not len(mixed):
            return out
        target, share, d = u[mixed], cold[mixed], shift[mixed]
        lo, hi = base[mixed], base[mixed] + d
        for _ in range(MIXTURE_BISECTIONS):
            mid = (lo + hi) / 2
            below = self.mixture_cdf(mid, share, d) < target
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        out[mixed] = (lo + hi) / 2
        return out

    def mixture_cdf(self, x: np.ndarray, cold: np.ndarray, shift: np.ndarray) -> np.ndarray:
        """One worker's chance of being done by ``x`` (in its seconds at slowdown 1) where
        a share ``cold`` of the workers starts ``shift`` later: ``(1 - cold)·F(x) +
        cold·F(x - shift)``, :meth:`mixture_quantile`'s inverse."""
        s, positions = self.slowdowns, self._positions()
        done = (1 - cold) * np.interp(x, s, positions, left=0, right=1)
        done += cold * np.interp(x - shift, s, positions, left=0, right=1)
        return done

    def _coordinator_s(self, kappa: np.ndarray) -> np.ndarray:
        """The coordinator's seconds of an epoch that averages ``kappa`` deltas."""
        return self.coordinator_s[0] + self.coordinator_s[1] * kappa

    # -- an epoch -----------------------------------------------------------------------
    def predict(
        self,
        cands: Candidates,
        context: JobContext,
        *,
        samples: int | np.ndarray | None = None,
        previous: Predecessor = None,
        same_latency: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> Prediction:
        """The epoch of each candidate, run after ``previous`` (None: the first epoch).

        ``samples`` and ``previous`` may also be given per candidate (an array, and
        :class:`Candidates` of the same length, a memory of 0 meaning none), to predict
        the epochs a job ran, each after its own predecessor.

        ``same_latency`` (:func:`latency_groups` of ``cands``, for one ``samples`` for
        all) lets the latency quantiles be solved once per group of rows that differ
        only in what changes no second.

        Cold starts: every worker is cold in a job's first epoch and after a change of
        memory (containers are per memory size); otherwise the λ−κ workers still
        running from the last epoch left no warm container, nor did λ beyond the last
        one's.
        """
        (out,) = self.predict_after(
            cands, context, (previous,), samples=samples, same_latency=same_latency
        )
        return out

    def predict_after(
        self,
        cands: Candidates,
        context: JobContext,
        previous: Sequence[Predecessor],
        *,
        samples: int | np.ndarray | None = None,
        same_latency: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[Prediction]:
        """:meth:`predict` after each of ``previous`` in turn.

        What the predecessor does not change (a worker's work, the order statistics'
        positions, progress) is computed once, and a row's latency quantiles are solved
        again only where it has a different number of cold workers than after the first
        predecessor. A decision predicts the grid after the current config and after
        itself: the two differ only in the rows that keep the current memory; as two
        separate predictions they took 15-18 ms of a decision, now 11 (BENCHMARKS.md
        "configurator").
        """
        samples = context.train_samples if samples is None else samples
        scaled, _ = self.shard_work(cands, context, samples)
        lam, kappa = cands.workers, cands.kappa
        first, inverse = same_latency or (slice(None), slice(None))
        order = _order_quantiles(kappa[first], lam[first], (0.5, 0.9))
        order[0.9] = _upper_confidence(order[0.9], self.slowdown_records)
        shift = (self.worker.cold_start_s / scaled)[first]
        coordinator = self._coordinator_s(kappa)
        progress = self.progress.level * self.progress.shape(cands, samples)
        log_progress = np.log(np.maximum(progress, 1e-9))
        tail = self.slowdown_quantile(np.full(1, 0.99))[0] * scaled + self.worker.cold_start_s
        reference: tuple[np.ndarray, dict[float, np.ndarray]] | None = None
        out = []
        for before in previous:
            cold = _cold_workers(cands, before)
            share = (cold / lam)[first]
            solved = self._latency_quantiles(order, share, shift, reference)
            reference = reference or (share, solved)
            median = solved[0.5][inverse] * scaled + coordinator
            upper = solved[0.9][inverse] * scaled + coordinator
            log_lat = np.log(median)
            log_cost, log_cost_sd = self._cost(cands, scaled, cold)
            out.append(
                Prediction(
                    log_lat,
                    np.maximum((np.log(upper) - log_lat) / Z90, 0.01),
                    log_cost,
                    log_cost_sd,
                    log_progress,
                    np.full(len(cands), self.progress_sd),
                    tail,
                )
            )
        return out

    def on_time_scores(
        self,
        cands: Candidates,
        context: JobContext,
        previous: Sequence[Predecessor],
        log_deadline: np.ndarray,
        *,
        samples: int | np.ndarray | None = None,
    ) -> list[np.ndarray]:
        """Per candidate and after each of ``previous`` in turn (as
        :meth:`predict_after`), P(latency ≤ deadline) of the order statistic itself, as
        a normal score: the κ-th of λ worker durations is within the deadline when at
        least κ workers are, ``I_F(κ, λ-κ+1)`` with ``F`` one worker's chance under the
        slowdown distribution (warm and cold workers mixed as in :meth:`predict`).

        The posterior composes the residual GP with a log-normal through the latency's
        median and 90th percentile. Where stragglers put a cliff in the order statistic
        (κ = 4 of 6 is late whenever 3 of the 6 straggle) that log-normal says an epoch
        is hardly ever much later than its 90th percentile, and a deadline past it looks
        safer than it is: loose jobs spending their saved time picked such configs at a
        predicted 0.90 or more and ran late, a median 1.29 times their 90 % interval's
        upper end (BENCHMARKS.md "configurator").
        """
        samples = context.train_samples if samples is None else samples
        scaled, _ = self.shard_work(cands, context, samples)
        lam, kappa = cands.workers, cands.kappa
        x = (np.exp(log_deadline) - self._coordinator_s(kappa)) / scaled
        shift = self.worker.cold_start_s / scaled
        out = []
        for before in previous:
            done = self.mixture_cdf(x, _cold_workers(cands, before) / lam, shift)
            chance = betainc(kappa, lam - kappa + 1, done)
            out.append(np.asarray(ndtri(np.clip(chance, 1e-12, 1 - 1e-12))))
        return out

    def _latency_quantiles(
        self,
        order: dict[float, np.ndarray],
        share: np.ndarray,
        shift: np.ndarray,
        reference: tuple[np.ndarray, dict[float, np.ndarray]] | None,
    ) -> dict[float, np.ndarray]:
        """Per quantile, a worker's duration (in seconds at slowdown 1) at the order
        statistic's position ``order[q]`` when a ``share`` of the workers is cold; rows
        whose share is the ``reference``'s take its solution.

        Each distinct (positions, share, shift) is solved once: memory past what buys
        the vCPUs the work can use adds no speed (for the sim model's one-vCPU worker,
        every size from 1,769 MB up), and over the search space's grid half the
        mixtures were solved more than once.
        """
        rows = np.arange(len(share))
        if reference is not None:
            rows = np.flatnonzero(share != reference[0])
        first, inverse = _distinct(rows, *order.values(), share, shift)
        fresh = {
            q: self.mixture_quantile(u[first], share[first], shift[first])[inverse]
            for q, u in order.items()
        }
        if reference is None:
            return fresh
        out = {}
        for q, values in reference[1].items():
            out[q] = values.copy()
            out[q][rows] = fresh[q]
        return out

    def _cost(
        self, cands: Candidates, scaled: np.ndarray, cold: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Log cost and its sd: the mean slowdown's billed seconds plus the cold starts,
        at the memory's price per GB-second, and a request per worker."""
        lam = cands.workers
        mean_s, sd_s = float(np.mean(self.slowdowns)), float(np.std(self.slowdowns))
        billed_s = mean_s * scaled + cold * self.worker.cold_start_s / lam
        prices = self._prices
        per_worker = billed_s * cands.memory_mb / 1024.0 * prices.gb_second_usd
        cost = lam * (per_worker + prices.request_usd)
        cost_sd = sd_s / max(mean_s, 1e-9) / np.sqrt(lam)
        return np.log(cost), np.maximum(cost_sd, 0.005)


def _distinct(rows: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first of each distinct combination of columns among rows, which combination
    each of rows has)``: ``columns[i][first][inverse] == columns[i][rows]``.

    ``np.unique(..., axis=0)`` answers the same, but sorting rows as opaque records took
    4 ms over the grid's 7,000 latency groups where one lexsort takes 0.5."""
    if not len(rows):
        return rows, rows
    values = [c[rows] for c in columns]
    ranked = np.lexsort(values[::-1])
    change = np.zeros(len(rows) - 1, dtype=bool)
    for v in values:
        ordered = v[ranked]
        change |= ordered[1:] != ordered[:-1]
    starts = np.concatenate([[0], np.flatnonzero(change) + 1])
    inverse = np.empty(len(rows), dtype=np.intp)
    inverse[ranked] = np.concatenate([[0], np.cumsum(change)])
    return rows[ranked[starts]], inverse


def latency_groups(cands: Candidates) -> tuple[np.ndarray, np.ndarray]:
    """``(first row of each group, group of each row)`` of the rows of ``cands`` that
    differ only in their learning rate, which changes no second of an epoch (the
    search space's five learning rates make a fifth of the grid's latency work)."""
    columns = np.column_stack([cands.memory_mb, cands.workers, cands.sync_ratio, cands.batch_size])
    _, first, inverse = np.unique(columns, axis=0, return_index=True, return_inverse=True)
    return first, inverse.ravel()


def _order_quantiles(
    kappa: np.ndarray, n: np.ndarray, qs: tuple[float, ...]
) -> dict[float, np.ndarray]:
    """Per q, where the κ-th smallest of n uniforms has its q-quantile,
    ``Beta(κ, n-κ+1).ppf(q)``.

    The incomplete beta's inverse is slow and 35,000 candidates hold a few hundred
    distinct (κ, n) pairs, so it is evaluated once per pair, the pairs found once for
    every q (finding them sorts the rows: a tenth of a decision's time when done per q
    over the whole grid).
    """
    key = np.asarray(kappa, dtype=np.int64) * 4096 + np.asarray(n, dtype=np.int64)
    pairs, inverse = np.unique(key, return_inverse=True)
    k = (pairs // 4096).astype(np.float64)
    b = (pairs % 4096).astype(np.float64) - k + 1
    row_pair = inverse.ravel()
    return {q: betaincinv(k, b, q)[row_pair] for q in qs}


def _upper_confidence(u: np.ndarray, records: float) -> np.ndarray:
    """``u`` raised by its sampling error where it reaches into the stragglers (from
    ``TAIL_FROM``), in a slowdown distribution known from ``records`` invocations: a
    binomial proportion's error, at one-sided 90 %.

    The 90th percentile of an epoch of one or two workers is a quantile of one worker
    deep in the tail, as good as the stragglers the records happened to show: thirty
    records hold six or three, and the pick with the fewest workers, the cheapest, is
    the one that bets on the lucky count (after 20 epochs of a traced 10k-rating job
    the model's 90th-percentile slowdown was 2.0, the truth's 3.6, and such picks ran
    late one epoch in five). The body of the distribution, where many workers' order
    statistics sit, the records and the fitted worker seconds pin down; raising it
    too made every config of a tight deadline look late while the prior still counted
    for most of the records (from the 70th percentile, on 4 seeds of every scenario:
    7.3 % of epochs late against 9.3 %, but regret at epoch 5 0.73 against 0.11).
    """
    shifted = np.minimum(u + Z90 * np.sqrt(u * (1.0 - u) / max(records, 1.0)), 1.0)
    return np.where(u >= TAIL_FROM, shifted, u)


def _delta_bytes(n: np.ndarray, context: JobContext) -> np.ndarray:
    """A delta's bytes: rows the shard touches (at most two per rating, at most the
    model's), each a row index, a count, a bias and ``factors`` floats."""
    rows = np.minimum(2 * n, max(context.model_rows, 1))
    return rows * 8 * (context.factors + 3)


def _cold_workers(cands: Candidates, previous: EpochConfig | Candidates | None) -> np.ndarray:
    if previous is None:
        return cands.workers.copy()
    if isinstance(previous, EpochConfig):
        previous = Candidates.of([previous])
    warm = np.where(previous.sync_ratio >= 1, previous.workers, previous.kappa)
    same_memory = cands.memory_mb == previous.memory_mb
    return np.where(same_memory, np.maximum(cands.workers - warm, 0.0), cands.workers)


# -- recalibration --------------------------------------------------------------------------


def epoch_progress(history: Sequence[Observation]) -> list[tuple[int, float]]:
    """``(epoch, relative loss progress)`` of every epoch after the first."""
    out = []
    for t in range(1, len(history)):
        before, after = history[t - 1].loss, history[t].loss
        if before > 0 and math.isfinite(before) and math.isfinite(after):
            out.append((t, (before - after) / before))
    return out


def recalibrate(
    model: EpochModel, history: Sequence[Observation], context: JobContext
) -> EpochModel:
    """``model`` refitted to the invocation records and outcomes of ``history``."""
    worker, (slowdowns, records) = _fit_workers(
        model, _recent_runs(history, RECENT_EPOCHS), _recent_runs(history, SLOWDOWN_EPOCHS), context
    )
    fitted = replace(model, worker=worker, slowdowns=slowdowns, slowdown_records=records)
    fitted = replace(fitted, coordinator_s=_fit_coordinator(fitted, history, context))
    progress = _fit_progress(fitted, history, context)
    return replace(fitted, progress=progress, progress_sd=_progress_sd(fitted, history))


def _recent_runs(history: Sequence[Observation], epochs: int) -> list[tuple[WorkerRun, int]]:
    """(run, epoch) of the last ``epochs`` epochs' successful invocations, evenly
    thinned."""
    runs: list[tuple[WorkerRun, int]] = []
    for t in range(max(0, len(history) - epochs), len(history)):
        ok = [r for r in history[t].workers if r.ok and r.duration_s > 0]
        step = max(1, len(ok) // RECORDS_PER_EPOCH)
        runs.extend((r, t) for r in ok[::step])
    return runs


def _work(run: WorkerRun, context: JobContext) -> Work:
    n = run.samples
    batches = math.ceil(n / run.batch_size) if run.batch_size else 0
    written = int(_delta_bytes(np.asarray(float(n)), context))
    return Work(n, batches, context.snapshot_bytes + n * SAMPLE_BYTES, written)


def _fit_workers(
    model: EpochModel,
    runs: list[tuple[WorkerRun, int]],
    longer: list[tuple[WorkerRun, int]],
    context: JobContext,
) -> tuple[PerformanceModel, tuple[np.ndarray, float]]:
    """The worker's seconds (from the recent ``runs``) and the empirical slowdowns of
    the warm runs among the ``longer`` history, with the records they stand for.

    Two candidate fits of the warm runs' median duration per kind of work (shard size,
    memory, batch size; medians, so that stragglers do not pull the fit): the prior's
    seconds times a common scale, and the worker model's least squares of per-sample and
    fixed seconds, tried only when the runs hold three amounts of work spanning 4x.
    Least squares on a few noisy points extrapolates wildly (it once put every second
    in the fixed overhead after three epochs), so it is kept only when it explains the
    medians clearly better than the scale does.
    """
    warm = [r for r, _ in runs if not r.cold_start]
    if len(warm) < 2:
        cold_only = [r for r, _ in runs]
        if len(cold_only) < 2:
            return model.worker, (model.slowdowns, model.slowdown_records)
        return model.worker, _pooled(model, _cold_ratios(model.worker, cold_only, context))
    groups: dict[tuple[int, int, int | None], list[float]] = {}
    for r in warm:
        groups.setdefault((r.samples, r.memory_mb, r.batch_size), []).append(r.duration_s)
    medians = [
        WorkerRun(memory, samples, float(np.median(d)), False, batch)
        for (samples, memory, batch), d in groups.items()
    ]
    worker = _scaled(model.worker, _median_ratio(model.worker, warm, context))
    sizes = sorted({r.samples for r in medians})
    if len(sizes) >= 3 and sizes[-1] >= 4 * max(sizes[0], 1):
        fitted = _least_squares(model.worker, medians)
        if fitted is not None and _keeps_compute(fitted, worker):
            fitted = _scaled(fitted, _median_ratio(fitted, warm, context))
            if _log_sse(fitted, medians, context) < 0.7 * _log_sse(worker, medians, context):
                worker = fitted
    observed = [r for r, _ in longer if not r.cold_start]
    predicted = np.array([worker.duration_s(_work(r, context), r.memory_mb) for r in observed])
    ratios = np.array([r.duration_s for r in observed]) / np.maximum(predicted, 1e-9)
    cold = [r for r, _ in runs if r.cold_start]
    if cold:
        extra = [r.duration_s - worker.duration_s(_work(r, context), r.memory_mb) for r in cold]
        worker = worker.replace(cold_start_s=max(0.0, float(np.median(extra))))
    return worker, _pooled(model, ratios / float(np.median(ratios)))


def _keeps_compute(fitted: PerformanceModel, scaled: PerformanceModel) -> bool:
    """Whether a least-squares fit left at least half the per-sample compute seconds
    of the scaled prior in place.

    Which seconds a smaller memory size slows down (compute) and which it does not
    (overhead, transfer) only runs at several memory sizes could show; a job's runs
    at one size leave that to noise, and a fit that moved the per-sample seconds into
    the fixed ones predicted 0.08 s for an epoch that took 2.4 s at 128 MB.
    """
    return fitted.compute_s_per_sample >= 0.5 * scaled.compute_s_per_sample


def _median_ratio(worker: PerformanceModel, runs: list[WorkerRun], context: JobContext) -> float:
    """The runs' median duration over what ``worker`` predicts for them."""
    predicted = np.array([worker.duration_s(_work(r, context), r.memory_mb) for r in runs])
    return float(np.median(np.array([r.duration_s for r in runs]) / np.maximum(predicted, 1e-9)))


@dataclass(frozen=True)
class _Measured:
    """A warm worker run as :func:`~functions.performance.fit_performance_model` reads
    a measured invocation."""

    memory_mb: int
    duration_s: float
    labels: dict[str, Any]
    ok: bool = True
    cold_start: bool = False
    init_duration_s: float = 0.0
    result: dict[str, Any] | None = None


def _least_squares(worker: PerformanceModel, runs: list[WorkerRun]) -> PerformanceModel | None:
    records = [
        _Measured(r.memory_mb, r.duration_s, {"samples": r.samples, "batch_size": r.batch_size})
        for r in runs
    ]
    try:
        return fit_performance_model(records, worker, cpu_scaled=True).model
    except ValueError:
        return None


def _log_sse(worker: PerformanceModel, runs: list[WorkerRun], context: JobContext) -> float:
    predicted = np.array([worker.duration_s(_work(r, context), r.memory_mb) for r in runs])
    observed = np.array([r.duration_s for r in runs])
    return float(np.sum(np.log(observed / np.maximum(predicted, 1e-9)) ** 2))


def _cold_ratios(
    worker: PerformanceModel, runs: list[WorkerRun], context: JobContext
) -> np.ndarray:
    """Slowdowns of cold runs alone (a job's first epoch): their seconds past the
    prior's cold start over the prior's warm duration."""
    return np.array(
        [
            max(r.duration_s - worker.cold_start_s, 1e-9)
            / max(worker.duration_s(_work(r, context), r.memory_mb), 1e-9)
            for r in runs
        ]
    )


def _pooled(model: EpochModel, ratios: np.ndarray) -> tuple[np.ndarray, float]:
    """The slowdown distribution and the records it stands for: the records' ratios
    pooled with the prior's, which counts as ``PRIOR_WEIGHT_RECORDS`` records, so a
    handful of lucky records cannot erase the tail (nor a handful of stragglers double
    it), and many records rule."""
    repeat = 32  # draws per record: the prior's quantiles stand for 16 records finely
    draws = PRIOR_WEIGHT_RECORDS * repeat
    prior = model.slowdown_quantile((np.arange(draws) + 0.5) / draws)
    pooled = np.sort(np.concatenate([prior, np.repeat(ratios, repeat)]))
    return pooled / float(np.median(pooled)), float(PRIOR_WEIGHT_RECORDS + len(ratios))


def _scaled(worker: PerformanceModel, scale: float) -> PerformanceModel:
    """Every slowdown-scaled second of ``worker`` times ``scale``."""
    return worker.replace(
        compute_s_per_sample=worker.compute_s_per_sample * scale,
        compute_s_per_batch=worker.compute_s_per_batch * scale,
        overhead_s=worker.overhead_s * scale,
        request_latency_s=worker.request_latency_s * scale,
        bandwidth_bytes_per_s=worker.bandwidth_bytes_per_s / scale,
    )


def _fit_coordinator(
    model: EpochModel, history: Sequence[Observation], context: JobContext
) -> tuple[float, float]:
    """The coordinator's seconds ``a + b·κ``: epoch latency minus its κ-th fastest worker,
    by non-negative least squares over the recent epochs."""
    rows, targets = [], []
    for obs in history[-RECENT_EPOCHS:]:
        durations = sorted(r.duration_s for r in obs.workers if r.ok)
        kappa = int(Candidates.of([obs.config]).kappa[0])
        if len(durations) >= kappa:
            rows.append((1.0, float(kappa)))
            targets.append(max(0.0, obs.duration_s - durations[kappa - 1]))
    if not rows:
        return model.coordinator_s
    x, y = np.asarray(rows), np.asarray(targets)
    if len({r[1] for r in rows}) < 2:
        return (float(np.median(y)), 0.0)
    best, best_sse = (float(np.median(y)), 0.0), math.inf
    for cols in ([0], [1], [0, 1]):
        coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(2)
        full[cols] = coef
        sse = float(np.sum((y - x @ full) ** 2))
        if sse < best_sse:
            best, best_sse = (float(full[0]), float(full[1])), sse
    return best


#: Candidate knees of the progress curve, relative to the prior's.
_TAU_FACTORS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
#: Candidate worths of a straggler's update, the prior's (the coordinator's damping)
#: first so that it stays where the epochs cannot tell them apart.
_LATE_CREDITS = (0.5, 0.0, 0.25, 0.75, 1.0)
#: Recent epochs the progress curve is fitted to (a window that jumped changes its
#: level), epochs needed before the phase's decay is fitted, and the steepest decay
#: believed.
PROGRESS_EPOCHS = 12
DECAY_EPOCHS = 4
MIN_DECAY = 0.5


def _fit_progress(
    model: EpochModel, history: Sequence[Observation], context: JobContext
) -> ProgressCurve:
    """The knee ``tau`` that best explains the recent progress (in logs, over a few
    multiples of the prior's), with the job's phase: a level that falls by ``decay``
    per epoch, fitted with it.

    Without the phase, an epoch of the job's start looked better than the same config
    would do now (MovieLens's progress falls ~10 % an epoch): the residual GP credited
    the early configs with what was the phase's, and a config that truly progressed a
    third as much as another looked as good once tried early.
    """
    progress = [(t, p) for t, p in epoch_progress(history) if p > 0][-PROGRESS_EPOCHS:]
    if not progress:
        return model.progress
    samples_at = np.array([history[t].samples or context.train_samples for t, _ in progress])
    configs = [history[t].config for t, _ in progress]
    cands = Candidates.of(configs)
    epochs = np.array([t for t, _ in progress], dtype=np.float64) - len(history)
    repeats = _Repeats.of(epochs, _same_config(configs, samples_at))
    observed = np.log([p for _, p in progress])
    taus = [PRIOR_KNEE * f for f in _TAU_FACTORS] if len(progress) >= 3 else [PRIOR_KNEE]
    credits = [model.progress.late_credit]
    if len(np.unique(np.round(cands.kappa / cands.workers, 6))) >= 2:
        credits = list(_LATE_CREDITS)  # only epochs of two κ/λ can tell
    best: tuple[float, ProgressCurve] | None = None
    for tau, credit in itertools.product(taus, credits):
        curve = replace(model.progress, tau=tau, late_credit=credit)
        logs = observed - np.log(np.maximum(curve.shape(cands, samples_at), 1e-12))
        level, slope = _phase_line(epochs, logs, repeats, math.log(model.progress.decay))
        sse = float(np.sum((logs - level - slope * epochs) ** 2))
        if best is None or sse < best[0] - 1e-12:
            best = (sse, replace(curve, level=math.exp(level), decay=math.exp(slope)))
    assert best is not None
    return best[1]


def _same_config(configs: list[EpochConfig], samples: np.ndarray) -> np.ndarray:
    """A label per epoch, equal for epochs of the same config on the same window."""
    labels: dict[tuple[EpochConfig, float], int] = {}
    return np.array(
        [
            labels.setdefault((c, float(n)), len(labels))
            for c, n in zip(configs, samples, strict=True)
        ]
    )


@dataclass(frozen=True)
class _Repeats:
    """The epochs that ran a config again, and their epochs centred per config: what
    the decay is read from, the same for every curve a fit tries (found for each of its
    40, a recalibration on 200 epochs took 3.2 ms; found once, 1.8)."""

    groups: tuple[np.ndarray, ...]
    centred_epochs: np.ndarray
    spread: float
    #: Whether they are enough to read the decay from: ``DECAY_EPOCHS`` epochs spanning
    #: as many.
    enough: bool

    @classmethod
    def of(cls, epochs: np.ndarray, config: np.ndarray) -> _Repeats:
        centred_epochs = np.zeros(len(epochs))
        repeated = np.zeros(len(epochs), dtype=bool)
        groups = []
        for label in np.unique(config):
            rows = config == label
            if rows.sum() >= 2:
                groups.append(rows)
                repeated |= rows
                centred_epochs[rows] = epochs[rows] - epochs[rows].mean()
        spread = float(np.sum(centred_epochs**2))
        enough = bool(
            repeated.sum() >= DECAY_EPOCHS
            and np.ptp(epochs[repeated]) >= DECAY_EPOCHS - 1
            and spread
        )
        return cls(tuple(groups), centred_epochs, spread, enough)


def _phase_line(
    epochs: np.ndarray, logs: np.ndarray, repeats: _Repeats, slope: float
) -> tuple[float, float]:
    """``(log level at epoch 0, log decay)`` of ``logs`` against ``epochs`` (relative to
    the next epoch).

    The decay is read only from epochs that ran the same config (``repeats``: a
    within-config least squares slope), once ``DECAY_EPOCHS`` such epochs span as many,
    kept between no decay and ``MIN_DECAY``; ``slope`` as given before. Across configs
    the prior's error and the phase cannot be told apart: a switch to a config the prior
    overrates (κ/λ ½ where it progresses half as much) read as a steep phase, its
    residual vanished, and the job stayed on it.
    """
    if repeats.enough:
        centred_logs = np.zeros(len(epochs))
        for rows in repeats.groups:
            centred_logs[rows] = logs[rows] - logs[rows].mean()
        fitted = float(np.sum(repeats.centred_epochs * centred_logs)) / repeats.spread
        slope = min(0.0, max(math.log(MIN_DECAY), fitted))
    return float(np.mean(logs - slope * epochs)), slope


def _progress_sd(model: EpochModel, history: Sequence[Observation]) -> float:
    """How much an epoch's progress wanders from one epoch to the next (in logs), once
    there are a few to tell; the prior's spread before."""
    logs = np.log([p for _, p in epoch_progress(history) if p > 0])
    if len(logs) < 4:
        return model.progress_sd
    return max(float(np.std(np.diff(logs))) / math.sqrt(2), 0.02)


__all__ = [
    "EpochModel",
    "Prediction",
    "ProgressCurve",
    "epoch_progress",
    "recalibrate",
]
