"""VM baselines in the simulator's virtual time: a peak-sized VM and an autoscaled fleet.

The alternatives a platform team would pick instead of functions (SandPiper, Ali et al.).
Both run a job's work with the same per-sample compute model as the ``sim`` function
runtime (:class:`PerformanceModel` at one full vCPU per worker thread), spread evenly
over the vCPUs that are up, with no cold starts and no object-store traffic (the data
sits on the machine). What differs is the bill: a VM is billed for being up, per second
with a minimum, whether it trains or idles.

* :class:`PeakSizedVm`: always on for the whole trace, sized so a job over one latency
  cap's worth of the trace's peak arrivals finishes within the cap.
* :class:`AutoscaledFleet`: instances of one type under target tracking (EC2 Auto
  Scaling's default policy): every ``period_s`` the fleet wants ``ceil(demand /
  (target · vcpus))`` instances; new ones are billed from launch but serve only after
  ``boot_s``; it scales in only ``cooldown_s`` after its last scaling action. A job that
  starts while instances boot runs on the capacity that is up, so slow scaling delays
  its swap, which is what it costs in accuracy.

>>> from functions.pricing import vm_prices
>>> vm = PeakSizedVm.sized_for(peak_demand_vcpus=3.0, prices=vm_prices("c5"))
>>> vm.instances, vm.finish(100.0, vcpu_seconds=40.0), round(vm.bill(3600.0), 3)
(2, 110.0, 0.17)
>>> demand = np.r_[np.full(600, 1.0), np.full(600, 5.0)]
>>> fleet = AutoscaledFleet.track(demand, vm_prices("c5"), boot_s=60)
>>> int(fleet.capacity[599]), int(fleet.capacity[700]), int(fleet.capacity[1199])
(2, 2, 8)
>>> fleet.finish(600.0, vcpu_seconds=360.0)  # seen at 660, 2 vCPU until the boots end at 720
735.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from functions.pricing import VmPrices


@dataclass(frozen=True)
class PeakSizedVm:
    """``instances`` always-on VMs of one type for the whole trace."""

    prices: VmPrices
    instances: int

    @classmethod
    def sized_for(cls, peak_demand_vcpus: float, prices: VmPrices) -> PeakSizedVm:
        """Enough instances that the peak's training demand (vCPUs) is met in full."""
        return cls(prices, max(1, math.ceil(peak_demand_vcpus / prices.vcpus - 1e-9)))

    @property
    def vcpus(self) -> int:
        return self.instances * self.prices.vcpus

    def finish(self, start_s: float, vcpu_seconds: float) -> float:
        """When a job of ``vcpu_seconds`` of compute, started at ``start_s``, ends."""
        return start_s + vcpu_seconds / self.vcpus

    def bill(self, horizon_s: float) -> float:
        return self.instances * self.prices.run_cost(horizon_s)


@dataclass
class AutoscaledFleet:
    """A target-tracking fleet's capacity per second and its bill, over a horizon.

    ``capacity[s]`` is the vCPUs up (booted) during second ``s``; ``runs`` holds each
    instance's (launch, termination) in seconds.
    """

    prices: VmPrices
    capacity: np.ndarray
    runs: list[tuple[float, float]]
    _cumulative: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._cumulative = np.concatenate([[0.0], np.cumsum(self.capacity, dtype=float)])

    @classmethod
    def track(
        cls,
        demand_vcpus: np.ndarray,
        prices: VmPrices,
        *,
        target: float = 0.7,
        boot_s: int = 60,
        cooldown_s: int = 300,
        period_s: int = 60,
        min_instances: int = 1,
    ) -> AutoscaledFleet:
        """Run target tracking over ``demand_vcpus`` (one value per second)."""
        horizon = len(demand_vcpus)
        launched: list[list[float]] = [[0.0, math.inf] for _ in range(min_instances)]
        last_action = -math.inf
        for t in range(period_s, horizon, period_s):
            recent = float(np.mean(demand_vcpus[t - period_s : t]))
            wanted = max(min_instances, math.ceil(recent / (target * prices.vcpus) - 1e-9))
            alive = [run for run in launched if run[1] == math.inf]
            if wanted > len(alive):
                launched += [[float(t), math.inf] for _ in range(wanted - len(alive))]
                last_action = t
            elif wanted < len(alive) and t - last_action >= cooldown_s:
                for run in alive[wanted - len(alive) :]:  # the newest go first
                    run[1] = float(t)
                last_action = t
        capacity = np.zeros(horizon)
        runs = [(start, min(end, float(horizon))) for start, end in launched]
        for start, end in runs:
            ready = int(start) + (boot_s if start > 0 else 0)
            capacity[min(ready, horizon) : int(end)] += prices.vcpus
        return cls(prices, capacity, runs)

    def finish(self, start_s: float, vcpu_seconds: float) -> float:
        """When a job of ``vcpu_seconds``, started at ``start_s``, ends on the capacity up
        from then on (past the horizon, at the capacity of its last second)."""
        horizon = len(self.capacity)
        begin = min(start_s, float(horizon))
        second = min(int(begin), horizon - 1)
        done_before = self._cumulative[second] + (begin - second) * self.capacity[second]
        goal = done_before + vcpu_seconds
        if goal <= self._cumulative[-1]:
            end = int(np.searchsorted(self._cumulative, goal, side="left")) - 1
            end = max(end, second)
            rate = self.capacity[end]
            return float(max(begin, end + (goal - self._cumulative[end]) / rate))
        tail = max(self.capacity[-1], self.prices.vcpus)
        return float(max(begin, horizon + (goal - self._cumulative[-1]) / tail))

    def bill(self) -> float:
        return sum(self.prices.run_cost(end - start) for start, end in self.runs)

    @property
    def instance_seconds(self) -> float:
        return sum(end - start for start, end in self.runs)
