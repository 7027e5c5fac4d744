"""The worker kinds besides Lambda, as the analytic epoch model sees them.

Lambda's epoch is :class:`~configurator.epoch_model.EpochModel`'s own; every other kind
is a :class:`KindModel` that gives it, per candidate row, what an epoch of that kind is
made of:

* **GPU containers** (``gpu-<type>``, FaPES's "throughput by batch size" made a
  per-batch and a per-sample term): a worker's seconds on one GPU
  (:mod:`functions.runtimes.sim.gpu`, calibrated from the torch worker's speed-ups over
  the numpy worker), a container's start-up where none is warm, and the bill of every
  container held for the whole epoch (per second, EC2's list price). The start-up is
  planned into the job: it is counted against the job's deadline, not the epoch's
  share (:meth:`EpochModel.planned_startup_s
  <configurator.epoch_model.EpochModel.planned_startup_s>`), and its cost is amortised
  over the epochs left, so a job changes kind only when the switch pays for its start-up.
* **In process** (``inprocess``): the numpy worker on a core of the serving process, no
  start-up and no store round trip. Its seconds are the serving host's, which the
  service needs for its requests: each is priced at what it would cost on Lambda at one
  vCPU (the price of moving it off the host), and an epoch may hold the core at most
  ``IN_PROCESS_LIMIT_S``. So it wins where start-ups and Lambda's straggler tail
  dominate: small windows.

References
----------
X. Zhao et al., "FaPES: enabling efficient elastic scaling for serverless machine
learning platforms", SoCC 2024, §4.1 (throughput under a batch size and a GPU
allocation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from configurator import slowdowns as slowdown
from configurator.slowdowns import PRIOR_WEIGHT_RECORDS, Z90
from configurator.space import IN_PROCESS, Candidates
from functions.gpu_performance import gpu_kind
from functions.performance import DEFAULT_MODEL
from functions.pricing import lambda_prices

if TYPE_CHECKING:
    from configurator.base import JobContext, WorkerRun

#: The longest an in-process epoch may hold a core of the serving process. Beyond
#: about a second a retraining epoch runs through several heartbeats of request
#: serving; the job belongs on workers of its own then, start-up and all.
IN_PROCESS_LIMIT_S = 1.0
#: The prior's spread of a kind's workers (a mean-one log-normal, no stragglers): a
#: dedicated GPU varies little; the serving host's core is shared with requests.
GPU_PRIOR_SIGMA = 0.1
#: Slowdown draws of a kind's prior distribution.
KIND_DRAWS = 2048


def lognormal_slowdowns(sigma: float, seed: int = 0) -> np.ndarray:
    """Sorted slowdowns of a mean-one log-normal with ``sigma``, median 1."""
    draws = np.sort(np.random.default_rng(seed).lognormal(0.0, sigma, KIND_DRAWS))
    return draws / float(np.median(draws))


@dataclass(frozen=True)
class KindModel:
    """One worker kind's epoch, per candidate row; see the module docstring.

    Parameters
    ----------
    name
        The kind (``KINDS``).
    compute_s_per_sample, compute_s_per_batch, overhead_s
        A worker's seconds at slowdown 1: per sample update, per minibatch, per pass.
    startup_s
        Seconds a worker that finds no warm container waits before its shard.
    unbilled_startup_s
        Of the start-up, the seconds not billed (an instance not yet running).
    second_usd
        Price per worker-second.
    held
        True: every worker is billed for the whole epoch (a container held for the job,
        waiting for the slowest); False: for its own seconds.
    limit_s
        The longest a worker may take.
    planned_startup
        Whether a start-up is planned into the job rather than the epoch's share.
    slowdowns, slowdown_records
        The workers' slowdown distribution (sorted, median 1) and the records it stands
        for.
    """

    name: str
    compute_s_per_sample: float
    compute_s_per_batch: float
    overhead_s: float
    startup_s: float
    unbilled_startup_s: float
    second_usd: float
    held: bool
    limit_s: float
    planned_startup: bool
    slowdowns: np.ndarray
    slowdown_records: float = PRIOR_WEIGHT_RECORDS

    @property
    def cold_start_s(self) -> float:
        return self.startup_s

    def shard_work(
        self, cands: Candidates, context: JobContext, samples: int | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(seconds at slowdown 1, shard samples)`` per candidate."""
        n = np.ceil(samples / cands.workers)
        batches = np.ceil(n / cands.batch_size)
        seconds = n * self.compute_s_per_sample + batches * self.compute_s_per_batch
        return self.overhead_s + seconds, n

    def slowdown_quantile(self, u: np.ndarray) -> np.ndarray:
        return slowdown.quantile(self.slowdowns, u)

    def cost(
        self,
        cands: Candidates,
        scaled: np.ndarray,
        cold: np.ndarray,
        median_s: np.ndarray,
        upper_s: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Log cost and its sd. Held containers: λ of them for the epoch's median
        latency, less the unbilled start-up of the cold ones; otherwise the mean
        slowdown's seconds of each worker."""
        if self.held:
            seconds = cands.workers * median_s - cold * min(self.unbilled_startup_s, self.startup_s)
            sd = (np.log(upper_s) - np.log(median_s)) / Z90
        else:
            mean = float(np.mean(self.slowdowns))
            seconds = cands.workers * mean * scaled
            sd = np.full(len(cands), float(np.std(self.slowdowns)) / max(mean, 1e-9))
        cost = np.maximum(seconds, 1e-9) * self.second_usd
        return np.log(cost), np.maximum(sd, 0.005)

    def recalibrated(self, runs: list[WorkerRun], context: JobContext) -> KindModel:
        """This kind refitted to its workers' records: a common scale of its seconds
        from the warm runs' median ratio to the prediction, their slowdowns pooled with
        the prior's, the start-up from the cold runs' excess."""
        if not runs:
            return self
        predicted = self._predicted(runs)
        warm = np.array([not r.cold_start for r in runs])
        observed = np.array([r.duration_s for r in runs])
        out = self
        if warm.any():
            ratios = observed[warm] / np.maximum(predicted[warm], 1e-9)
            scale = float(np.median(ratios))
            pooled, records = slowdown.pooled(self.slowdowns, ratios / scale)
            out = replace(
                self,
                compute_s_per_sample=self.compute_s_per_sample * scale,
                compute_s_per_batch=self.compute_s_per_batch * scale,
                overhead_s=self.overhead_s * scale,
                slowdowns=pooled,
                slowdown_records=records,
            )
            predicted = predicted * scale
        if (~warm).any():
            extra = observed[~warm] - predicted[~warm]
            out = replace(out, startup_s=max(0.0, float(np.median(extra))))
        return out

    def _predicted(self, runs: list[WorkerRun]) -> np.ndarray:
        out = []
        for r in runs:
            batches = math.ceil(r.samples / r.batch_size) if r.batch_size else 0
            out.append(
                self.overhead_s
                + r.samples * self.compute_s_per_sample
                + batches * self.compute_s_per_batch
            )
        return np.array(out)


def gpu_kind_model(name: str, seed: int = 0) -> KindModel:
    """The prior of GPU kind ``name`` (``gpu-<type>``): the simulator's calibrated GPU
    model and the price file's list price and start-up."""
    gpu = gpu_kind(name.removeprefix("gpu-"))
    return KindModel(
        name=name,
        compute_s_per_sample=gpu.model.per_sample_s,
        compute_s_per_batch=gpu.model.compute_s_per_batch,
        overhead_s=gpu.model.overhead_s,
        startup_s=gpu.startup_s,
        unbilled_startup_s=gpu.prices.unbilled_startup_s,
        second_usd=gpu.prices.second_usd,
        held=True,
        limit_s=math.inf,
        planned_startup=True,
        slowdowns=lognormal_slowdowns(GPU_PRIOR_SIGMA, seed),
    )


def in_process_model(seed: int = 0) -> KindModel:
    """The prior of the in-process kind: the numpy worker's seconds at one vCPU
    (``DEFAULT_MODEL``, without the store round trip its overhead holds), each priced at
    Lambda's vCPU-second."""
    prices = lambda_prices()
    return KindModel(
        name=IN_PROCESS,
        compute_s_per_sample=DEFAULT_MODEL.compute_s_per_sample,
        compute_s_per_batch=DEFAULT_MODEL.compute_s_per_batch,
        overhead_s=0.0,
        startup_s=0.0,
        unbilled_startup_s=0.0,
        second_usd=prices.mb_per_vcpu / 1024.0 * prices.gb_second_usd,
        held=False,
        limit_s=IN_PROCESS_LIMIT_S,
        planned_startup=False,
        slowdowns=lognormal_slowdowns(DEFAULT_MODEL.jitter_sigma, seed),
    )


def kind_models(names: tuple[str, ...], seed: int = 0) -> dict[str, KindModel]:
    """The priors of the kinds ``names`` (Lambda is the epoch model's own: left out)."""
    out = {}
    for name in names:
        if name == IN_PROCESS:
            out[name] = in_process_model(seed)
        elif name.startswith("gpu-"):
            out[name] = gpu_kind_model(name, seed)
    return out


__all__ = [
    "GPU_PRIOR_SIGMA",
    "IN_PROCESS_LIMIT_S",
    "KindModel",
    "gpu_kind_model",
    "in_process_model",
    "kind_models",
    "lognormal_slowdowns",
]
