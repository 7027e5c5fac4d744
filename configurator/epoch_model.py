"""The epoch model: what an epoch of a config vector takes and costs, from its workers.

CE-scaling §III-B's time and cost model, adapted to selective sync:

* a worker's duration is the worker model's :class:`~functions.performance.PerformanceModel`
  (the sim runtime's too) of its shard (``⌈n/λ⌉`` ratings in ``⌈n/(λb)⌉`` minibatches,
  snapshot and shard read, delta written) at the CPU share its memory buys, times a
  slowdown (:mod:`configurator.slowdowns`), plus a cold start where no warm container
  is left;
* an epoch's latency is the κ-th fastest of λ such durations, an order statistic, plus
  the coordinator's own seconds (``a + b·κ``: reading and averaging κ deltas); a 90th
  percentile that reaches into the stragglers is raised by what the records, few as
  they are, may not have shown of them;
* its cost is Lambda's bill of all λ workers (stragglers finish and are billed too):
  ``λ · (E[duration] · memory/1024 · price per GB-s + price per request)``;
* its loss progress is the :class:`~configurator.progress.ProgressCurve`'s.

Rows of another worker kind (GPU containers, the service's own process) take their
worker's seconds, start-up, slowdowns and bill from the kind's
:class:`~configurator.kinds.KindModel` instead; the order statistic, the coordinator and
progress are the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

import numpy as np
from scipy.special import betainc, ndtri

from configurator import slowdowns as slowdown
from configurator.base import JobContext
from configurator.kinds import KindModel, kind_models
from configurator.progress import ProgressCurve
from configurator.slowdowns import PRIOR_WEIGHT_RECORDS, Z90
from configurator.space import GPU_KINDS, IN_PROCESS, KINDS, LAMBDA, Candidates, EpochConfig
from functions.performance import DEFAULT_MODEL, PerformanceModel
from functions.pricing import LambdaPrices, lambda_prices

#: Bytes one rating takes in a shard: user and item codes and the rating, 8 bytes each.
SAMPLE_BYTES = 24
#: Slowdown draws that stand for the prior's distribution (a seeded sample).
PRIOR_DRAWS = 4096
#: The prior's straggler tail where the worker model has none (a model fitted on local
#: processes never sees one): a tenth of invocations 2-4x slower, a pessimistic default
#: for a fleet of functions until the job's own records say otherwise (its weight, in
#: records, is ``PRIOR_WEIGHT_RECORDS``).
PRIOR_STRAGGLER_P = 0.1
PRIOR_STRAGGLER_SLOWDOWN = (2.0, 4.0)


#: What an epoch runs after: nothing (a job's first), one config, or one per candidate.
Predecessor: TypeAlias = EpochConfig | Candidates | None


class _Part(Protocol):
    """What predicting the rows of one worker kind needs: Lambda's is the
    :class:`EpochModel` itself, another kind's a :class:`~configurator.kinds.KindModel`."""

    @property
    def cold_start_s(self) -> float: ...
    @property
    def slowdowns(self) -> np.ndarray: ...
    @property
    def slowdown_records(self) -> float: ...
    def shard_work(
        self, cands: Candidates, context: JobContext, samples: int | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]: ...
    def slowdown_quantile(self, u: np.ndarray) -> np.ndarray: ...
    def cost(
        self,
        cands: Candidates,
        scaled: np.ndarray,
        cold: np.ndarray,
        median_s: np.ndarray,
        upper_s: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]: ...


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
    """The analytic epoch model (see the module docstring); :func:`recalibrate
    <configurator.recalibration.recalibrate>` refits it to a job's epochs.

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
    #: The other worker kinds' models, by name (Lambda is this model's own).
    kinds: Mapping[str, KindModel] = field(default_factory=dict)

    @classmethod
    def prior(cls, worker: PerformanceModel | None = None, seed: int = 0) -> EpochModel:
        """The uncalibrated model: ``worker`` (the worker model's ``DEFAULT_MODEL``,
        measured on the local runtime) and its own slowdown distribution, and every
        other kind's prior (:func:`~configurator.kinds.kind_models`)."""
        worker = worker or DEFAULT_MODEL
        if worker.straggler_p == 0:
            worker = worker.replace(
                straggler_p=PRIOR_STRAGGLER_P, straggler_slowdown=PRIOR_STRAGGLER_SLOWDOWN
            )
        rng = np.random.default_rng(seed)
        draws = np.sort([worker.draw_slowdown(rng) for _ in range(PRIOR_DRAWS)])
        others = kind_models((IN_PROCESS, *GPU_KINDS), seed)
        return cls(worker, draws / float(np.median(draws)), prices=lambda_prices(), kinds=others)

    @property
    def _prices(self) -> LambdaPrices:
        return self.prices or lambda_prices()

    # -- what one worker does ---------------------------------------------------------
    def shard_work(
        self, cands: Candidates, context: JobContext, samples: int | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(scaled seconds at slowdown 1, shard samples)`` per candidate."""
        n = np.ceil(samples / cands.workers)
        batches = np.ceil(n / cands.batch_size)
        w = self.worker
        moved = context.snapshot_bytes + n * SAMPLE_BYTES + delta_bytes(n, context)
        io = w.request_latency_s * 3 + moved / w.bandwidth_bytes_per_s
        share = np.minimum(np.minimum(cands.memory_mb / w.mb_per_vcpu, w.max_vcpus), w.worker_vcpus)
        compute = (n * w.compute_s_per_sample + batches * w.compute_s_per_batch) / share
        return w.overhead_s + io + compute, n

    def slowdown_quantile(self, u: np.ndarray) -> np.ndarray:
        """The slowdown distribution's quantile function at ``u`` (vectorised)."""
        return slowdown.quantile(self.slowdowns, u)

    def mixture_quantile(self, u: np.ndarray, cold: np.ndarray, shift: np.ndarray) -> np.ndarray:
        """Quantile at ``u`` of one worker's duration, in units of its seconds at slowdown
        1, where a share ``cold`` of the workers starts ``shift`` later (vectorised)."""
        return slowdown.mixture_quantile(self.slowdowns, u, cold, shift)

    def mixture_cdf(self, x: np.ndarray, cold: np.ndarray, shift: np.ndarray) -> np.ndarray:
        """One worker's chance of being done by ``x`` (in its seconds at slowdown 1) where
        a share ``cold`` of the workers starts ``shift`` later."""
        return slowdown.mixture_cdf(self.slowdowns, x, cold, shift)

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
        itself: the two differ only in the rows that keep the current memory.

        Rows of each worker kind are predicted by that kind's part (Lambda: this
        model's own worker, slowdowns and bill; others: :attr:`kinds`).
        """
        samples = context.train_samples if samples is None else samples
        if not cands.kind.any():
            return self._predict_part(self, cands, context, previous, samples, same_latency)
        merged: list[dict[str, np.ndarray]] = [{} for _ in previous]
        for rows, part, sub, before, n, groups in self._by_kind(
            cands, previous, samples, same_latency
        ):
            for out, one in zip(
                merged, self._predict_part(part, sub, context, before, n, groups), strict=True
            ):
                for name, values in vars(one).items():
                    out.setdefault(name, np.empty(len(cands)))[rows] = values
        return [Prediction(**out) for out in merged]

    def _predict_part(
        self,
        part: _Part,
        cands: Candidates,
        context: JobContext,
        previous: Sequence[Predecessor],
        samples: int | np.ndarray,
        same_latency: tuple[np.ndarray, np.ndarray] | None,
    ) -> list[Prediction]:
        """:meth:`predict_after` of rows all of one kind, ``part``."""
        scaled, _ = part.shard_work(cands, context, samples)
        lam, kappa = cands.workers, cands.kappa
        first, inverse = same_latency or (slice(None), slice(None))
        order = slowdown.order_quantiles(kappa[first], lam[first], (0.5, 0.9))
        order[0.9] = slowdown.upper_confidence(order[0.9], part.slowdown_records)
        shift = (part.cold_start_s / scaled)[first]
        coordinator = self._coordinator_s(kappa)
        progress = self.progress.level * self.progress.shape(cands, samples)
        log_progress = np.log(np.maximum(progress, 1e-9))
        tail = part.slowdown_quantile(np.full(1, 0.99))[0] * scaled + part.cold_start_s
        reference: tuple[np.ndarray, dict[float, np.ndarray]] | None = None
        out = []
        for before in previous:
            cold = slowdown.cold_workers(cands, before)
            share = (cold / lam)[first]
            solved = self._latency_quantiles(part.slowdowns, order, share, shift, reference)
            reference = reference or (share, solved)
            median = solved[0.5][inverse] * scaled + coordinator
            upper = solved[0.9][inverse] * scaled + coordinator
            log_lat = np.log(median)
            log_cost, log_cost_sd = part.cost(cands, scaled, cold, median, upper)
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

    def _part(self, code: int) -> _Part:
        """The part that predicts rows of kind ``code``."""
        name = KINDS[code]
        if name == LAMBDA:
            return self
        if name not in self.kinds:
            raise ValueError(f"the epoch model has no model of worker kind {name!r}")
        return self.kinds[name]

    def _by_kind(
        self,
        cands: Candidates,
        previous: Sequence[Predecessor],
        samples: int | np.ndarray,
        same_latency: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> Iterator[Any]:
        """Per kind among ``cands``: its rows, part, candidates, predecessors, samples
        and latency groups."""
        for code in np.unique(cands.kind).astype(int):
            rows = np.flatnonzero(cands.kind == code)
            before = [p.take(rows) if isinstance(p, Candidates) else p for p in previous]
            n = samples[rows] if isinstance(samples, np.ndarray) and samples.ndim else samples
            groups = _restrict(same_latency, rows) if same_latency is not None else None
            yield rows, self._part(int(code)), cands.take(rows), before, n, groups

    def planned_startup_s(self, cands: Candidates, previous: Predecessor) -> np.ndarray:
        """Per candidate, the start-up its epoch after ``previous`` plans into the job
        rather than the epoch's share: a GPU container's where one must start (0 for
        Lambda, whose cold starts are the epoch's own, and in-process)."""
        out = np.zeros(len(cands))
        if not cands.kind.any():
            return out
        for rows, part, sub, (before,), _, _ in self._by_kind(cands, (previous,), 0):
            if getattr(part, "planned_startup", False):
                cold = slowdown.cold_workers(sub, before) > 0
                out[rows] = np.where(cold, part.cold_start_s, 0.0)
        return out

    def time_limits(self, cands: Candidates, timeout_s: float) -> np.ndarray:
        """Per candidate, the longest a worker may take: Lambda's ``timeout_s``, the
        kind's own limit otherwise."""
        out = np.full(len(cands), float(timeout_s))
        if cands.kind.any():
            for rows, part, _, _, _, _ in self._by_kind(cands, (None,), 0):
                out[rows] = getattr(part, "limit_s", timeout_s)
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
        safer than it is.
        """
        samples = context.train_samples if samples is None else samples
        if not cands.kind.any():
            return self._on_time_part(self, cands, context, previous, log_deadline, samples)
        log_deadline = np.broadcast_to(log_deadline, (len(cands),))
        out = [np.empty(len(cands)) for _ in previous]
        for rows, part, sub, before, n, _ in self._by_kind(cands, previous, samples):
            scores = self._on_time_part(part, sub, context, before, log_deadline[rows], n)
            for whole, score in zip(out, scores, strict=True):
                whole[rows] = score
        return out

    def _on_time_part(
        self,
        part: _Part,
        cands: Candidates,
        context: JobContext,
        previous: Sequence[Predecessor],
        log_deadline: np.ndarray,
        samples: int | np.ndarray,
    ) -> list[np.ndarray]:
        scaled, _ = part.shard_work(cands, context, samples)
        lam, kappa = cands.workers, cands.kappa
        x = (np.exp(log_deadline) - self._coordinator_s(kappa)) / scaled
        shift = part.cold_start_s / scaled
        out = []
        for before in previous:
            cold = slowdown.cold_workers(cands, before) / lam
            done = slowdown.mixture_cdf(part.slowdowns, x, cold, shift)
            chance = betainc(kappa, lam - kappa + 1, done)
            out.append(np.asarray(ndtri(np.clip(chance, 1e-12, 1 - 1e-12))))
        return out

    def _latency_quantiles(
        self,
        slowdowns: np.ndarray,
        order: dict[float, np.ndarray],
        share: np.ndarray,
        shift: np.ndarray,
        reference: tuple[np.ndarray, dict[float, np.ndarray]] | None,
    ) -> dict[float, np.ndarray]:
        """Per quantile, a worker's duration (in seconds at slowdown 1) at the order
        statistic's position ``order[q]`` when a ``share`` of the workers is cold, under
        the slowdown distribution ``slowdowns``; rows whose share is the
        ``reference``'s take its solution.

        Each distinct (positions, share, shift) is solved once: memory past what buys
        the vCPUs the work can use adds no speed (for the sim model's one-vCPU worker,
        every size from 1,769 MB up), so many rows of a grid share a mixture.
        """
        rows = np.arange(len(share))
        if reference is not None:
            rows = np.flatnonzero(share != reference[0])
        first, inverse = _distinct(rows, *order.values(), share, shift)
        fresh = {
            q: slowdown.mixture_quantile(slowdowns, u[first], share[first], shift[first])[inverse]
            for q, u in order.items()
        }
        if reference is None:
            return fresh
        out = {}
        for q, values in reference[1].items():
            out[q] = values.copy()
            out[q][rows] = fresh[q]
        return out

    # -- Lambda as a part: what :meth:`_predict_part` asks of a kind -------------------
    @property
    def cold_start_s(self) -> float:
        return self.worker.cold_start_s

    def cost(
        self,
        cands: Candidates,
        scaled: np.ndarray,
        cold: np.ndarray,
        median_s: np.ndarray,
        upper_s: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        return self._cost(cands, scaled, cold)

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

    ``np.unique(..., axis=0)`` answers the same, but sorting rows as opaque records is
    several times slower than one lexsort."""
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
    search space's five learning rates make a fifth of the grid's latency work). Rows
    of different worker kinds are never in one group."""
    columns = np.column_stack(
        [cands.kind, cands.memory_mb, cands.workers, cands.sync_ratio, cands.batch_size]
    )
    _, first, inverse = np.unique(columns, axis=0, return_index=True, return_inverse=True)
    return first, inverse.ravel()


def _restrict(
    groups: tuple[np.ndarray, np.ndarray], rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`latency_groups` of the candidates at ``rows`` (ascending, all of one kind)
    from the groups of all of them, positions counted within ``rows``."""
    first, inverse = groups
    ids, within = np.unique(inverse[rows], return_inverse=True)
    return np.searchsorted(rows, first[ids]), within.ravel()


def delta_bytes(n: np.ndarray, context: JobContext) -> np.ndarray:
    """A delta's bytes: rows the shard touches (at most two per rating, at most the
    model's), each a row index, a count, a bias and ``factors`` floats."""
    rows = np.minimum(2 * n, max(context.model_rows, 1))
    return rows * 8 * (context.factors + 3)
