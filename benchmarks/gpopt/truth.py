"""The ground truth of ``driftline bench configurator``: what each config vector's epoch
really takes, costs and achieves, replayed with fresh noise for every method alike.

Resources come from the calibrated simulator: the sim runtime's ``DEFAULT_MODEL`` (fitted
on the real worker, ``docs/simulator.md``) with the straggler distribution of
``driftline bench sync`` (a fifth of the invocations 3-5× slower). An epoch draws λ
slowdowns exactly as the sim runtime does, takes the κ-th fastest of the λ durations
(the coordinator's selective sync), and bills every worker as Lambda does; cold workers
are those no warm container was left for.

Loss progress comes from real worker updates on MovieLens (:mod:`benchmarks.gpopt.progress`),
replayed with the epoch-to-epoch noise measured there, scaled by the job's phase (how
near its loss already is to the floor; the caller keeps it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.gpopt.progress import ProgressTable
from configurator.base import JobContext, WorkerRun
from configurator.performance import SAMPLE_BYTES
from configurator.space import Candidates, EpochConfig
from functions.performance import DEFAULT_MODEL, PerformanceModel
from functions.pricing import LambdaPrices, lambda_prices

STRAGGLER_PROBABILITY = 0.2
STRAGGLER_SLOWDOWN = (3.0, 5.0)
#: Draws that stand for the true slowdown distribution in exact quantiles.
TRUTH_DRAWS = 200_000


def true_worker_model() -> PerformanceModel:
    return DEFAULT_MODEL.replace(
        straggler_p=STRAGGLER_PROBABILITY, straggler_slowdown=STRAGGLER_SLOWDOWN
    )


def draw_slowdowns(model: PerformanceModel, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` slowdowns as :meth:`PerformanceModel.draw_slowdown` draws them, vectorised."""
    straggler, pick, z = rng.random(n), rng.random(n), rng.standard_normal(n)
    low, high = model.straggler_slowdown
    factor = np.where(straggler < model.straggler_p, low + (high - low) * pick, 1.0)
    sigma = model.jitter_sigma
    return factor * np.exp(sigma * z - sigma**2 / 2.0)


@dataclass(frozen=True)
class EpochOutcome:
    """One replayed epoch."""

    latency_s: float
    cost_usd: float
    progress: float
    workers: tuple[WorkerRun, ...]


