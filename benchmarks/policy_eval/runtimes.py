"""How long a retraining job takes and what it costs, on functions or on VMs.

Every runtime sees the same job: ``samples`` true samples for ``epochs`` epochs, the
window since the last job plus the history sample the service's window rule adds
(:meth:`JobModel.history_for`), priced by the same per-sample compute model (the simulator's
:class:`PerformanceModel`, times ``compute_scale`` for a model larger than the
calibrated 8-factor worker), plus ``job_overhead_s`` of fixed work outside training
(exporting the window, publishing, building the serving state), which every runtime
pays alike and none bills.

* ``sim``: Lambda workers in the simulator. The analytic pick of the configurator: the
  fewest 1,769 MB workers (one vCPU) whose expected epochs meet the job's deadline, κ =
  ¾ λ; the epochs are then simulated (stragglers, jitter, cold starts) and billed
  (GB-s per started ms, requests, initialisation, object-store requests). A drift job's
  deadline is ``drift_latency_cap_s`` (the service's ``DRIFT_LATENCY_CAP_SECONDS``),
  every other job's ``latency_cap_s``.
* ``vm``: always on, sized for the trace's peak training demand, billed for the horizon.
* ``vm-autoscaled``: a target-tracking fleet of the same instances (70 %, boot delay,
  300 s scale-in cooldown), billed per instance-second with a 60 s minimum.

The VMs' demand is the stream's: keeping up with incorporating every arrival, each job
within the latency cap with its history sample (:meth:`JobModel.demand_vcpus`), so their
bill does not depend on the policy; only a function's bill does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from functions.performance import DEFAULT_MODEL, PerformanceModel
from functions.pricing import VmPrices
from functions.runtimes.sim import AutoscaledFleet, PeakSizedVm, function_bill, simulate_epochs
from retrain.spec import JobSpec

MEMORY_MB = 1769
BATCH_SIZE = 1024


@dataclass(frozen=True)
class JobModel:
    """What every runtime's jobs share: compute per sample, epochs, cap, overhead."""

    epochs: int = 5
    latency_cap_s: float = 120.0
    #: Urgent: 10 s of training past the 15 s overhead. A tighter cap buys more
    #: workers, each with its object-store requests every epoch; this is the loosest,
    #: in steps of 5 s, that keeps drift jobs 1.6x faster than cost-aware's on every
    #: trace (30 s, the service's default: Berkeley 1.5x; BENCHMARKS.md "policies").
    drift_latency_cap_s: float = 25.0
    job_overhead_s: float = 15.0
    compute_scale: float = 32.0
    #: The service's window rule, with its defaults (``HISTORY_SAMPLE``,
    #: ``DRIFT_WINDOW_HISTORY_RATIO``): at most this many older samples join a window,
    #: and a drift job's at most this many per new sample.
    history_sample: int = 50_000
    drift_history_ratio: float | None = 3.0

    def history_for(self, trigger: str, window: float, older: float) -> float:
        """True samples of history a job started for ``trigger`` adds to its ``window``
        new ones, ``older`` being all there are: the service's ``WindowPolicy``, or its
        ``ChangeWindowPolicy``'s bound for a drift job (whose window here still starts
        at the last job, not at the alert's change point: the ladder has no other).

        The bound is on samples, not on a share of the window: a job over hours of a
        busy trace adds no more history than one over a minute, so retraining less
        often trains less, as it does in the service.

        >>> JobModel().history_for("refresh", 1_000_000, 3_000_000)
        50000
        >>> JobModel().history_for("drift", 4_000, 3_000_000)
        12000.0
        """
        bound = min(self.history_sample, older)
        if trigger == "drift" and self.drift_history_ratio is not None:
            return min(bound, self.drift_history_ratio * window)
        return bound

    def deadline_for(self, trigger: str) -> float:
        """A job's deadline by what started it, by the service's own rule
        (``JobSpec.for_trigger``)."""
        spec = JobSpec(
            latency_cap_s=self.latency_cap_s, drift_latency_cap_s=self.drift_latency_cap_s
        )
        return spec.for_trigger(trigger).latency_cap_s

    def performance(self) -> PerformanceModel:
        base = DEFAULT_MODEL
        return base.replace(
            compute_s_per_sample=base.compute_s_per_sample * self.compute_scale,
            compute_s_per_batch=base.compute_s_per_batch * self.compute_scale,
        )

    def vcpu_s_per_sample(self) -> float:
        """Seconds of one vCPU per sample update."""
        model = self.performance()
        return model.compute_s_per_sample + model.compute_s_per_batch / BATCH_SIZE

    def demand_vcpus(self, rates: np.ndarray) -> np.ndarray:
        """vCPUs that keep up with training every arrival: a job over the last
        ``latency_cap_s`` of arrivals, plus its history sample, done within the cap."""
        per_sample = self.epochs * self.vcpu_s_per_sample()
        return rates * per_sample + self.history_sample * per_sample / self.latency_cap_s


