"""The torch worker's seconds on one GPU of each type, calibrated from its measured
speed-ups over the numpy worker: what the simulator's GPU containers run at
(:mod:`functions.runtimes.sim.gpu`) and what the configurator plans GPU kinds with
(:mod:`configurator.kinds`).

One worker's pass over a shard::

    seconds = overhead_s + samples * compute_s_per_sample + batches * compute_s_per_batch
    batches = ceil(samples / batch_size) * local_epochs

Calibration (``docs/simulator.md``, "GPU containers"): ``GPU_MEASURED`` are the torch
worker's minibatch steps on an H100 as multiples of the numpy worker's steps' speed on
the same window; the numpy worker's seconds come from the calibrated Lambda worker
model (``DEFAULT_MODEL`` at one vCPU), of which ``NUMPY_HOST_SHARE`` is the part that
stays on the host's CPU when the worker's arithmetic moves to a device (the snapshot
and shard read, one permutation per epoch, the delta; :mod:`functions.trainers`). Other
GPU types scale the H100's seconds by ``TYPE_FACTORS``, which are assumptions, not
measurements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from functions.performance import DEFAULT_MODEL, PerformanceModel, _nonnegative_lstsq, check_number
from functions.pricing import GpuPrices, gpu_prices, gpu_types

#: The torch worker's epoch on an H100 as a multiple of the numpy worker's speed on the
#: same window: ``(ratings, batch size, speed-up)``. The 2·10^5 window's batch size was
#: not recorded with it; 8,192 is assumed. They were measured on the earlier torch
#: worker, which gathered each minibatch on the host and copied it to the device per
#: step; today's gathers on the device, so these understate it (not yet measured).
GPU_MEASURED: tuple[tuple[int, int, float], ...] = (
    (200_000, 8192, 0.49),
    (2_000_000, 8192, 5.8),
    (2_000_000, 65_536, 23.0),
)
#: Of the numpy worker's seconds on a shard of 2·10^6 ratings, the share that stays on
#: the host when its arithmetic runs on a device (``driftline bench gpu``'s
#: ``worker_split``, :mod:`benchmarks.bench.gpu_split`; measured 2026-11-29 on a shared
#: two-core machine, the median over batches of 1,024, 8,192 and 65,536: 0.13, 0.12 and
#: 0.12, most of it the shard's decompression).
NUMPY_HOST_SHARE = 0.12
#: Seconds of an invocation that are neither per sample nor per batch: the model's
#: tensors copied to the device and back (an assumption: tens of milliseconds for models
#: of up to a few hundred thousand rows).
GPU_OVERHEAD_S = 0.02
#: Per GPU type, ``(per-sample, per-batch)`` seconds as multiples of the H100's. The
#: worker is bound by kernel launches, synchronisation and the host's indexing, not by
#: the GPU's arithmetic, so the per-batch seconds differ little between GPUs; the
#: per-sample seconds follow the host and the PCIe link. Assumed, not measured.
TYPE_FACTORS: dict[str, tuple[float, float]] = {
    "h100": (1.0, 1.0),
    "a100": (1.2, 1.1),
    "a10g": (1.5, 1.3),
    "l4": (1.6, 1.3),
}


@dataclass(frozen=True)
class GpuModel:
    """Seconds of the torch worker on one GPU; see the module docstring.

    Parameters
    ----------
    compute_s_per_sample, compute_s_per_batch, overhead_s
        Seconds of the steps on the GPU per sample update and per minibatch, and per
        invocation.
    host_s_per_sample
        Seconds per sample of the invocation's work on the host's CPU (the snapshot and
        shard read, the epoch's permutation, the delta): the numpy worker's, whatever
        the GPU, so :meth:`scaled` leaves it.
    cuda_init_s
        The CUDA context's one-time start in a fresh process (part of a container's
        start-up, not of any epoch).
    jitter_sigma
        Sigma of the mean-one log-normal factor of every pass: a dedicated GPU varies
        little, and has no stragglers.
    """

    compute_s_per_sample: float
    compute_s_per_batch: float
    overhead_s: float = GPU_OVERHEAD_S
    cuda_init_s: float = 0.0
    jitter_sigma: float = 0.05
    host_s_per_sample: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "compute_s_per_sample",
            "compute_s_per_batch",
            "overhead_s",
            "cuda_init_s",
            "jitter_sigma",
            "host_s_per_sample",
        ):
            check_number(name, getattr(self, name))

    @property
    def per_sample_s(self) -> float:
        """A worker's seconds per sample of one pass, the GPU's and the host's."""
        return self.compute_s_per_sample + self.host_s_per_sample

    def seconds(self, samples: float, batch_size: int, local_epochs: int = 1) -> float:
        """One pass of ``local_epochs`` over a shard of ``samples`` ratings."""
        batches = math.ceil(samples / batch_size) * local_epochs
        return (
            self.overhead_s
            + samples * local_epochs * self.per_sample_s
            + batches * self.compute_s_per_batch
        )

    def scaled(self, per_sample: float, per_batch: float) -> GpuModel:
        """The same worker on another GPU: the steps' per-sample and per-batch seconds
        multiplied, the host's work unchanged."""
        return replace(
            self,
            compute_s_per_sample=self.compute_s_per_sample * per_sample,
            compute_s_per_batch=self.compute_s_per_batch * per_batch,
        )

    def draw_slowdown(self, rng: np.random.Generator) -> float:
        return math.exp(self.jitter_sigma * rng.standard_normal() - self.jitter_sigma**2 / 2)


