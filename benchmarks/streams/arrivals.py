"""Arrival times: a Poisson process whose rate follows a trace of ``benchmarks.traces``.

With ``poisson`` the gaps between events are exponential in the trace's own clock (the
integral of its rate), so the count in any window is Poisson with the trace's expected
count: the trace's true rate on average, with the burstiness of independent arrivals.
Without it, event ``i`` arrives exactly when the trace makes ``i + 1`` events due, as
``driftline replay`` sends them.

Examples
--------
>>> from benchmarks.traces import make_trace
>>> clock = Arrivals(make_trace("constant", rate=100), start=0.0, poisson=False)
>>> clock.next(3).tolist(), clock.next(1).tolist()
([0.01, 0.02, 0.03], [0.04])
>>> trace = make_trace("wiki")
>>> hour = round(trace.cumulative(trace.period_s))  # events due over one period
>>> stamps = Arrivals(trace, start=0.0, rng=np.random.default_rng(0)).next(hour)
>>> round(hour / stamps[-1])  # Table II: 279.68 on average over the hour
280
"""

from __future__ import annotations

import numpy as np

from benchmarks.traces import Trace

__all__ = ["Arrivals"]


class Arrivals:
    """Timestamps (seconds since 1970) of successive events, ``start`` being time 0.

    Parameters
    ----------
    trace
        The arrival rate; its ``speed`` compresses time.
    start
        Timestamp of the trace's time 0.
    rng
        Draws the exponential gaps (needed when ``poisson``).
    poisson
        Random arrivals at the trace's rate, or one event exactly when each is due.
    """

    def __init__(
        self,
        trace: Trace,
        start: float,
        rng: np.random.Generator | None = None,
        poisson: bool = True,
    ) -> None:
        if poisson and rng is None:
            raise ValueError("Poisson arrivals need an rng")
        self.trace = trace
        self.start = start
        self.rng = rng
        self.poisson = poisson
        self.due = 0.0  # events due so far in the trace's clock
        rates = np.asarray(trace.rates, dtype=np.float64)
        self._rates = rates
        self._cumulative = np.concatenate([[0.0], np.cumsum(rates)])

    def next(self, n: int) -> np.ndarray:
        """Timestamps of the next ``n`` events (float64, not decreasing)."""
        if self.poisson:
            assert self.rng is not None
            steps = self.rng.exponential(1.0, n)
        else:
            steps = np.ones(n)
        due = self.due + np.cumsum(steps)
        if n:
            self.due = float(due[-1])
        return self.start + self._seconds(due)

    def _seconds(self, due: np.ndarray) -> np.ndarray:
        """Seconds after the start at which ``due`` events are due (inverse cumulative)."""
        total = self._cumulative[-1]
        cycles = np.floor(due / total)
        rest = due - cycles * total
        second = np.searchsorted(self._cumulative, rest, side="left") - 1
        second = np.clip(second, 0, self._rates.size - 1)
        within = (rest - self._cumulative[second]) / self._rates[second]
        return (cycles * self._rates.size + second + within) / self.trace.speed
