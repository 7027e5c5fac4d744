"""Virtual time: a clock, and futures whose waits advance the simulation."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from functions.runtimes.base import InvocationRecord

if TYPE_CHECKING:
    from functions.runtimes.sim.runtime import SimRuntime


# -- virtual time ------------------------------------------------------------------------


class VirtualClock:
    """Simulated seconds; only moves forward, and only when the simulation advances."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    @property
    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"virtual time runs forward: {t} < {self._now}")
        self._now = float(t)

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now})"


class _AdvancingEvent(threading.Event):
    """A waiter's event that, waited on, advances the simulations until it is set."""

    def __init__(self, initially_set: bool) -> None:
        super().__init__()
        self.sims: list[SimRuntime] = []
        if initially_set:
            self.set()

    def wait(self, timeout: float | None = None) -> bool:
        while not self.is_set():
            pending = [(t, i) for i, s in enumerate(self.sims) if (t := s._next_time()) is not None]
            if not pending:
                break
            self.sims[min(pending)[1]].step()
        return super().wait(0 if self.is_set() else timeout)


class _Waiters(list):
    """``Future._waiters`` of a :class:`SimFuture`.

    ``concurrent.futures.wait`` and ``as_completed`` register a waiter with each future
    and then block on the waiter's event; swapping that event for an
    :class:`_AdvancingEvent` makes the block advance the simulation instead.
    """

    def __init__(self, sim: SimRuntime) -> None:
        super().__init__()
        self.sim = sim

    def append(self, waiter: Any) -> None:
        event = getattr(waiter, "event", None)
        if isinstance(event, threading.Event):
            if not isinstance(event, _AdvancingEvent):
                event = _AdvancingEvent(event.is_set())
                waiter.event = event
            if self.sim not in event.sims:
                event.sims.append(self.sim)
        super().append(waiter)


class SimFuture(Future):
    """A future that completes when its runtime's virtual time reaches its end.

    ``result()`` and ``exception()`` advance the simulation until it has; so do
    ``concurrent.futures.wait`` and ``as_completed``. It cannot be cancelled (an
    invocation sent to Lambda runs to its end).
    """

    def __init__(self, sim: SimRuntime, record: InvocationRecord) -> None:
        super().__init__()
        self._sim = sim
        self._waiters = _Waiters(sim)
        #: The invocation's record, filled in as it starts and completes.
        self.record = record
        #: Set by the runtime as the invocation completes; cheaper to read than ``done()``.
        self.completed = False
        self.set_running_or_notify_cancel()

    def result(self, timeout: float | None = None) -> InvocationRecord:
        self._sim.run_until(self)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._sim.run_until(self)
        return super().exception(timeout)
