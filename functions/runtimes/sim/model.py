"""The performance model: how long one worker invocation takes on Lambda, and why."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from functions.pricing import lambda_prices

#: Object-store requests of one worker invocation: get snapshot, get shard, put delta.
WORKER_REQUESTS = 3
#: The worker's default ``time_margin_s`` (:class:`functions.handler.WorkerTask`).
DEFAULT_TIME_MARGIN_S = 20.0


def lambda_mb_per_vcpu() -> float:
    return float(lambda_prices().mb_per_vcpu)


def check_number(
    name: str, value: float, *, positive: bool = False, allow_inf: bool = False
) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    ok = ok and not math.isnan(value) and (allow_inf or math.isfinite(value))
    if not ok or not (value > 0 if positive else value >= 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(
            f"{name} must be a {'' if allow_inf else 'finite '}number {bound}, got {value!r}"
        )


# -- the performance model ---------------------------------------------------------------


@dataclass(frozen=True)
class Work:
    """What one invocation has to do.

    Parameters
    ----------
    samples
        SGD sample updates: the shard's samples times ``local_epochs``.
    batches
        Minibatches those updates come in (each has a fixed cost in the numpy worker).
    bytes_read, bytes_written
        Object-store traffic: snapshot plus shard in, the delta out.
    requests
        Object-store requests (three for the worker).
    """

    samples: int
    batches: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    requests: int = WORKER_REQUESTS

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise ValueError(f"Work.{f.name} must be an integer >= 0, got {value!r}")

    @classmethod
    def for_shard(
        cls,
        samples: int,
        batch_size: int | None = None,
        local_epochs: int = 1,
        bytes_read: int = 0,
        bytes_written: int = 0,
    ) -> Work:
        """The work of a worker on a shard of ``samples`` ratings."""
        batches = math.ceil(samples / batch_size) * local_epochs if batch_size else 0
        return cls(int(samples) * local_epochs, batches, bytes_read, bytes_written)


@dataclass(frozen=True)
class PerformanceModel:
    """Seconds one worker invocation takes on Lambda; see the module docstring.

    Parameters
    ----------
    compute_s_per_sample
        Seconds per SGD sample update at one full vCPU.
    compute_s_per_batch
        Seconds per minibatch at one full vCPU (numpy's per-call cost).
    overhead_s
        Fixed seconds per invocation: dispatch, loading the snapshot, the loss passes'
        fixed part, writing the result; not scaled by CPU share.
    cold_start_s
        Extra seconds of a container's first invocation, counted in its duration.
    request_latency_s, bandwidth_bytes_per_s
        The object store: seconds per request, and bytes per second moved.
    jitter_sigma
        Sigma of the mean-one log-normal factor every invocation's time carries.
    straggler_p, straggler_slowdown
        Probability that an invocation is a straggler, and the range (low, high) its
        slowdown factor is drawn from uniformly.
    worker_vcpus
        vCPUs the worker can use (1: the numpy worker is single-threaded).
    mb_per_vcpu, max_vcpus
        Lambda's CPU share: one vCPU per ``mb_per_vcpu`` MB (from the price file), at
        most ``max_vcpus``.
    """

    compute_s_per_sample: float
    compute_s_per_batch: float = 0.0
    overhead_s: float = 0.0
    cold_start_s: float = 0.0
    request_latency_s: float = 0.0
    bandwidth_bytes_per_s: float = math.inf
    jitter_sigma: float = 0.0
    straggler_p: float = 0.0
    straggler_slowdown: tuple[float, float] = (1.0, 1.0)
    worker_vcpus: float = 1.0
    mb_per_vcpu: float = field(default_factory=lambda_mb_per_vcpu)
    max_vcpus: float = 6.0

    def __post_init__(self) -> None:
        for name in (
            "compute_s_per_sample",
            "compute_s_per_batch",
            "overhead_s",
            "cold_start_s",
            "request_latency_s",
            "jitter_sigma",
        ):
            check_number(name, getattr(self, name))
        check_number(
            "bandwidth_bytes_per_s", self.bandwidth_bytes_per_s, positive=True, allow_inf=True
        )
        for name in ("worker_vcpus", "mb_per_vcpu", "max_vcpus"):
            check_number(name, getattr(self, name), positive=True)
        check_number("straggler_p", self.straggler_p)
        if self.straggler_p > 1:
            raise ValueError(f"straggler_p must be within [0, 1], got {self.straggler_p}")
        try:
            low, high = (float(x) for x in self.straggler_slowdown)
        except (TypeError, ValueError):
            raise ValueError(
                f"straggler_slowdown must be a pair (low, high), got {self.straggler_slowdown!r}"
            ) from None
        if not (math.isfinite(high) and 1.0 <= low <= high):
            raise ValueError(
                f"straggler_slowdown must satisfy 1 <= low <= high, got {self.straggler_slowdown}"
            )
        object.__setattr__(self, "straggler_slowdown", (low, high))

    def replace(self, **changes: Any) -> PerformanceModel:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The fields as plain values (``bandwidth_bytes_per_s`` may be ``inf``)."""
        values = asdict(self)
        values["straggler_slowdown"] = list(self.straggler_slowdown)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PerformanceModel:
        values = dict(values)
        if "straggler_slowdown" in values:
            values["straggler_slowdown"] = tuple(values["straggler_slowdown"])
        return cls(**values)

    # -- predictions -------------------------------------------------------------------
    def vcpus(self, memory_mb: float) -> float:
        """Lambda's vCPUs at a memory size: ``memory_mb / mb_per_vcpu``, at most ``max_vcpus``."""
        return min(memory_mb / self.mb_per_vcpu, self.max_vcpus)

    def cpu_share(self, memory_mb: float) -> float:
        """The CPU the worker gets, in vCPUs: what Lambda gives, up to what it can use."""
        return min(self.vcpus(memory_mb), self.worker_vcpus)

    def compute_s(self, work: Work, memory_mb: float) -> float:
        seconds = work.samples * self.compute_s_per_sample + work.batches * self.compute_s_per_batch
        return seconds / self.cpu_share(memory_mb)

    def io_s(self, work: Work) -> float:
        moved = work.bytes_read + work.bytes_written
        transfer = moved / self.bandwidth_bytes_per_s if moved else 0.0
        return work.requests * self.request_latency_s + transfer

    def fixed_s(self, work: Work, cold: bool = False, slowdown: float = 1.0) -> float:
        """Everything but the training: cold start, overhead and I/O."""
        return (self.cold_start_s if cold else 0.0) + slowdown * (self.overhead_s + self.io_s(work))

    def duration_s(
        self, work: Work, memory_mb: float, cold: bool = False, slowdown: float = 1.0
    ) -> float:
        """The invocation's duration at a given slowdown (1: a typical invocation)."""
        return self.fixed_s(work, cold, slowdown) + slowdown * self.compute_s(work, memory_mb)

    def mean_slowdown(self) -> float:
        """The expected slowdown factor (jitter has mean one)."""
        low, high = self.straggler_slowdown
        return 1.0 + self.straggler_p * ((low + high) / 2.0 - 1.0)

    def mean_duration_s(self, work: Work, memory_mb: float, cold: bool = False) -> float:
        """Expected duration over stragglers and jitter (no time limit)."""
        return self.duration_s(work, memory_mb, cold, self.mean_slowdown())

    def draw_slowdown(self, rng: np.random.Generator) -> float:
        """One invocation's slowdown: straggler factor times jitter.

        Always draws the same number of variates, so a seeded generator gives the same
        sequence whatever the parameters.
        """
        straggler, pick, z = rng.random(), rng.random(), rng.standard_normal()
        factor = 1.0
        if straggler < self.straggler_p:
            low, high = self.straggler_slowdown
            factor = low + (high - low) * pick
        if self.jitter_sigma:
            factor *= math.exp(self.jitter_sigma * z - self.jitter_sigma**2 / 2.0)
        return factor


#: Measured on the local runtime with the real worker (``docs/simulator.md``): MovieLens
#: shards of 5,000 to 100,000 ratings, 8 factors, batch sizes 256 and 2,048, on a shared
#: two-core machine (hence the jitter). Calibrate your own for anything that matters.
DEFAULT_MODEL = PerformanceModel(
    compute_s_per_sample=2.3e-6,
    compute_s_per_batch=1.2e-4,
    overhead_s=0.018,
    cold_start_s=0.055,
    jitter_sigma=0.33,
)
