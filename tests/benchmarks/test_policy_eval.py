"""The policy evaluation's figures on hand-made runs."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.policy_eval.figures import WINDOWS, incorporation_latency, recovery
from benchmarks.policy_eval.run import Run, Scenario
from benchmarks.policy_eval.stream import Ladder


def _scenario() -> Scenario:
    times = np.arange(1_000, dtype=float)  # one event a second
    ladder = Ladder(np.zeros((2, 1_000), dtype=np.float32), bootstrap=0, step=500)
    return Scenario(times, 1.0, 1_000, ladder, (400.0,), np.ones(1_000))


def test_incorporation_latency_runs_from_arrival_to_the_swap_that_took_the_event_in() -> None:
    scene = _scenario()
    run = Run(swap_times=[0.0, 600.0], swap_data_ends=[0, 500])
    # events 0-499 wait for the swap at 600 (350.5 s on average), 500-999 for the horizon
    assert incorporation_latency(scene, run) == pytest.approx(300.5)


def test_recovery_needs_five_windows_in_a_row_back_at_095() -> None:
    scene = _scenario()
    accuracy = np.ones(WINDOWS)
    edges = np.linspace(0, 1_000, WINDOWS + 1)
    dip = (edges[:-1] >= 400) & (edges[:-1] < 600)
    accuracy[dip] = 0.8
    accuracy[np.searchsorted(edges, 700)] = 0.9  # a lone dip after the recovery
    assert recovery(scene, accuracy) == pytest.approx(edges[dip.nonzero()[0][-1] + 1] - 400, abs=1)
    assert recovery(scene, np.ones(WINDOWS)) == 0.0
    assert recovery(scene, np.full(WINDOWS, 0.5)) == 600.0
