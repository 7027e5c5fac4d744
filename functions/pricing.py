"""Prices, from one file with each figure's source (``functions/prices.json``).

>>> lam = lambda_prices()
>>> round(lam.invocation_cost(duration_ms=1000, memory_mb=1024), 10)
1.68667e-05
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Protocol


@lru_cache(maxsize=1)
def load_prices() -> dict:
    """The price file; read through importlib so it also loads from a Lambda zip."""
    return json.loads(resources.files("functions").joinpath("prices.json").read_text("utf-8"))


@dataclass(frozen=True)
class LambdaPrices:
    """How AWS Lambda bills: GB-seconds per started millisecond, plus each request."""

    gb_second_usd: float
    request_usd: float
    billing_granularity_ms: int
    memory_mb_min: int
    memory_mb_max: int
    mb_per_vcpu: int
    timeout_s_max: float

    def billed_ms(self, duration_ms: float) -> int:
        """Duration rounded up to the billing granularity (1 ms on Lambda)."""
        step = self.billing_granularity_ms
        return int(math.ceil(max(duration_ms, 0.0) / step) * step)

    def invocation_cost(self, duration_ms: float, memory_mb: int) -> float:
        gb_seconds = self.billed_ms(duration_ms) / 1000.0 * memory_mb / 1024.0
        return gb_seconds * self.gb_second_usd + self.request_usd

    def vcpus(self, memory_mb: int) -> float:
        """Lambda's CPU share grows with memory: one vCPU per ``mb_per_vcpu``."""
        return memory_mb / self.mb_per_vcpu

    def check_memory(self, memory_mb: int) -> None:
        if not self.memory_mb_min <= memory_mb <= self.memory_mb_max:
            raise ValueError(
                f"memory_mb must be within {self.memory_mb_min}..{self.memory_mb_max}, "
                f"got {memory_mb}"
            )


def lambda_prices() -> LambdaPrices:
    entry = dict(load_prices()["lambda_x86"])
    entry.pop("source")
    return LambdaPrices(**entry)


@dataclass(frozen=True)
class VmPrices:
    """An on-demand VM type: vCPUs, hourly price, per-second billing with a minimum.

    >>> vm = vm_prices("c5")
    >>> vm.vcpus, round(vm.run_cost(30.0), 6), round(vm.run_cost(3600.0), 6)
    (2, 0.001417, 0.085)
    """

    name: str
    vcpus: int
    hour_usd: float
    billing_minimum_s: float

    def run_cost(self, seconds: float) -> float:
        """One instance up for ``seconds``: billed per second, at least the minimum."""
        return max(seconds, self.billing_minimum_s) * self.hour_usd / 3600.0

    @property
    def vcpu_hour_usd(self) -> float:
        return self.hour_usd / self.vcpus


def vm_prices(name: str = "c5") -> VmPrices:
    """A VM price set of the price file's ``vm_sets`` (``c5``, or ``sandpiper``: the
    paper's $0.39/h, kept apart because it matches no instance)."""
    entry = load_prices()["vm_sets"][name]
    return VmPrices(name, int(entry["vcpus"]), float(entry["hour_usd"]), entry["billing_minimum_s"])


@dataclass(frozen=True)
class GpuPrices:
    """A GPU container type: one GPU, its hourly list price, how it starts and is billed.

    A container holds its GPU from its start to its release and is billed for all of it
    but the ``unbilled_startup_s`` before the instance runs: per ``granularity_s``
    (one second on EC2) with a ``minimum_s`` (60 s).

    >>> a10g = gpu_prices("a10g")
    >>> a10g.instance, a10g.startup_s, round(a10g.second_usd * 3600, 4)
    ('g5.xlarge', 90.0, 1.006)
    >>> round(a10g.lease_cost(held_s=30.0), 6), round(a10g.lease_cost(held_s=600.4), 6)
    (0.016767, 0.162357)
    """

    name: str
    instance: str
    hour_usd: float
    startup_s: float
    unbilled_startup_s: float
    granularity_s: float
    minimum_s: float

    @property
    def second_usd(self) -> float:
        return self.hour_usd / 3600.0

    def billed_s(self, held_s: float) -> float:
        """Seconds billed for a container held ``held_s`` from its start (start-up
        included): the billed part rounded up to the granularity, at least the minimum."""
        billed = max(held_s - self.unbilled_startup_s, 0.0)
        step = self.granularity_s
        return max(math.ceil(billed / step - 1e-9) * step, self.minimum_s)

    def lease_cost(self, held_s: float) -> float:
        """What one container held ``held_s`` seconds from its start costs."""
        return self.billed_s(held_s) * self.second_usd


@dataclass(frozen=True)
class GpuMeter:
    """A GPU container's bill, one worker invocation at a time: the meter of a runtime
    whose invocations run on containers of GPU type ``prices`` (the ``local`` runtime's
    torch workers, for instance), in the interface of :class:`LambdaPrices`.

    Each invocation is billed its seconds (start-up included, as a cold start's
    initialisation) at the type's list price, to the millisecond: a container is held
    across a job's epochs, so EC2's per-second rounding and 60 s minimum apply to the
    lease, not to any one invocation, and are left to :meth:`GpuPrices.lease_cost`. The
    container's memory is its instance's, not a choice: any size is accepted.

    >>> meter = GpuMeter(gpu_prices("l4"))
    >>> round(meter.invocation_cost(3_600_000.0, memory_mb=1769), 4)
    0.8048
    """

    prices: GpuPrices
    timeout_s_max: float = 900.0

    def billed_ms(self, duration_ms: float) -> int:
        return int(math.ceil(max(duration_ms, 0.0)))

    def invocation_cost(self, duration_ms: float, memory_mb: int) -> float:
        return self.billed_ms(duration_ms) / 1000.0 * self.prices.second_usd

    def check_memory(self, memory_mb: int) -> None:
        if memory_mb < 1:
            raise ValueError(f"memory_mb must be at least 1, got {memory_mb}")


class Meter(Protocol):
    """What a runtime bills invocations with: :class:`LambdaPrices`, :class:`GpuMeter`."""

    @property
    def timeout_s_max(self) -> float: ...

    def billed_ms(self, duration_ms: float) -> int: ...

    def invocation_cost(self, duration_ms: float, memory_mb: int) -> float: ...

    def check_memory(self, memory_mb: int) -> None: ...


def gpu_types() -> tuple[str, ...]:
    """The GPU container types of the price file (``a10g``, ``l4``, ``a100``, ``h100``)."""
    return tuple(load_prices()["gpu_container"]["types"])


def gpu_prices(name: str) -> GpuPrices:
    """The price entry of GPU container type ``name`` (see :func:`gpu_types`)."""
    book = load_prices()["gpu_container"]
    try:
        entry = book["types"][name]
    except KeyError:
        choices = sorted(book["types"])
        raise ValueError(f"unknown GPU type {name!r}; choose from {choices}") from None
    return GpuPrices(
        name,
        str(entry["instance"]),
        float(entry["hour_usd"]) / int(entry["gpus"]),
        float(entry["startup_s"]),
        float(entry["unbilled_startup_s"]),
        float(book["billing_granularity_s"]),
        float(book["billing_minimum_s"]),
    )


@dataclass(frozen=True)
class ObjectStorePrices:
    """Per-request prices of the object store a job's workers read and write."""

    get_request_usd: float
    put_request_usd: float


def object_store_prices() -> ObjectStorePrices:
    entry = load_prices()["object_store"]
    return ObjectStorePrices(float(entry["get_request_usd"]), float(entry["put_request_usd"]))