class Truth:
    """The true epoch of every config vector for one job (window size and model)."""

    def __init__(
        self,
        context: JobContext,
        progress: ProgressTable,
        model: PerformanceModel | None = None,
        prices: LambdaPrices | None = None,
        seed: int = 0,
    ) -> None:
        self.context = context
        self.progress = progress
        self.model = model or true_worker_model()
        self.prices = prices or lambda_prices()
        rng = np.random.default_rng(10_000 + seed)
        self._draws = np.sort(draw_slowdowns(self.model, rng, TRUTH_DRAWS))
        self._quantiles: dict[tuple[int, int, float, int], np.ndarray] = {}

    def with_samples(self, samples: int) -> Truth:
        """The same truth for a window of ``samples`` ratings (a mid-job jump)."""
        context = JobContext(**{**self.context.__dict__, "train_samples": samples})
        out = Truth.__new__(Truth)
        out.__dict__.update(self.__dict__)
        out.context = context
        out._quantiles = {}
        return out

    def _scaled(self, cands: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Seconds at slowdown 1 (without a cold start), and shard samples."""
        m, c = self.model, self.context
        n = np.ceil(c.train_samples / cands.workers)
        batches = np.ceil(n / cands.batch_size)
        moved = c.snapshot_bytes + n * SAMPLE_BYTES
        io = m.request_latency_s * 3 + moved / m.bandwidth_bytes_per_s
        share = np.minimum(np.minimum(cands.memory_mb / m.mb_per_vcpu, m.max_vcpus), m.worker_vcpus)
        compute = (n * m.compute_s_per_sample + batches * m.compute_s_per_batch) / share
        return m.overhead_s + io + compute, n

    # -- exact, for the oracle --------------------------------------------------------
    def quantile_latency(self, cands: Candidates, q: float, draws: int = 128) -> np.ndarray:
        """The q-quantile of a steady epoch's latency: Monte Carlo of :meth:`run` with the
        config following itself (the λ−κ workers left running make as many cold).

        The slowdowns of a (λ, κ/λ) pair are drawn once and scaled by every memory and
        batch size sharing it (the learning rate changes no second), so the oracle's
        exhaustive search over ~35,000 candidates costs a hundred draws, not thousands;
        answers are kept per candidate set, since the oracle asks every epoch.
        """
        key = (len(cands), hash(cands.memory_mb.tobytes() + cands.workers.tobytes()), q, draws)
        cached = self._quantiles.get(key)
        if cached is not None:
            return cached
        scaled, _ = self._scaled(cands)
        kappa = cands.kappa
        warm = np.where(cands.sync_ratio >= 1, cands.workers, kappa).astype(int)
        pairs = np.column_stack([cands.workers, kappa, warm]).astype(int)
        unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
        inverse = inverse.ravel()
        rng = np.random.default_rng(20_000)
        out = np.empty(len(cands))
        for g, (lam, k, w) in enumerate(unique):
            rows = np.flatnonzero(inverse == g)
            slow = draw_slowdowns(self.model, rng, draws * lam).reshape(1, draws, lam)
            cold = np.zeros(lam)
            cold[w:] = self.model.cold_start_s
            chunk = max(1, 4_000_000 // (draws * lam))
            for start in range(0, len(rows), chunk):
                part = rows[start : start + chunk]
                durations = slow * scaled[part, None, None] + cold
                kth = np.partition(durations, k - 1, axis=2)[:, :, k - 1]
                out[part] = np.quantile(kth, q, axis=1)
        self._quantiles[key] = out
        return out

    def mean_cost(self, cands: Candidates) -> np.ndarray:
        """A steady epoch's expected bill: λ workers, the λ−κ of them cold."""
        scaled, _ = self._scaled(cands)
        cold = cands.workers - np.where(cands.sync_ratio >= 1, cands.workers, cands.kappa)
        seconds = cands.workers * self._draws.mean() * scaled + cold * self.model.cold_start_s
        gb_s = seconds * cands.memory_mb / 1024.0
        return gb_s * self.prices.gb_second_usd + cands.workers * self.prices.request_usd

    def mean_progress(self, cands: Candidates, phase: float = 1.0) -> np.ndarray:
        """Expected progress of each candidate at the job's ``phase``
        (:meth:`ProgressTable.phase`)."""
        _, n = self._scaled(cands)
        return self.progress.lookup(cands, n) * phase

    def objective(self, cands: Candidates) -> np.ndarray:
        """Cost per unit of progress (what is minimised); inf where progress is none.
        The phase scales every candidate's progress alike, so it is left out."""
        progress = self.mean_progress(cands)
        return np.where(progress > 0, self.mean_cost(cands) / np.maximum(progress, 1e-300), np.inf)

    # -- a replayed epoch ----------------------------------------------------------------
    def run(
        self,
        config: EpochConfig,
        previous: EpochConfig | None,
        phase: float,
        rng: np.random.Generator,
    ) -> EpochOutcome:
        cands = Candidates.of([config])
        scaled, n = self._scaled(cands)
        lam = config.workers
        kappa = int(cands.kappa[0])
        slow = draw_slowdowns(self.model, rng, lam)
        cold = np.zeros(lam, dtype=bool)
        if previous is None or previous.memory_mb != config.memory_mb:
            cold[:] = True
        else:
            last = Candidates.of([previous])
            warm = previous.workers if last.sync_ratio[0] >= 1 else int(last.kappa[0])
            if lam > warm:
                cold[rng.choice(lam, lam - warm, replace=False)] = True
        durations = slow * scaled[0] + cold * self.model.cold_start_s
        latency = float(np.partition(durations, kappa - 1)[kappa - 1])
        billed = np.ceil(durations * 1000.0) / 1000.0
        cost = float(
            np.sum(billed * config.memory_mb / 1024.0) * self.prices.gb_second_usd
            + lam * self.prices.request_usd
        )
        mean = float(self.mean_progress(cands, phase)[0])
        progress = mean * float(np.exp(self.progress.noise_sd * rng.standard_normal()))
        runs = tuple(
            WorkerRun(config.memory_mb, int(n[0]), float(d), bool(c), config.batch_size)
            for d, c in zip(durations, cold, strict=True)
        )
        return EpochOutcome(latency, cost, progress, runs)
