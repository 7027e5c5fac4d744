"""Seconds spent inside chosen methods of a pipeline, for the benchmarks' stage figures.

No profiler in the way: a timer pair per call, on the methods named.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: What ``owner.__dict__`` lacked before a wrap: the wrap is then deleted, not replaced.
_ABSENT = object()


class StageClock:
    """Seconds spent in each stage, summed over calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        #: (owner, name, what ``owner.__dict__`` held) per wrap, newest last.
        self._wrapped: list[tuple[Any, str, Any]] = []

    def wrap(self, stage: str, owner: Any, name: str) -> None:
        """Time every call of ``owner.name`` as ``stage``: an object's method for that
        object only (an instance attribute shadows it), a class's for every instance
        (undo it with ``restore``, or wrap inside ``restoring``)."""
        call: Callable[..., Any] = getattr(owner, name)
        self._wrapped.append((owner, name, vars(owner).get(name, _ABSENT)))

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - began

        setattr(owner, name, timed)

    def restore(self) -> None:
        """Undo every wrap, newest first."""
        while self._wrapped:
            owner, name, held = self._wrapped.pop()
            if held is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, held)

    @contextmanager
    def restoring(self) -> Iterator[StageClock]:
        """This clock, its wraps undone on leaving (a class's methods are shared by every
        pipeline of the process)."""
        try:
            yield self
        finally:
            self.restore()
