"""Arrival-rate traces: SandPiper Table II statistics, determinism, speed, inversion."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.traces import (
    DEFAULT_CONSTANT_RATE,
    DEFAULT_PERIOD_S,
    TABLE_II,
    TRACES,
    TraceStats,
    calibrate,
    make_trace,
)

CALIBRATED = sorted(TABLE_II)


def test_registry_holds_the_four_table_ii_traces_and_constant() -> None:
    assert set(TRACES) == {"constant", "wiki", "berkeley", "twitter", "wits"}
    assert TABLE_II["wiki"] == TraceStats(218, 331, 279.68)
    assert TABLE_II["berkeley"] == TraceStats(10, 240, 74.95)
    assert TABLE_II["twitter"] == TraceStats(1214, 6978, 3346.76)
    assert TABLE_II["wits"] == TraceStats(90, 2335, 423.45)


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("name", CALIBRATED)
def test_trace_matches_its_table_ii_min_max_and_time_average(name: str, seed: int) -> None:
    trace = make_trace(name, seed=seed)
    stats = TABLE_II[name]
    assert trace.min_rate == pytest.approx(stats.min_rate, rel=1e-9)
    assert trace.max_rate == pytest.approx(stats.max_rate, rel=1e-9)
    # The time average is the integral over one period divided by its length.
    time_average = trace.cumulative(trace.period_s) / trace.period_s
    assert time_average == pytest.approx(stats.mean_rate, rel=1e-4)
    assert trace.mean_rate == pytest.approx(stats.mean_rate, rel=1e-4)
    assert trace.period_s == DEFAULT_PERIOD_S


def test_constant_trace_runs_at_the_given_rate() -> None:
    assert make_trace("constant").mean_rate == DEFAULT_CONSTANT_RATE
    trace = make_trace("constant", rate=250.0)
    assert trace.min_rate == trace.max_rate == trace.mean_rate == 250.0
    assert trace.cumulative(2.0) == pytest.approx(500.0)
    assert trace.time_until(1000) == pytest.approx(4.0)


@pytest.mark.parametrize("name", CALIBRATED)
def test_traces_are_deterministic_for_a_seed_and_differ_across_seeds(name: str) -> None:
    np.testing.assert_array_equal(make_trace(name, seed=3).rates, make_trace(name, seed=3).rates)
    assert not np.array_equal(make_trace(name, seed=3).rates, make_trace(name, seed=4).rates)


@pytest.mark.parametrize("name", [*CALIBRATED, "constant"])
def test_speed_multiplies_the_rates_and_compresses_time(name: str) -> None:
    base = make_trace(name, seed=2)
    fast = make_trace(name, seed=2, speed=12.5)
    assert fast.mean_rate == pytest.approx(12.5 * base.mean_rate)
    assert fast.min_rate == pytest.approx(12.5 * base.min_rate)
    assert fast.max_rate == pytest.approx(12.5 * base.max_rate)
    assert fast.period_s == pytest.approx(base.period_s / 12.5)
    for t in (0.0, 0.37, 10.0, 123.4, 4000.0):
        assert fast.cumulative(t / 12.5) == pytest.approx(base.cumulative(t))
        assert fast.rate(t / 12.5) == pytest.approx(12.5 * base.rate(t))
    assert base.scaled(12.5).mean_rate == pytest.approx(fast.mean_rate)


@pytest.mark.parametrize("name", CALIBRATED)
def test_time_until_inverts_the_cumulative_count_across_periods(name: str) -> None:
    trace = make_trace(name, speed=3.0)
    total = trace.cumulative(trace.period_s)
    for n in (1, 2, 17, 999, total / 2, total, total + 1, 2.5 * total):
        t = trace.time_until(n)
        assert trace.cumulative(t) == pytest.approx(n, rel=1e-9)
        assert trace.due_by(t) == int(n)
    assert trace.time_until(0) == 0.0


@pytest.mark.parametrize("name", CALIBRATED)
def test_rate_repeats_after_one_period(name: str) -> None:
    trace = make_trace(name, speed=2.0)
    for t in (0.0, 1.25, 700.0):
        assert trace.rate(t) == trace.rate(t + trace.period_s)


def test_wits_has_the_highest_peak_to_median_ratio() -> None:
    ratios = {
        name: make_trace(name).max_rate / np.median(make_trace(name).rates) for name in TABLE_II
    }
    assert max(ratios, key=ratios.__getitem__) == "wits"
    assert ratios["wits"] > 5


def test_wiki_is_smooth_and_the_others_are_not() -> None:
    def largest_step(name: str) -> float:
        rates = make_trace(name).rates
        return float(np.abs(np.diff(rates)).max() / (rates.max() - rates.min()))

    assert largest_step("wiki") < 0.03
    assert all(largest_step(name) > 0.1 for name in ("berkeley", "twitter", "wits"))


def test_twitter_repeats_a_pattern_every_minute() -> None:
    rates = make_trace("twitter").rates
    centred = rates - rates.mean()

    def autocorrelation(lag: int) -> float:
        return float(np.mean(centred * np.roll(centred, lag)) / centred.var())

    assert autocorrelation(60) > 0.7
    assert autocorrelation(60) > autocorrelation(30) + 0.3


def test_calibrate_hits_the_target_for_any_shape() -> None:
    rng = np.random.default_rng(0)
    stats = TraceStats(5.0, 50.0, 12.0)
    for shape in (rng.random(500), rng.lognormal(size=500), np.linspace(0, 1, 500) ** 3):
        rates = calibrate(shape, stats)
        assert rates.min() == pytest.approx(5.0)
        assert rates.max() == pytest.approx(50.0)
        assert rates.mean() == pytest.approx(12.0, rel=1e-6)


def test_unknown_trace_and_bad_arguments_are_rejected() -> None:
    with pytest.raises(KeyError, match="unknown trace 'nope'; choose from"):
        make_trace("nope")
    with pytest.raises(ValueError, match="constant trace only"):
        make_trace("wiki", rate=10.0)
    with pytest.raises(ValueError, match="speed"):
        make_trace("wiki", speed=0.0)
    with pytest.raises(ValueError, match="rate"):
        make_trace("constant", rate=-1.0)
