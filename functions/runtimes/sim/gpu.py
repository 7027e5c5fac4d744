"""GPU containers in virtual time: the torch worker's seconds on one GPU, a container's
start-up, and its per-second bill.

A GPU container is held for a job: it starts once (``startup_s``: the instance boots,
the container starts, torch imports and creates its CUDA context), runs the worker
(:mod:`functions.gpu`) on its shard every epoch, and is billed for being held, per second
with a minimum (:class:`functions.pricing.GpuPrices`), whether it trains or waits for
the epoch's slowest worker. One worker's pass over a shard::

    seconds = overhead_s + samples * (compute_s_per_sample + host_s_per_sample)
              + batches * compute_s_per_batch
    batches = ceil(samples / batch_size) * local_epochs

The per-batch term is what makes a GPU slow on small batches: every minibatch step
launches a few dozen kernels, sorts its rows (``torch.unique``) and waits for its loss.
The steps' per-sample term is the kernels' own work. So the steps' throughput grows
with the batch size. The host's per-sample term is the part of the invocation that
stays on the CPU (:mod:`functions.trainers`: the snapshot and shard read, one
permutation per epoch, the delta); the shard's errors and rows are found on the device.

Calibration (``docs/simulator.md``, "GPU containers"): ``GPU_MEASURED`` are the torch
worker's steps on an H100 as multiples of the numpy worker's steps' speed on the same
window (0.49x on 2·10^5 ratings; 5.8x at batch 8,192 and 23x at 65,536 on 2·10^6). The
numpy worker's seconds come from the calibrated Lambda worker model (``DEFAULT_MODEL`` at
one vCPU), ``NUMPY_HOST_SHARE`` of them on the host; the two 2·10^6 points fix the
steps' per-batch and per-sample seconds, and the 2·10^5 point, far slower than they
predict, is read as the CUDA context's one-time start (``cuda_init_s``, part of a
container's start-up). Other GPU types scale the H100's steps by ``TYPE_FACTORS``,
which are assumptions, not measurements.

>>> from functions.gpu_performance import gpu_kind
>>> a10g = gpu_kind("a10g")
>>> round(a10g.model.seconds(10_000_000, 65_536), 2), round(a10g.model.seconds(200_000, 8192), 3)
(3.87, 0.167)
>>> run = simulate_gpu_epochs(1, 10_000_000, 3, a10g, batch_size=65_536, seed=0)
>>> [round(d, 2) for d in run.epoch_durations]  # the first waits for the container
[93.89, 3.84, 3.99]
>>> round(run.cost_usd, 4)  # held 101.7 s, the first 20 unbilled: 82 billed seconds
0.0229
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from functions.gpu_performance import GpuKind
from functions.performance import check_number


@dataclass(frozen=True)
class GpuEpoch:
    """One simulated epoch on GPU containers: launch to the slowest worker's update
    plus the coordinator's seconds (all of the epoch's containers are held throughout)."""

    epoch: int
    started_s: float
    finished_s: float

    @property
    def duration_s(self) -> float:
        return self.finished_s - self.started_s


@dataclass
class GpuSimulation:
    """What :func:`simulate_gpu_epochs` returns."""

    epochs: list[GpuEpoch]
    latency_s: float
    cost_usd: float
    held_s: list[float]

    @property
    def epoch_durations(self) -> list[float]:
        return [e.duration_s for e in self.epochs]

    def as_dict(self) -> dict[str, Any]:
        return {
            "epoch_durations": self.epoch_durations,
            "latency_s": self.latency_s,
            "cost_usd": self.cost_usd,
            "held_s": list(self.held_s),
        }


def simulate_gpu_epochs(
    workers: int,
    samples_per_worker: int,
    epochs: int,
    kind: GpuKind,
    *,
    batch_size: int = 65_536,
    local_epochs: int = 1,
    sync_overhead_s: float = 0.0,
    seed: int = 0,
) -> GpuSimulation:
    """Synchronous epochs of ``workers`` GPU containers, each training a shard of
    ``samples_per_worker`` ratings per epoch, in virtual time.

    The containers are asked for at time 0 and start after ``kind.startup_s``; every
    epoch waits for its slowest worker (a dedicated GPU has no stragglers to skip) and
    the coordinator's ``sync_overhead_s``. Each container is held from 0 to the end of
    the last epoch and billed by ``kind.prices`` (per second, with the minimum).
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an integer >= 0, got {epochs!r}")
    check_number("sync_overhead_s", sync_overhead_s)
    rng = np.random.default_rng(seed)
    seconds = kind.model.seconds(samples_per_worker, batch_size, local_epochs)
    now, out = 0.0, []
    for t in range(epochs):
        ready = kind.startup_s if t == 0 else 0.0
        slowest = max(seconds * kind.model.draw_slowdown(rng) for _ in range(workers))
        finished = now + ready + slowest + sync_overhead_s
        out.append(GpuEpoch(t, now, finished))
        now = finished
    held = [now] * workers
    cost = sum(kind.prices.lease_cost(h) for h in held) if epochs else 0.0
    return GpuSimulation(out, now, cost, held)


__all__ = ["GpuEpoch", "GpuSimulation", "simulate_gpu_epochs"]
