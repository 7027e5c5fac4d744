"""The ground truth of the worker-kind scenarios of ``driftline bench configurator``:
Lambda as in :mod:`benchmarks.gpopt.truth`, GPU containers and the service's own process
beside it, and the oracle that plans a job's kind knowing all of it.

* **GPU containers** run the simulator's GPU model (:mod:`functions.runtimes.sim.gpu`:
  the torch worker's per-sample and per-batch seconds calibrated from its measured
  speed-ups, a mean-one log-normal jitter of 0.05 and no stragglers) slowed by
  ``GPU_TRUTH_ERROR``: the configurator's prior is that calibration, and the truth is
  not its prior. A container that is not already held starts ``startup_s`` (the price
  file's) before its shard; every container of an epoch is held, and billed per second
  at its list price, until the epoch's slowest worker and the coordinator are done,
  less the unbilled start of the instance. Each epoch's held seconds are billed
  exactly; the rounding to whole seconds at release is a few cents in a thousand of a
  job and left out (:func:`~functions.runtimes.sim.gpu.simulate_gpu_epochs` bills
  leases exactly).
* **In process**: the numpy worker at ``DEFAULT_MODEL``'s seconds on one core, its
  jitter and no stragglers, no start-up and no store round trip, each second priced as
  the configurator prices it (Lambda's vCPU-second).
* **Progress** is the measured table's. Batch sizes past the largest measured one are
  looked up at the same SGD steps per worker (the shard scaled by the batch sizes'
  ratio): what the table measures is how far a worker's steps take the loss.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from benchmarks.gpopt.progress import ProgressTable
from benchmarks.gpopt.truth import EpochOutcome, Truth
from configurator.base import Configurator, JobContext, Observation, WorkerRun
from configurator.kinds import IN_PROCESS_LIMIT_S, in_process_model
from configurator.space import IN_PROCESS, KINDS, LAMBDA, Candidates, EpochConfig, SearchSpace
from functions.gpu_performance import gpu_kind
from functions.performance import DEFAULT_MODEL

#: How much slower the true GPUs are than the calibration the configurator starts from.
GPU_TRUTH_ERROR = 1.2
#: A GPU's jitter (dedicated, no stragglers).
GPU_SIGMA = 0.05


@dataclass(frozen=True)
class TrueKind:
    """A worker kind besides Lambda, as it really is in the benchmark."""

    name: str
    per_sample_s: float
    per_batch_s: float
    overhead_s: float
    startup_s: float
    unbilled_s: float
    second_usd: float
    held: bool
    sigma: float
    limit_s: float = math.inf

    def seconds(self, n: np.ndarray, batch: np.ndarray) -> np.ndarray:
        return self.overhead_s + n * self.per_sample_s + np.ceil(n / batch) * self.per_batch_s

    def draw(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        return np.exp(self.sigma * rng.standard_normal(size) - self.sigma**2 / 2)


def true_kinds() -> dict[str, TrueKind]:
    """Every kind besides Lambda, by name."""
    out = {}
    for name in KINDS:
        if name.startswith("gpu-"):
            gpu = gpu_kind(name.removeprefix("gpu-"))
            out[name] = TrueKind(
                name,
                gpu.model.per_sample_s * GPU_TRUTH_ERROR,
                gpu.model.compute_s_per_batch * GPU_TRUTH_ERROR,
                gpu.model.overhead_s * GPU_TRUTH_ERROR,
                gpu.startup_s,
                gpu.prices.unbilled_startup_s,
                gpu.prices.second_usd,
                held=True,
                sigma=GPU_SIGMA,
            )
    cpu = in_process_model()
    out[IN_PROCESS] = TrueKind(
        IN_PROCESS,
        DEFAULT_MODEL.compute_s_per_sample,
        DEFAULT_MODEL.compute_s_per_batch,
        0.0,
        0.0,
        0.0,
        cpu.second_usd,
        held=False,
        sigma=DEFAULT_MODEL.jitter_sigma,
        limit_s=IN_PROCESS_LIMIT_S,
    )
    return out


class KindTruth(Truth):
    """:class:`Truth` over candidates of every kind: Lambda rows are the parent's."""

    def __init__(self, context: JobContext, progress: ProgressTable, seed: int = 0) -> None:
        super().__init__(context, progress, seed=seed)
        self.kinds = true_kinds()

    def _kind(self, code: int) -> TrueKind:
        return self.kinds[KINDS[code]]

    def _split(self, cands: Candidates) -> list[tuple[int, np.ndarray]]:
        return [(int(c), np.flatnonzero(cands.kind == c)) for c in np.unique(cands.kind)]

    def _scaled(self, cands: Candidates) -> tuple[np.ndarray, np.ndarray]:
        if not cands.kind.any():
            return super()._scaled(cands)
        seconds, n = np.empty(len(cands)), np.ceil(self.context.train_samples / cands.workers)
        for code, rows in self._split(cands):
            if code == 0:
                seconds[rows] = super()._scaled(cands.take(rows))[0]
            else:
                seconds[rows] = self._kind(code).seconds(n[rows], cands.batch_size[rows])
        return seconds, n

    def quantile_latency(self, cands: Candidates, q: float, draws: int = 128) -> np.ndarray:
        """As :meth:`Truth.quantile_latency`; a kind's steady epoch waits for all λ."""
        if not cands.kind.any():
            return super().quantile_latency(cands, q, draws)
        out = np.empty(len(cands))
        scaled, _ = self._scaled(cands)
        rng = np.random.default_rng(20_000)
        for code, rows in self._split(cands):
            if code == 0:
                out[rows] = super().quantile_latency(cands.take(rows), q, draws)
                continue
            kind = self._kind(code)
            for lam in np.unique(cands.workers[rows]).astype(int):
                some = rows[cands.workers[rows] == lam]
                slowest = kind.draw(rng, (draws, lam)).max(axis=1)
                out[some] = np.quantile(slowest, q) * scaled[some]
                out[some] = np.where(scaled[some] > kind.limit_s, np.inf, out[some])
        return out

    def mean_cost(self, cands: Candidates) -> np.ndarray:
        """A steady epoch's expected bill: Lambda's as the parent's; held containers for
        the expected slowest of λ, others for their own seconds."""
        if not cands.kind.any():
            return super().mean_cost(cands)
        out = np.empty(len(cands))
        scaled, _ = self._scaled(cands)
        rng = np.random.default_rng(30_000)
        for code, rows in self._split(cands):
            if code == 0:
                out[rows] = super().mean_cost(cands.take(rows))
                continue
            kind = self._kind(code)
            lam = cands.workers[rows]
            if kind.held:
                slowest = {w: kind.draw(rng, (512, int(w))).max(axis=1).mean() for w in set(lam)}
                factor = np.array([slowest[w] for w in lam])
                out[rows] = lam * factor * scaled[rows] * kind.second_usd
            else:
                out[rows] = lam * scaled[rows] * kind.second_usd
        return out

    def mean_progress(self, cands: Candidates, phase: float = 1.0) -> np.ndarray:
        """Progress at the SGD steps a worker takes, ``⌈n/(λb)⌉``: looked up at the
        largest measured batch size up to ``b`` whose measured shards reach as many
        steps (``b`` itself within the table), else at the smallest batch size's most
        steps (where progress has saturated). The parent clamps the shard instead, so a
        worker on a window larger than the measured one takes as few steps as on that
        one; a GPU's batches of 65,536 would look like two steps of a 10^7 window."""
        _, n = self._scaled(cands)
        steps = np.ceil(n / cands.batch_size)
        measured = np.asarray(self.progress.batch_size, dtype=np.float64)
        reach = measured[None, :] * steps[:, None] <= self.progress.shards[-1] * (1 + 1e-9)
        usable = reach & (measured[None, :] <= cands.batch_size[:, None])
        pick = np.where(usable.any(axis=1), usable.shape[1] - 1 - usable[:, ::-1].argmax(axis=1), 0)
        batch = measured[pick]
        looked = replace(cands, batch_size=batch)
        return self.progress.lookup(looked, steps * batch) * phase

    def startup_cost(self, cands: Candidates) -> np.ndarray:
        """Per candidate, what starting its λ containers costs (0 but for GPUs)."""
        out = np.zeros(len(cands))
        for code, rows in self._split(cands):
            if code:
                kind = self._kind(code)
                billed = max(kind.startup_s - kind.unbilled_s, 0.0)
                out[rows] = cands.workers[rows] * billed * kind.second_usd
        return out

    def startup_s(self, cands: Candidates) -> np.ndarray:
        out = np.zeros(len(cands))
        for code, rows in self._split(cands):
            if code:
                out[rows] = self._kind(code).startup_s
        return out

    def run(
        self,
        config: EpochConfig,
        previous: EpochConfig | None,
        phase: float,
        rng: np.random.Generator,
    ) -> EpochOutcome:
        if config.kind == LAMBDA:
            return super().run(config, previous, phase, rng)
        kind = self.kinds[config.kind]
        cands = Candidates.of([config])
        scaled, n = self._scaled(cands)
        lam = config.workers
        slow = kind.draw(rng, lam)
        warm = 0
        if previous is not None and previous.kind == config.kind:
            warm = previous.workers
        cold = np.arange(lam) >= warm
        durations = slow * scaled[0] + cold * kind.startup_s
        latency = float(durations.max())
        if kind.held:
            billed = lam * latency - cold.sum() * min(kind.unbilled_s, kind.startup_s)
        else:
            billed = float(durations.sum())
        mean = float(self.mean_progress(cands, phase)[0])
        progress = mean * float(np.exp(self.progress.noise_sd * rng.standard_normal()))
        runs = tuple(
            WorkerRun(
                config.memory_mb, int(n[0]), float(d), bool(c), config.batch_size, kind=kind.name
            )
            for d, c in zip(durations, cold, strict=True)
        )
        return EpochOutcome(latency, billed * kind.second_usd, progress, runs)


