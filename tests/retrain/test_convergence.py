"""When a retraining job stops: ``retrain.convergence.ConvergenceRule.check``."""

from __future__ import annotations

import math

import pytest

from retrain.convergence import ConvergenceRule, StopReason

# -- target loss (SandPiper's rule) ------------------------------------------------


def test_target_rule_needs_patience_consecutive_epochs_below_target() -> None:
    rule = ConvergenceRule(target_loss=0.5, patience=3, max_epochs=100)
    assert rule.check([0.9, 0.4, 0.4], elapsed_s=0.0) is None
    assert rule.check([0.9, 0.4, 0.4, 0.4], elapsed_s=0.0) is StopReason.CONVERGED


def test_target_rule_restarts_the_count_after_an_epoch_above_target() -> None:
    rule = ConvergenceRule(target_loss=0.5, patience=3, max_epochs=100)
    assert rule.check([0.4, 0.4, 0.6, 0.4, 0.4], elapsed_s=0.0) is None
    assert rule.check([0.4, 0.4, 0.6, 0.4, 0.4, 0.4], elapsed_s=0.0) is StopReason.CONVERGED


def test_target_rule_wants_strictly_below_target() -> None:
    rule = ConvergenceRule(target_loss=0.5, patience=2, max_epochs=100)
    assert rule.check([0.5, 0.5, 0.5], elapsed_s=0.0) is None
    assert rule.check([0.5, 0.5, 0.49999], elapsed_s=0.0) is None
    assert rule.check([0.5, 0.49999, 0.49999], elapsed_s=0.0) is StopReason.CONVERGED


def test_target_rule_ignores_a_plateau_above_target() -> None:
    rule = ConvergenceRule(target_loss=0.1, patience=2, max_epochs=100)
    assert rule.check([0.8, 0.8, 0.8, 0.8, 0.8], elapsed_s=0.0) is None


def test_no_epochs_never_stop() -> None:
    assert ConvergenceRule(target_loss=1.0, patience=1).check([], elapsed_s=0.0) is None
    assert ConvergenceRule(patience=1).check([], elapsed_s=0.0) is None


def test_default_patience_is_five_epochs() -> None:
    rule = ConvergenceRule(target_loss=1.0, max_epochs=100)
    assert rule.check([0.5] * 4, elapsed_s=0.0) is None
    assert rule.check([0.5] * 5, elapsed_s=0.0) is StopReason.CONVERGED


# -- plateau (no target) -----------------------------------------------------------


def test_plateau_rule_stops_when_each_of_the_last_patience_steps_improved_too_little() -> None:
    rule = ConvergenceRule(patience=2, min_improvement=0.01, max_epochs=100)
    # 1.0 -> 0.5 is a big step; the last two steps are below 1% each.
    assert rule.check([1.0, 0.5, 0.499, 0.498], elapsed_s=0.0) is StopReason.CONVERGED


def test_plateau_rule_needs_patience_steps_that_is_patience_plus_one_losses() -> None:
    rule = ConvergenceRule(patience=2, min_improvement=0.01, max_epochs=100)
    assert rule.check([0.5, 0.5], elapsed_s=0.0) is None
    assert rule.check([0.5, 0.5, 0.5], elapsed_s=0.0) is StopReason.CONVERGED


def test_plateau_rule_keeps_going_while_one_recent_step_still_improves_enough() -> None:
    rule = ConvergenceRule(patience=3, min_improvement=0.01, max_epochs=100)
    assert rule.check([1.0, 0.999, 0.9, 0.899, 0.898], elapsed_s=0.0) is None
    assert rule.check([1.0, 0.999, 0.9, 0.899, 0.898, 0.897], elapsed_s=0.0) is (
        StopReason.CONVERGED
    )


def test_plateau_improvement_is_relative_to_the_previous_loss() -> None:
    rule = ConvergenceRule(patience=1, min_improvement=0.01, max_epochs=100)
    # An absolute drop of 0.005 is 5% of 0.1 but only 0.5% of 1.0.
    assert rule.check([0.1, 0.095], elapsed_s=0.0) is None
    assert rule.check([1.0, 0.995], elapsed_s=0.0) is StopReason.CONVERGED


def test_plateau_rule_counts_a_rising_loss_as_no_improvement() -> None:
    rule = ConvergenceRule(patience=2, min_improvement=0.01, max_epochs=100)
    assert rule.check([0.5, 0.6, 0.7], elapsed_s=0.0) is StopReason.CONVERGED


def test_plateau_rule_treats_a_loss_settled_at_zero_as_converged() -> None:
    rule = ConvergenceRule(patience=2, max_epochs=100)
    assert rule.check([0.0, 0.0, 0.0], elapsed_s=0.0) is StopReason.CONVERGED


# -- resource limits ---------------------------------------------------------------


def test_max_epochs_stops_a_job_that_is_still_improving() -> None:
    rule = ConvergenceRule(patience=2, max_epochs=3)
    assert rule.check([4.0, 2.0], elapsed_s=0.0) is None
    assert rule.check([4.0, 2.0, 1.0], elapsed_s=0.0) is StopReason.MAX_EPOCHS


def test_convergence_is_reported_rather_than_max_epochs_when_both_hold() -> None:
    rule = ConvergenceRule(target_loss=1.0, patience=2, max_epochs=2)
    assert rule.check([0.5, 0.5], elapsed_s=0.0) is StopReason.CONVERGED


def test_latency_cap_stops_once_elapsed_reaches_it() -> None:
    rule = ConvergenceRule(patience=2, max_epochs=100, latency_cap_s=10.0)
    assert rule.check([4.0, 2.0], elapsed_s=9.99) is None
    assert rule.check([4.0, 2.0], elapsed_s=10.0) is StopReason.LATENCY_CAP
    assert rule.check([4.0], elapsed_s=1e6) is StopReason.LATENCY_CAP


def test_budget_stops_once_cost_reaches_it() -> None:
    rule = ConvergenceRule(patience=2, max_epochs=100, budget_usd=1.0)
    assert rule.check([4.0, 2.0], elapsed_s=0.0, cost_usd=0.99) is None
    assert rule.check([4.0, 2.0], elapsed_s=0.0, cost_usd=1.0) is StopReason.BUDGET


def test_without_a_budget_cost_never_stops_a_job() -> None:
    rule = ConvergenceRule(patience=2, max_epochs=100)
    assert rule.check([4.0, 2.0], elapsed_s=0.0, cost_usd=1e9) is None


# -- validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"patience": 0},
        {"patience": -1},
        {"max_epochs": 0},
        {"latency_cap_s": 0.0},
        {"latency_cap_s": -1.0},
        {"latency_cap_s": math.nan},
    ],
)
def test_invalid_arguments_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ConvergenceRule(**kwargs)


def test_smallest_valid_arguments_are_accepted() -> None:
    rule = ConvergenceRule(patience=1, max_epochs=1, latency_cap_s=1e-9)
    assert rule.check([1.0], elapsed_s=0.0) is StopReason.MAX_EPOCHS


def test_stop_reasons_have_stable_names() -> None:
    assert [str(r) for r in StopReason] == [
        "converged",
        "max_epochs",
        "latency_cap",
        "budget",
        "preempted",
    ]
