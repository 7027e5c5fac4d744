"""``driftline bench drift`` reports every detector on every scenario, in one run."""

from __future__ import annotations

import pytest

from benchmarks.bench.drift import REFRESH_MODES, _refresh_summary, run_drift
from benchmarks.scenarios import SCENARIOS
from drift import DETECTORS


@pytest.mark.slow
@pytest.mark.timeout(900)  # four pipelines a scenario: past the suite's 300 s on a busy machine
def test_every_scenario_reports_every_detector_and_every_baseline() -> None:
    result = run_drift(limit=3_000)
    assert set(result["scenarios"]) == set(SCENARIOS)
    for name, scenario in result["scenarios"].items():
        for detector in DETECTORS:
            figures = scenario[detector]
            assert {"delay_events", "false_alarms_per_100k", "detected"} <= set(figures)
            if name == "control":
                assert figures["detected"] is None and figures["delay_events"] is None
        for key in ("driftline_rmse", "foldin_only_rmse", "static_rmse", "river_rmse"):
            assert scenario[key] > 0.0, (name, key)
        assert set(scenario["streams"]) == {"movielens", "synthetic"}
    assert set(result["summary"]) == set(DETECTORS)
    assert set(result["refresh_modes"]) == set(REFRESH_MODES) == {"default", "none"}
    for mode in result["refresh_modes"].values():
        assert mode["planted"] == 8
        assert {"detected", "median_sudden_delay_events", "control_false_alarms_per_100k"} <= set(
            mode
        )
    sudden = result["scenarios"]["sudden"]["streams"]["movielens"]["refresh_modes"]
    assert sudden["default"] == result["scenarios"]["sudden"][result["default_detector"]]
    assert sudden["none"]["rmse"] > 0.0


def _figures(delay: int | None, false_alarms: int = 0) -> dict:
    return {"detected": delay is not None, "delay_events": delay, "false_alarms": false_alarms}


def test_each_refresh_mode_reports_its_own_detection() -> None:
    """Found, median delay on the sudden scenarios and false alarms per 100,000 control
    events, per mode, from each run's ``refresh_modes``."""
    runs = {
        "sudden": (_figures(1_000), _figures(7_000)),
        "gradual": (_figures(3_000), _figures(None)),
        "control": (_figures(None, 1), _figures(None, 2)),
    }
    results = {
        stream: {
            name: {"events": 50_000, "refresh_modes": {"default": on, "none": off}}
            for name, (on, off) in runs.items()
        }
        for stream in ("movielens", "synthetic")
    }
    summary = _refresh_summary(results)
    assert summary["default"] == {
        "detected": 4,
        "planted": 4,
        "median_sudden_delay_events": 1_000,
        "control_false_alarms_per_100k": 2.0,
    }
    assert summary["none"]["detected"] == 2
    assert summary["none"]["median_sudden_delay_events"] == 7_000
    assert summary["none"]["control_false_alarms_per_100k"] == 4.0