class KindOracle(Configurator):
    """The job's best plan, knowing the truth: the lowest cost per progress over the job,
    a GPU's start-up amortised over its epochs, among the candidates whose true 90th
    percentile latency meets the deadline share (for a GPU, the share left once its
    start-up is taken off the job's deadline). The plan is kept every epoch."""

    def __init__(self, space: SearchSpace, truth: KindTruth, share: float, epochs: int) -> None:
        grid = space.grid()
        q90 = truth.quantile_latency(grid, 0.9)
        allowed = np.maximum(share - truth.startup_s(grid) / epochs, 0.0)
        progress = truth.mean_progress(grid)
        cost = truth.mean_cost(grid) + truth.startup_cost(grid) / epochs
        objective = np.where(progress > 0, cost / np.maximum(progress, 1e-300), np.inf)
        feasible = q90 <= allowed
        row = np.argmin(np.where(feasible, objective, np.inf)) if feasible.any() else np.argmin(q90)
        self.config = grid.config(int(row))

    def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        return self.config


def kind_of_job(configs: Sequence[EpochConfig]) -> str:
    """The kind a job ran most of its epochs on (its last epoch's on a tie)."""
    counts: dict[str, int] = {}
    for c in configs:
        counts[c.kind] = counts.get(c.kind, 0) + 1
    top = max(counts.values())
    return next(c.kind for c in reversed(configs) if counts[c.kind] == top)


__all__ = [
    "GPU_TRUTH_ERROR",
    "KindOracle",
    "KindTruth",
    "TrueKind",
    "kind_of_job",
    "true_kinds",
]
