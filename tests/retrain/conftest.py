"""Fixtures shared by the retraining tests that start real worker processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from functions.runtimes import LocalRuntime


@pytest.fixture
def make_runtime() -> Iterator[Callable[..., LocalRuntime]]:
    """Opens local runtimes (3 concurrent workers unless told) and closes them after."""
    opened: list[LocalRuntime] = []

    def make(**kwargs: Any) -> LocalRuntime:
        runtime = LocalRuntime(**{"concurrency": 3, **kwargs})
        opened.append(runtime)
        return runtime

    yield make
    for runtime in opened:
        runtime.close()
