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
class ObjectStorePrices:
    """Per-request prices of the object store a job's workers read and write."""

    get_request_usd: float
    put_request_usd: float


def object_store_prices() -> ObjectStorePrices:
    entry = load_prices()["object_store"]
    return ObjectStorePrices(float(entry["get_request_usd"]), float(entry["put_request_usd"]))
