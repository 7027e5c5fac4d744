"""Fixtures shared by the retraining tests: worker runtimes, closed after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from functions.runtimes import LocalRuntime, Runtime, ThreadRuntime


def _opener(kind: Callable[..., Runtime]) -> Iterator[Callable[..., Runtime]]:
    opened: list[Runtime] = []

    def make(**kwargs: Any) -> Runtime:
        runtime = kind(**{"concurrency": 3, **kwargs})
        opened.append(runtime)
        return runtime

    yield make
    for runtime in opened:
        runtime.close()


@pytest.fixture
def make_runtime() -> Iterator[Callable[..., Runtime]]:
    """Opens in-process (thread) runtimes, 3 concurrent workers unless told."""
    yield from _opener(ThreadRuntime)


@pytest.fixture
def make_local_runtime() -> Iterator[Callable[..., Runtime]]:
    """Opens ``local`` runtimes (worker processes): for the tests marked slow."""
    yield from _opener(LocalRuntime)
