"""Prices, from one file with each figure's source (DESIGN.md §5).

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
