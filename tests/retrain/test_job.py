"""A retraining job end to end in this process, and the trigger policy that starts it.

``retrain.job.run_training`` with ``retrain.backends.InProcessBackend`` and
``configurator.StaticConfigurator`` on a synthetic low-rank stream, plus
``retrain.policies.AdwinPolicy``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from configurator import (
    CONFIGURATORS,
    EpochConfig,
    Observation,
    StaticConfigurator,
    make_configurator,
)
from functions.mf import BiasedMF
from retrain.backends import EpochOutcome, InProcessBackend, TrainingBackend
from retrain.convergence import ConvergenceRule, StopReason
from retrain.job import EpochRecord, JobResult, run_training, starting_model
from retrain.policies import POLICIES, AdwinPolicy, TriggerPolicy
from retrain.spec import JobSpec
from retrain.window import RatingsWindow
from service.retraining import job_spec
from service.settings import Settings
from tests.support.synthetic import stationary_stream

CONFIG = EpochConfig(batch_size=128, learning_rate=0.05)


def _as_window(events: list[dict]) -> RatingsWindow:
    return RatingsWindow(
        [e["user_id"] for e in events],
        [e["item_id"] for e in events],
        np.array([e["rating"] for e in events], dtype=np.float64),
    )


@pytest.fixture(scope="module")
def window() -> RatingsWindow:
    events = stationary_stream(n_users=120, n_items=90, n_events=6000, factors=3, noise=0.2, seed=7)
    return _as_window(events)


def _template(seed: int = 0) -> BiasedMF:
    return BiasedMF(factors=4, learning_rate=0.05, regularization=0.02, seed=seed)


def _train(
    window: RatingsWindow,
    rule: ConvergenceRule,
    *,
    seed: int = 0,
    on_epoch: Callable[[EpochRecord], None] | None = None,
) -> JobResult:
    model = starting_model(None, _template(seed), window)
    return run_training(
        model, window, InProcessBackend(seed=seed), StaticConfigurator(CONFIG), rule, on_epoch
    )


# -- learning ----------------------------------------------------------------------


def test_training_loss_falls_on_a_low_rank_stream(window: RatingsWindow) -> None:
    result = _train(window, ConvergenceRule(max_epochs=15))
    losses = [e.loss for e in result.epochs]
    assert len(losses) == 15
    assert losses[-1] < 0.5 * losses[0]
    assert min(losses) == losses[-1]


def test_holdout_rmse_beats_a_global_mean_predictor(window: RatingsWindow) -> None:
    result = _train(window, ConvergenceRule(max_epochs=15))
    train, holdout = window.split_holdout()
    mean_rmse = float(np.sqrt(np.mean((holdout.ratings - train.ratings.mean()) ** 2)))
    assert result.holdout_rmse is not None
    assert result.holdout_rmse < 0.7 * mean_rmse
    # The reported figure is the trained model's error on exactly that holdout.
    predicted = result.model.predict(holdout.user_ids, holdout.item_ids)
    assert result.holdout_rmse == pytest.approx(
        float(np.sqrt(np.mean((predicted - holdout.ratings) ** 2)))
    )


def test_result_counts_train_and_holdout_events(window: RatingsWindow) -> None:
    result = _train(window, ConvergenceRule(max_epochs=1))
    assert result.holdout_events == len(window) // 10
    assert result.train_events + result.holdout_events == len(window)


def test_a_window_too_short_for_a_holdout_reports_no_holdout_rmse() -> None:
    tiny = RatingsWindow(["a", "b", "a"], ["x", "x", "y"], np.array([4.0, 3.0, 5.0]))
    result = _train(tiny, ConvergenceRule(max_epochs=2))
    assert result.holdout_rmse is None
    assert result.holdout_events == 0
    assert result.train_events == 3


def test_an_empty_window_is_rejected() -> None:
    empty = RatingsWindow([], [], np.empty(0))
    with pytest.raises(ValueError, match="at least one"):
        run_training(
            _template(),
            empty,
            InProcessBackend(seed=0),
            StaticConfigurator(CONFIG),
            ConvergenceRule(max_epochs=1),
        )


# -- the epoch loop ----------------------------------------------------------------


def test_on_epoch_is_called_once_per_epoch_with_the_config_dict(window: RatingsWindow) -> None:
    seen: list[EpochRecord] = []
    result = _train(window, ConvergenceRule(max_epochs=4), on_epoch=seen.append)
    assert len(seen) == 4
    assert seen == result.epochs
    assert [r.epoch for r in seen] == [0, 1, 2, 3]
    for record in seen:
        assert record.config == CONFIG.as_dict()
        assert isinstance(record.config, dict)
        assert record.duration_s >= 0.0
        assert np.isfinite(record.loss)


def test_the_job_stops_at_max_epochs(window: RatingsWindow) -> None:
    result = _train(window, ConvergenceRule(max_epochs=3))
    assert result.stop_reason is StopReason.MAX_EPOCHS
    assert len(result.epochs) == 3


def test_the_job_stops_when_the_loss_stays_below_target(window: RatingsWindow) -> None:
    result = _train(window, ConvergenceRule(target_loss=10.0, patience=2, max_epochs=50))
    assert result.stop_reason is StopReason.CONVERGED
    assert len(result.epochs) == 2


def test_the_job_stops_at_its_latency_cap_after_one_epoch(window: RatingsWindow) -> None:
    result = _train(window, ConvergenceRule(max_epochs=50, latency_cap_s=1e-9))
    assert result.stop_reason is StopReason.LATENCY_CAP
    assert len(result.epochs) == 1


class _PricedBackend(TrainingBackend):
    """Wraps the in-process backend and charges a fixed price per epoch."""

    name = "priced"

    def __init__(self, price_usd: float) -> None:
        self.inner = InProcessBackend(seed=0)
        self.price_usd = price_usd
        self.configs: list[EpochConfig] = []

    def prepare(self, model: BiasedMF, train: RatingsWindow) -> None:
        self.inner.prepare(model, train)

    def run_epoch(self, config: EpochConfig) -> EpochOutcome:
        self.configs.append(config)
        return dataclasses.replace(self.inner.run_epoch(config), cost_usd=self.price_usd)

    def result(self) -> BiasedMF:
        return self.inner.result()


def test_the_job_stops_at_its_budget_and_sums_the_cost(window: RatingsWindow) -> None:
    backend = _PricedBackend(price_usd=0.25)
    model = starting_model(None, _template(), window)
    rule = ConvergenceRule(max_epochs=50, budget_usd=1.0)
    result = run_training(model, window, backend, StaticConfigurator(CONFIG), rule)
    assert result.stop_reason is StopReason.BUDGET
    assert len(result.epochs) == 4
    assert [e.cost_usd for e in result.epochs] == [0.25] * 4
    assert result.cost_usd == pytest.approx(1.0)


def test_the_backend_runs_each_epoch_with_the_configurators_proposal(
    window: RatingsWindow,
) -> None:
    class _Schedule(StaticConfigurator):
        def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
            assert len(history) == epoch
            return EpochConfig(batch_size=64 * (epoch + 1), learning_rate=0.05)

    backend = _PricedBackend(price_usd=0.0)
    model = starting_model(None, _template(), window)
    result = run_training(model, window, backend, _Schedule(CONFIG), ConvergenceRule(max_epochs=3))
    assert [c.batch_size for c in backend.configs] == [64, 128, 192]
    assert [e.config["batch_size"] for e in result.epochs] == [64, 128, 192]


def test_the_backend_refuses_to_train_before_prepare() -> None:
    with pytest.raises(RuntimeError, match="prepare"):
        InProcessBackend(seed=0).run_epoch(CONFIG)


def test_the_backend_applies_the_epochs_learning_rate(window: RatingsWindow) -> None:
    backend = InProcessBackend(seed=0)
    model = starting_model(None, _template(), window)
    backend.prepare(model, window)
    backend.run_epoch(EpochConfig(batch_size=256, learning_rate=0.013))
    assert backend.result() is model
    assert model.learning_rate == 0.013


# -- reproducibility ---------------------------------------------------------------


def test_seeded_runs_reproduce_exactly(window: RatingsWindow) -> None:
    first = _train(window, ConvergenceRule(max_epochs=4), seed=3)
    second = _train(window, ConvergenceRule(max_epochs=4), seed=3)
    assert [e.loss for e in first.epochs] == [e.loss for e in second.epochs]
    assert first.holdout_rmse == second.holdout_rmse
    for name, array in first.model.to_arrays().items():
        np.testing.assert_array_equal(array, second.model.to_arrays()[name], err_msg=name)


def test_different_seeds_give_different_models(window: RatingsWindow) -> None:
    first = _train(window, ConvergenceRule(max_epochs=2), seed=3)
    second = _train(window, ConvergenceRule(max_epochs=2), seed=4)
    assert not np.array_equal(first.model.user_factors, second.model.user_factors)


# -- starting_model ----------------------------------------------------------------


def _base_model(events: list[dict]) -> BiasedMF:
    model = _template(seed=1)
    window = _as_window(events)
    model.fit(window.user_ids, window.item_ids, window.ratings, epochs=3, batch_size=256)
    return model


def test_a_warm_start_keeps_known_rows_and_grows_new_ids() -> None:
    events = stationary_stream(n_users=30, n_items=20, n_events=400, factors=3, seed=2)
    base = _base_model(events)
    before = base.to_arrays()
    window = RatingsWindow(
        ["u0", "new-user", "u1", "new-user"],
        ["i0", "i1", "new-item", "new-item"],
        np.array([1.0, 1.0, 1.0, 1.0]),
    )
    model = starting_model(base, _template(seed=9), window)

    assert model is not base
    assert model.global_mean == base.global_mean  # not the window's mean of 1.0
    assert model.user_ids[: base.n_users] == base.user_ids
    assert model.item_ids[: base.n_items] == base.item_ids
    np.testing.assert_array_equal(model.user_bias[: base.n_users], base.user_bias)
    np.testing.assert_array_equal(model.user_factors[: base.n_users], base.user_factors)
    np.testing.assert_array_equal(model.item_bias[: base.n_items], base.item_bias)
    np.testing.assert_array_equal(model.item_factors[: base.n_items], base.item_factors)
    assert model.user_ids[base.n_users :] == ["new-user"]
    assert model.item_ids[base.n_items :] == ["new-item"]
    assert model.get_params() == base.get_params()
    # The base model itself is left as it was.
    for name, array in base.to_arrays().items():
        np.testing.assert_array_equal(array, before[name], err_msg=name)


def test_a_warm_start_predicts_like_its_base_before_training() -> None:
    events = stationary_stream(n_users=30, n_items=20, n_events=400, factors=3, seed=2)
    base = _base_model(events)
    window = _as_window(events[:50])
    model = starting_model(base, _template(), window)
    users = [e["user_id"] for e in events]
    items = [e["item_id"] for e in events]
    np.testing.assert_array_equal(model.predict(users, items), base.predict(users, items))


def test_training_a_warm_start_leaves_the_base_model_untouched(window: RatingsWindow) -> None:
    base = _base_model(stationary_stream(n_users=120, n_items=90, n_events=1000, factors=3, seed=7))
    before = base.to_arrays()
    model = starting_model(base, _template(), window)
    run_training(
        model,
        window,
        InProcessBackend(seed=0),
        StaticConfigurator(CONFIG),
        ConvergenceRule(max_epochs=2),
    )
    for name, array in base.to_arrays().items():
        np.testing.assert_array_equal(array, before[name], err_msg=name)


def test_a_fresh_model_takes_the_windows_mean_and_the_templates_parameters() -> None:
    template = _template(seed=5)
    window = RatingsWindow(["a", "b", "a"], ["x", "y", "z"], np.array([1.0, 2.0, 4.5]))
    model = starting_model(None, template, window)
    assert model is not template
    assert model.global_mean == pytest.approx(2.5)
    assert model.get_params() == template.get_params()
    assert model.user_ids == ["a", "b"]
    assert model.item_ids == ["x", "y", "z"]
    assert template.n_users == 0 and template.global_mean == 0.0


# -- AdwinPolicy -------------------------------------------------------------------


def test_adwin_policy_bootstraps_once_enough_labelled_events_arrived() -> None:
    policy = AdwinPolicy(bootstrap_events=100)
    assert policy.on_progress(0, since_version=None) is None
    assert policy.on_progress(99, since_version=None) is None
    assert policy.on_progress(100, since_version=None) == "bootstrap"
    assert policy.on_progress(5_000, since_version=None) == "bootstrap"


def test_adwin_policy_does_not_bootstrap_once_a_version_exists() -> None:
    policy = AdwinPolicy(bootstrap_events=100, refresh_events=None)
    assert policy.on_progress(10_000, since_version=0) is None
    assert policy.on_progress(10_000, since_version=9_999) is None


def test_adwin_policy_refreshes_after_refresh_events_since_the_version() -> None:
    policy = AdwinPolicy(bootstrap_events=100, refresh_events=500)
    assert policy.on_progress(10_000, since_version=499) is None
    assert policy.on_progress(10_000, since_version=500) == "refresh"
    assert policy.on_progress(600, since_version=600) == "refresh"


def test_adwin_policy_retrains_on_every_drift_alert() -> None:
    policy = AdwinPolicy(bootstrap_events=100, refresh_events=None)
    assert policy.on_alert() == "drift"
    assert policy.on_alert() == "drift"


def test_adwin_policy_defaults_and_registry() -> None:
    policy = AdwinPolicy()
    assert (policy.bootstrap_events, policy.refresh_events, policy.name) == (1000, None, "adwin")
    assert POLICIES["adwin"] is AdwinPolicy
    assert isinstance(POLICIES["adwin"](bootstrap_events=5), TriggerPolicy)


# -- JobSpec and the configurator registry ---------------------------------------------


def test_a_spec_survives_its_job_record_and_ignores_keys_it_does_not_know() -> None:
    spec = JobSpec(workers=6, sync="asp", runtime="thread", budget_usd=0.5, target_loss=0.2)
    params = spec.as_params()
    assert JobSpec.from_params({**params, "retired_setting": 3}) == spec
    assert JobSpec.from_params({"workers": 2}) == JobSpec(workers=2)  # an older record


def test_a_spec_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        JobSpec().workers = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "bad",
    [
        {"factors": 0},
        {"batch_size": 0},
        {"max_epochs": 0},
        {"sync_ratio": 0.0},
        {"sync_ratio": 1.5},
        {"learning_rate": 0.0},
        {"latency_cap_s": -1.0},
        {"history_sample": -1},
        {"regularization": -0.1},
    ],
)
def test_a_spec_refuses_values_no_job_can_run_with(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        JobSpec(**bad)  # type: ignore[arg-type]


def test_a_spec_carries_the_settings_choices_of_policy_configurator_and_runtime() -> None:
    settings = Settings(retrain_runtime="sim", retrain_workers=5, retrain_sync="bsp")
    spec = job_spec(settings)
    assert (spec.policy, spec.configurator, spec.runtime, spec.sync) == (
        "adwin",
        "gp",
        "sim",
        "bsp",
    )
    assert spec.epoch_config() == EpochConfig(
        settings.batch_size,
        settings.learning_rate,
        workers=5,
        sync_ratio=settings.retrain_sync_ratio,
        memory_mb=settings.retrain_memory_mb,
    )
    assert spec.rule().max_epochs == settings.max_epochs


def test_configurators_are_a_registry_built_from_the_jobs_default_config() -> None:
    default = JobSpec(batch_size=256, workers=3).epoch_config()
    configurator = make_configurator("static", default)
    assert isinstance(configurator, StaticConfigurator)
    assert configurator.propose(0, []) == configurator.propose(5, []) == default
    assert {"static", "gp"} <= set(CONFIGURATORS)
    with pytest.raises(ValueError, match="unknown configurator 'hyperband'"):
        make_configurator("hyperband", default)


def test_settings_refuse_policies_and_configurators_not_registered() -> None:
    with pytest.raises(ValueError, match="retrain_policy"):
        Settings(retrain_policy="hourly")
    with pytest.raises(ValueError, match="retrain_configurator"):
        Settings(retrain_configurator="hyperband")