@dataclass(frozen=True)
class JobRun:
    """One job: when it ends (virtual seconds) and what it adds to the bill."""

    finish_s: float
    cost_usd: float


class JobRuntime:
    """Runs jobs in virtual time and sends the bill."""

    name: str

    def run(self, start_s: float, samples: float, trigger: str = "") -> JobRun:
        raise NotImplementedError

    def standing_cost(self) -> float:
        """What the runtime costs over the horizon whatever the jobs (VMs being up)."""
        return 0.0


class FunctionRuntime(JobRuntime):
    name = "sim"

    def __init__(self, jobs: JobModel, seed: int) -> None:
        self.jobs = jobs
        self.model = jobs.performance()
        self.seed = seed
        self._count = 0

    def workers_for(self, samples: float, cap_s: float | None = None) -> int:
        """The fewest workers whose expected epochs fit the cap's training share."""
        budget = (cap_s or self.jobs.latency_cap_s) - self.jobs.job_overhead_s
        per_epoch = budget / self.jobs.epochs - self.model.overhead_s - self.model.cold_start_s
        compute = samples * self.jobs.vcpu_s_per_sample() * self.model.mean_slowdown()
        return int(min(1000, max(1, math.ceil(compute / max(per_epoch, 1e-3)))))

    def run(self, start_s: float, samples: float, trigger: str = "") -> JobRun:
        workers = self.workers_for(samples, self.jobs.deadline_for(trigger))
        self._count += 1
        sim = simulate_epochs(
            max(1, math.ceil(0.75 * workers)),
            workers,
            max(1, math.ceil(samples / workers)),
            self.jobs.epochs,
            self.model,
            memory_mb=MEMORY_MB,
            batch_size=BATCH_SIZE,
            seed=self.seed * 100_003 + self._count,
        )
        bill = function_bill(sim.records, self.jobs.epochs)
        return JobRun(start_s + self.jobs.job_overhead_s + sim.latency_s, bill.total_usd)


class PeakVmRuntime(JobRuntime):
    name = "vm"

    def __init__(self, jobs: JobModel, rates: np.ndarray, prices: VmPrices) -> None:
        self.jobs = jobs
        self.vm = PeakSizedVm.sized_for(float(jobs.demand_vcpus(rates).max()), prices)
        self.horizon = len(rates)

    def run(self, start_s: float, samples: float, trigger: str = "") -> JobRun:
        work = samples * self.jobs.epochs * self.jobs.vcpu_s_per_sample()
        return JobRun(self.vm.finish(start_s + self.jobs.job_overhead_s, work), 0.0)

    def standing_cost(self) -> float:
        return self.vm.bill(self.horizon)


class AutoscaledRuntime(JobRuntime):
    name = "vm-autoscaled"

    def __init__(
        self, jobs: JobModel, rates: np.ndarray, prices: VmPrices, boot_s: int = 60
    ) -> None:
        self.jobs = jobs
        self.fleet = AutoscaledFleet.track(jobs.demand_vcpus(rates), prices, boot_s=boot_s)

    def run(self, start_s: float, samples: float, trigger: str = "") -> JobRun:
        work = samples * self.jobs.epochs * self.jobs.vcpu_s_per_sample()
        return JobRun(self.fleet.finish(start_s + self.jobs.job_overhead_s, work), 0.0)

    def standing_cost(self) -> float:
        return self.fleet.bill()


#: Job runtimes by name; each is built from the job model, the trace's per-second
#: arrival rates, the VM price set, the seed and the fleet's boot delay.
RuntimeFactory = Callable[[JobModel, np.ndarray, VmPrices, int, int], JobRuntime]
RUNTIMES: dict[str, RuntimeFactory] = {
    "sim": lambda jobs, rates, prices, seed, boot: FunctionRuntime(jobs, seed),
    "vm": lambda jobs, rates, prices, seed, boot: PeakVmRuntime(jobs, rates, prices),
    "vm-autoscaled": lambda jobs, rates, prices, seed, boot: AutoscaledRuntime(
        jobs, rates, prices, boot
    ),
}
