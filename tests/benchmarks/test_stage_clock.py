"""The benchmarks' stage clock: what it times, and that it puts every method back."""

from __future__ import annotations

import time

import pytest

from benchmarks.stage_clock import StageClock


class _Stage:
    def run(self, seconds: float) -> str:
        time.sleep(seconds)
        return "ran"


def test_a_class_wrap_times_every_instance_and_is_undone_on_leaving() -> None:
    original = _Stage.run
    with StageClock().restoring() as clock:
        clock.wrap("stage", _Stage, "run")
        assert _Stage().run(0.01) == "ran"
        assert _Stage().run(0.01) == "ran"
        assert clock.seconds["stage"] >= 0.02
    timed = clock.seconds["stage"]
    assert _Stage.run is original
    _Stage().run(0.0)
    assert clock.seconds["stage"] == timed


def test_an_instance_wrap_times_that_object_only_and_is_undone() -> None:
    timed, other = _Stage(), _Stage()
    clock = StageClock()
    clock.wrap("stage", timed, "run")
    other.run(0.01)
    assert clock.seconds["stage"] == 0.0
    timed.run(0.01)
    assert clock.seconds["stage"] >= 0.01
    spent = clock.seconds["stage"]
    clock.restore()
    assert "run" not in vars(timed)
    timed.run(0.0)
    assert clock.seconds["stage"] == spent


def test_a_wrap_is_undone_when_the_run_fails() -> None:
    original = _Stage.run
    with pytest.raises(RuntimeError), StageClock().restoring() as clock:
        clock.wrap("stage", _Stage, "run")
        raise RuntimeError("the benchmark failed")
    assert _Stage.run is original
