"""The rollout guard's statistics and rule: paired differences with users as the unit,
and the decisions they lead to (``service.rollout.paired``, ``service.rollout.rule``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from service.rollout.paired import ClusteredMean, PairedComparison
from service.rollout.rule import GuardOptions, judge_shadow, judge_watch
from service.settings import Settings

OPTIONS = GuardOptions(min_events=2_000, early_events=500, max_events=20_000, watch_events=5_000)


def _clustered(
    rng: np.random.Generator, users: int, per_user: int, mean: float
) -> tuple[list[str], Any]:
    """Values whose users share a large effect each: events of a user are correlated."""
    effects = rng.normal(0.0, 1.0, users)
    names = [f"u{u}" for u in range(users) for _ in range(per_user)]
    values = mean + np.repeat(effects, per_user) + rng.normal(0.0, 0.2, users * per_user)
    return names, values


def test_the_user_clustered_interval_covers_the_mean_where_an_event_level_one_would_not() -> None:
    rng = np.random.default_rng(0)
    covered, naive_covered, runs = 0, 0, 300
    for _ in range(runs):
        names, values = _clustered(rng, users=40, per_user=25, mean=0.3)
        mean = ClusteredMean()
        mean.add(names, values)
        interval = mean.interval(0.95)
        covered += interval.low <= 0.3 <= interval.high
        half = 1.96 * values.std(ddof=1) / math.sqrt(len(values))  # as if events were free
        naive_covered += abs(values.mean() - 0.3) <= half
    assert 0.90 <= covered / runs <= 0.99
    assert naive_covered / runs < 0.5


def test_a_clustered_mean_added_batch_by_batch_equals_one_added_at_once() -> None:
    rng = np.random.default_rng(1)
    names, values = _clustered(rng, users=30, per_user=10, mean=0.0)
    whole, parts = ClusteredMean(), ClusteredMean()
    whole.add(names, values)
    for start in range(0, len(names), 37):
        parts.add(names[start : start + 37], values[start : start + 37])
    assert parts.interval(0.9).as_dict() == pytest.approx(whole.interval(0.9).as_dict())
    assert (parts.events, parts.clusters) == (300, 30)


def test_one_user_gives_no_bound() -> None:
    mean = ClusteredMean()
    mean.add(["u"] * 5, np.arange(5.0))
    interval = mean.interval(0.95)
    assert interval.estimate == 2.0 and interval.low == -math.inf and interval.high == math.inf


def test_the_rmse_difference_is_relative_and_hits_and_ndcg_are_paired() -> None:
    pair = PairedComparison()
    users = [f"u{j % 10}" for j in range(100)]
    pair.add_errors(users, np.full(100, 1.0), np.full(100, 0.81))  # RMSE 1.0 -> 0.9
    assert pair.rmse_diff(0.95).estimate == pytest.approx(-0.1)
    pair.add_ranks(["a", "b", "c", "d"], np.array([1, 20, 0, 5]), np.array([3, 2, 1, 30]))
    assert pair.ranked_events == 4 and pair.old_hit_rate == 0.5
    assert pair.hit_rate_diff(0.95).estimate == pytest.approx((1 + 1 + 1 + 0 - 1 - 0 - 0 - 1) / 4)
    figures = pair.figures(0.95)
    assert figures["events_compared"] == 100 and figures["old_rmse"] == pytest.approx(1.0)
    assert set(figures["ndcg_diff"]) == {"estimate", "low", "high"}


def _pair(
    rng: np.random.Generator, n: int, change: float, hit_change: float = 0.0
) -> PairedComparison:
    """``n`` events of 50 users; the new version's squared errors scaled by ``1 + change``
    (its RMSE by about ``sqrt(1 + change)``); every 10th event ranked, the new version's
    hits ``hit_change`` apart."""
    users = [f"u{j % 50}" for j in range(n)]
    old = rng.exponential(0.8, n)
    new = old * (1 + change) + rng.normal(0, 0.02, n)
    pair = PairedComparison()
    pair.add_errors(users, old, new)
    ranked = users[::10]
    old_ranks = np.where(rng.random(len(ranked)) < 0.3, 5, 50)
    flip = rng.random(len(ranked)) < abs(hit_change)
    new_ranks = old_ranks.copy()
    if hit_change < 0:
        new_ranks[flip & (old_ranks == 5)] = 50
    pair.add_ranks(ranked, old_ranks, new_ranks)
    return pair


def test_a_clearly_worse_candidate_is_held_as_soon_as_it_may_be_judged() -> None:
    rng = np.random.default_rng(2)
    assert judge_shadow(_pair(rng, 400, 0.3), OPTIONS, drift=False, elapsed_s=1) is None
    verdict = judge_shadow(_pair(rng, 600, 0.3), OPTIONS, drift=False, elapsed_s=1)
    assert verdict is not None and verdict.decision == "hold"
    assert verdict.reason.startswith("worse on RMSE than the serving version: RMSE +")


def test_a_candidate_not_worse_is_promoted_once_it_compared_the_minimum() -> None:
    rng = np.random.default_rng(3)
    assert judge_shadow(_pair(rng, 1_500, 0.0), OPTIONS, drift=False, elapsed_s=1) is None
    verdict = judge_shadow(_pair(rng, 2_000, 0.0), OPTIONS, drift=False, elapsed_s=1)
    assert verdict is not None and verdict.decision == "promote"
    assert "not worse than the serving version" in verdict.reason


def test_only_a_drift_version_clearly_better_goes_early() -> None:
    rng = np.random.default_rng(4)
    better = _pair(rng, 600, -0.2)
    assert judge_shadow(better, OPTIONS, drift=False, elapsed_s=1) is None
    verdict = judge_shadow(better, OPTIONS, drift=True, elapsed_s=1)
    assert verdict is not None and verdict.decision == "promote"
    assert verdict.reason.startswith("a drift version clearly better")


def test_a_lower_hit_rate_keeps_a_candidate_waiting_and_a_much_lower_one_holds_it() -> None:
    rng = np.random.default_rng(5)
    lower = _pair(rng, 2_500, 0.0, hit_change=-0.1)
    reading = lower.hit_rate_diff(0.95)
    assert reading.estimate < -0.05 * lower.old_hit_rate < reading.high  # not clearly worse
    assert judge_shadow(lower, OPTIONS, drift=False, elapsed_s=1) is None
    verdict = judge_shadow(
        _pair(rng, 2_500, 0.0, hit_change=-0.6), OPTIONS, drift=False, elapsed_s=1
    )
    assert verdict is not None and verdict.decision == "hold" and "hit-rate@10 -" in verdict.reason


def _spread(n: int, shift: float, spread: float) -> PairedComparison:
    """Squared errors 0.8 by the old version; by the new one 0.8 + ``shift``, half the
    users ``spread`` above that and half below: the mean is exact, the interval wide."""
    users = [f"u{j % 50}" for j in range(n)]
    sign = np.array([1.0 if j % 50 % 2 else -1.0 for j in range(n)])
    pair = PairedComparison()
    pair.add_errors(users, np.full(n, 0.8), 0.8 + shift + spread * sign)
    return pair


def test_a_candidate_clearly_better_on_rmse_is_not_kept_waiting_by_a_lower_hit_estimate() -> None:
    rng = np.random.default_rng(9)
    pair = _pair(rng, 2_500, -0.2, hit_change=-0.1)
    hit = pair.hit_rate_diff(0.95)
    assert hit.estimate < -0.05 * pair.old_hit_rate < hit.high  # lower, not clearly worse
    verdict = judge_shadow(pair, OPTIONS, drift=False, elapsed_s=1)
    assert verdict is not None and verdict.decision == "promote"


@pytest.mark.parametrize(
    ("rule", "shift", "expected"),
    [("estimate", 0.0, "promote"), ("estimate", 0.024, "hold"), ("promote", 0.024, "promote")],
)
def test_an_undecided_shadow_gets_the_timeout_rule(rule: str, shift: float, expected: str) -> None:
    options = GuardOptions(
        min_events=2_000,
        early_events=500,
        max_s=60.0,
        timeout_rule=rule,  # type: ignore[arg-type]
    )
    pair = _spread(900, shift, 0.5)  # RMSE +1.5 % for a shift of 0.024, far from decided
    assert judge_shadow(pair, options, drift=False, elapsed_s=10) is None
    verdict = judge_shadow(pair, options, drift=False, elapsed_s=61)
    assert verdict is not None and verdict.decision == expected
    assert "undecided in time" in verdict.reason


def test_a_fixed_shadow_length_decides_once_at_that_count() -> None:
    options = GuardOptions(shadow_events=3_000, min_events=2_000, early_events=500)
    rng = np.random.default_rng(7)
    assert judge_shadow(_pair(rng, 2_500, 0.3), options, drift=True, elapsed_s=1) is None
    verdict = judge_shadow(_pair(rng, 3_000, 0.0), options, drift=False, elapsed_s=1)
    assert verdict is not None and verdict.decision == "promote"


def test_a_watch_rolls_back_when_the_replaced_version_does_clearly_better() -> None:
    rng = np.random.default_rng(8)
    verdict = judge_watch(_pair(rng, 800, 0.3), OPTIONS)
    assert verdict is not None and verdict.decision == "roll_back"
    assert verdict.reason.startswith("the previous version does clearly better on RMSE: ")
    assert judge_watch(_pair(rng, 800, 0.0), OPTIONS) is None
    kept = judge_watch(_pair(rng, 5_000, 0.0), OPTIONS)
    assert kept is not None and kept.decision == "keep"


def test_the_settings_become_the_rules_options_and_are_checked() -> None:
    options = GuardOptions.of(Settings(shadow_min_events=300, shadow_early_events=500))
    assert (options.min_events, options.early_events) == (300, 300)
    with pytest.raises(ValueError, match="shadow_min_events"):
        Settings(shadow_min_events=30_000, shadow_max_events=20_000)
