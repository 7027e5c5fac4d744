"""Trigger policies: the registry's contract and each policy's rule."""

from __future__ import annotations

import pytest

from retrain.policies import (
    POLICIES,
    ContinuumPolicy,
    CostAwarePolicy,
    PeriodicPolicy,
    TriggerPolicy,
    fit_training_time,
    make_policy,
)
from service.settings import Settings

KNOBS = {
    "bootstrap_events": 100,
    "refresh_events": None,
    "interval_s": 60.0,
    "weight": 10.0,
    "every_events": 500,
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_is_built_from_the_shared_knobs_and_answers_to_its_name(name: str) -> None:
    policy = make_policy(name, **KNOBS)
    assert isinstance(policy, TriggerPolicy)
    assert policy.name == name


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_trains_a_first_model_after_the_warm_up_and_not_before(name: str) -> None:
    policy = make_policy(name, **KNOBS)
    policy.observe_events(99, now=0.0)
    assert policy.on_progress(99, since_version=None) is None
    assert "first model" in policy.waiting_for(99, since_version=None)
    policy.observe_events(1, now=1.0)
    assert policy.on_progress(100, since_version=None) == "bootstrap"


def test_only_adwin_answers_a_drift_alert() -> None:
    answers = {name: make_policy(name, **KNOBS).on_alert() for name in POLICIES}
    assert answers == {name: ("drift" if name == "adwin" else None) for name in POLICIES}


def test_best_effort_retrains_whenever_anything_new_arrived() -> None:
    policy = make_policy("best-effort", **KNOBS)
    assert policy.on_progress(1_000, since_version=0) is None
    assert policy.on_progress(1_001, since_version=1) == "new-data"


def test_cost_aware_fires_once_per_interval_on_the_clock_it_is_given() -> None:
    policy = CostAwarePolicy(bootstrap_events=1, interval_s=60.0)
    fired = []
    for second in range(0, 301, 10):
        policy.observe_events(5, now=float(second))
        if policy.on_progress(10 + second, since_version=second + 1) is not None:
            fired.append(second)
    assert fired == [60, 120, 180, 240, 300]


def test_cost_aware_waits_for_new_data_when_a_batch_is_due() -> None:
    policy = CostAwarePolicy(bootstrap_events=1, interval_s=60.0)
    policy.observe_events(1, now=0.0)
    assert policy.on_progress(10, since_version=1) is None
    policy.observe_events(0, now=100.0)
    assert policy.on_progress(10, since_version=0) is None
    assert policy.on_progress(11, since_version=1) == "batch"


def test_continuum_fits_the_training_time_model_by_least_squares() -> None:
    alpha, beta = fit_training_time([(1_000, 7.0), (2_000, 9.1), (4_000, 12.9)], 30.0)
    assert alpha == pytest.approx(0.00193, abs=1e-4)
    assert beta == pytest.approx(5.1, abs=0.1)
    assert fit_training_time([(1_000, 7.0), (1_000, 9.0)], 30.0) == (0.0, 8.0)


def test_continuum_waits_longer_with_a_larger_weight_or_fixed_cost() -> None:
    def first_trigger(weight: float, fixed_s: float) -> float:
        policy = ContinuumPolicy(bootstrap_events=1, weight=weight, prior_fixed_s=fixed_s)
        policy.observe_job(1_000, seconds=fixed_s)
        for second in range(1, 10_000):
            policy.observe_events(10, now=float(second))
            if policy.on_progress(10**6, since_version=10 * second) == "regret":
                return second
        raise AssertionError("never retrained")

    # 10 events/s waiting t seconds: regret 5·t², so it fires at t ≈ sqrt(w·β / 5).
    assert first_trigger(10, 5.0) == 4
    assert first_trigger(40, 5.0) == 7
    assert first_trigger(10, 20.0) == 7


def test_periodic_counts_events_since_the_serving_version() -> None:
    policy = PeriodicPolicy(bootstrap_events=1, every_events=500)
    assert policy.on_progress(10_000, since_version=499) is None
    assert policy.on_progress(10_000, since_version=500) == "periodic"
    with pytest.raises(ValueError, match="every_events"):
        PeriodicPolicy(every_events=0)


def test_the_settings_take_every_registered_policy_and_their_knobs() -> None:
    for name in POLICIES:
        assert Settings(retrain_policy=name).retrain_policy == name
    settings = Settings(retrain_policy="continuum", continuum_weight=4, retrain_interval_s=120)
    assert (settings.continuum_weight, settings.retrain_interval_s) == (4, 120)
    with pytest.raises(ValueError, match="retrain_interval_s"):
        Settings(retrain_interval_s=0)