def numpy_seconds(
    model: PerformanceModel, samples: float, batch_size: int, host_share: float = 0.0
) -> float:
    """The numpy worker's compute at one vCPU on ``samples`` ratings; without the
    ``host_share`` of its per-sample seconds, its minibatch steps alone."""
    batches = math.ceil(samples / batch_size)
    per_sample = model.compute_s_per_sample * (1.0 - host_share)
    return samples * per_sample + batches * model.compute_s_per_batch


def calibrate_gpu(
    measured: Sequence[tuple[int, int, float]] = GPU_MEASURED,
    numpy_model: PerformanceModel = DEFAULT_MODEL,
    overhead_s: float = GPU_OVERHEAD_S,
    host_share: float = NUMPY_HOST_SHARE,
) -> GpuModel:
    """The torch worker's GPU model that the speed-ups of its steps ``measured``
    (``(ratings, batch size, speed-up over numpy's steps)``) imply for the numpy worker
    of ``numpy_model``, whose per-sample seconds are ``host_share`` host work.

    The steps' per-sample and per-batch seconds are fitted (non-negative least squares
    of relative errors) to the points of the largest window, where a fixed start cannot
    hide; the smaller windows' excess over that fit is the CUDA context's start (its
    median). The host work is the numpy worker's, per sample, on top: the torch worker
    runs it on the host's CPU (Amdahl's law: the device's speed-up is not the worker's).
    """
    points = [(n, b, numpy_seconds(numpy_model, n, b, host_share) / s) for n, b, s in measured]
    largest = max(n for n, _, _ in points)
    fit = [(n, b, t) for n, b, t in points if n == largest]
    x = np.array([[n / t, math.ceil(n / b) / t] for n, b, t in fit])
    y = np.array([(t - overhead_s) / t for _, _, t in fit])
    per_sample, per_batch = _nonnegative_lstsq(x, y)
    steps = GpuModel(float(per_sample), float(per_batch), overhead_s)
    excess = [t - steps.seconds(n, b) for n, b, t in points if n < largest]
    init = max(0.0, float(np.median(excess))) if excess else 0.0
    host_s = numpy_model.compute_s_per_sample * host_share
    return replace(steps, host_s_per_sample=host_s, cuda_init_s=init)


def fit_gpu_model(
    runs: Sequence[tuple[int, int, float]],
    base: GpuModel | None = None,
    host_s_per_sample: float = 0.0,
) -> GpuModel:
    """A GPU model fitted to measured passes ``(samples, batch size, seconds)`` (``driftline
    bench gpu``'s warm epochs of the steps): overhead, per-sample and per-batch seconds by
    non-negative least squares of relative errors, plus ``host_s_per_sample`` of the
    worker's host work per sample (its worker split); ``base`` gives the rest."""
    if len(runs) < 2:
        raise ValueError(f"a GPU fit needs at least two measured passes, got {len(runs)}")
    x = np.array([[1.0 / t, n / t, math.ceil(n / b) / t] for n, b, t in runs])
    overhead, per_sample, per_batch = _nonnegative_lstsq(x, np.ones(len(runs)))
    base = base or GpuModel(0.0, 0.0)
    return replace(
        base,
        overhead_s=float(overhead),
        compute_s_per_sample=float(per_sample),
        host_s_per_sample=host_s_per_sample,
        compute_s_per_batch=float(per_batch),
    )


#: The H100 as measured (``GPU_MEASURED``).
H100_MODEL = calibrate_gpu()


@dataclass(frozen=True)
class GpuKind:
    """A GPU container type: its worker model and its prices."""

    name: str
    model: GpuModel
    prices: GpuPrices

    @property
    def startup_s(self) -> float:
        """Seconds from asking for a container to its first shard: the price file's
        start-up (which includes a CUDA context's) or at least the CUDA start."""
        return max(self.prices.startup_s, self.model.cuda_init_s)


def gpu_kind(name: str, base: GpuModel = H100_MODEL) -> GpuKind:
    """GPU type ``name`` of the price file, its seconds ``base``'s times ``TYPE_FACTORS``."""
    per_sample, per_batch = TYPE_FACTORS.get(name, (1.0, 1.0))
    return GpuKind(name, base.scaled(per_sample, per_batch), gpu_prices(name))


def gpu_kinds() -> dict[str, GpuKind]:
    """Every GPU type of the price file."""
    return {name: gpu_kind(name) for name in gpu_types()}
