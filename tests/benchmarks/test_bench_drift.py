"""``driftline bench drift`` reports every detector on every scenario, in one run."""

from __future__ import annotations

import pytest

from benchmarks.bench.drift import run_drift
from benchmarks.scenarios import SCENARIOS
from drift import DETECTORS


@pytest.mark.slow
def test_every_scenario_reports_every_detector_and_every_baseline() -> None:
    result = run_drift(limit=6_000)
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
