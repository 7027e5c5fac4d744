"""Seconds spent inside chosen methods of a pipeline, for the benchmarks' stage figures.

No profiler in the way: a timer pair per call, on the methods named.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any


class StageClock:
    """Seconds spent in each stage, summed over calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, stage: str, owner: Any, name: str) -> None:
        """Time every call of ``owner.name`` as ``stage`` (an instance attribute
        shadows the method for this object only)."""
        call: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - began

        setattr(owner, name, timed)
