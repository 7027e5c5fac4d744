"""Settings: environment variables, ``none``, and the errors that name the setting."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from retrain.window import ChangeWindowPolicy, WindowPolicy
from service.retraining import job_spec
from service.settings import Settings


def test_environment_variables_fill_settings_and_none_unsets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DRIFTLINE_RETRAIN_WORKERS", "16")
    monkeypatch.setenv("DRIFTLINE_REFRESH_EVENTS", "none")
    monkeypatch.setenv("DRIFTLINE_RETRAIN_BUDGET_USD", "0.25")
    settings = Settings()
    assert settings.retrain_workers == 16
    assert settings.refresh_events is None
    assert settings.retrain_budget_usd == 0.25
    assert Settings(retrain_workers=2).retrain_workers == 2  # a flag beats the environment


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"retrain_runtime": "fargate"}, "retrain_runtime"),
        ({"retrain_budget_usd": 0}, "retrain_budget_usd"),
        ({"retrain_sync_ratio": 1.5}, "retrain_sync_ratio"),
        ({"rating_min": 5, "rating_max": 1}, "rating_min"),
        ({"kafka_session_timeout_ms": 100}, "kafka_session_timeout_ms"),
        ({"kafka_group": ""}, "kafka_group"),
        ({"drift_detector": "cusum"}, "drift_detector"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(values: dict, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        Settings(**values)


def test_the_lambda_runtime_needs_an_s3_object_store(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="lambda needs an s3:// object_store_url"):
        Settings(retrain_runtime="lambda", data_dir=tmp_path)
    settings = Settings(retrain_runtime="lambda", object_store_url="s3://models/driftline")
    assert settings.lambda_function == "driftline-worker"


def test_by_default_a_refresh_has_two_minutes_and_a_drift_job_thirty_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DRIFTLINE_LATENCY_CAP_SECONDS", raising=False)
    monkeypatch.delenv("DRIFTLINE_DRIFT_LATENCY_CAP_SECONDS", raising=False)
    spec = job_spec(Settings())
    caps = {t: spec.for_trigger(t).latency_cap_s for t in ("bootstrap", "refresh", "drift")}
    assert caps == {"bootstrap": 120.0, "refresh": 120.0, "drift": 30.0}


def test_a_jobs_window_holds_the_newest_million_events_unless_set() -> None:
    policy = job_spec(Settings()).window_policy()
    assert isinstance(policy, WindowPolicy) and policy.max_recent == 1_000_000
    unbounded = job_spec(Settings(max_window_events=None)).window_policy()
    assert isinstance(unbounded, WindowPolicy) and unbounded.max_recent is None
    drift = replace(job_spec(Settings()), change_after_id=10, drift_history_ratio=1.0)
    ratio = Settings().drift_window_user_change_ratio
    assert drift.window_policy() == ChangeWindowPolicy(10, 1.0, 50_000, 0, ratio, 1_000_000)
    with pytest.raises(ValidationError):
        Settings(max_window_events=0)
