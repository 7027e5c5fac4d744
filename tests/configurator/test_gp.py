"""GP-OPT on a small space against a known truth: feasible picks, recorded decisions,
cached GP predictions equal to gpytorch's, pruning, warm start, acquisition."""

from __future__ import annotations

import math
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import ndtr

from configurator import EpochConfig, History, JobContext, Observation, SearchSpace, WorkerRun
from configurator.acquisition import log_constrained_ei, log_h
from configurator.gp import (
    CALIBRATION_EPOCHS,
    Z95,
    GpOptConfigurator,
    GpOptSettings,
    _cheapest,
    _Scored,
    _undominated,
    surrogate_inputs,
)
from configurator.history import KEEP_STORED, PastEpoch, PastJob
from configurator.performance import (
    Z90,
    EpochModel,
    Prediction,
    _distinct,
    latency_groups,
    recalibrate,
)
from configurator.space import Candidates
from configurator.surrogate import GpytorchSurrogate, average_repeats
from functions.objectstore import FileObjectStore
from functions.runtimes.sim import DEFAULT_MODEL

SPACE = SearchSpace(
    memory_mb=(512, 1024, 1769),
    workers=(1, 4, 16),
    sync_ratio=(0.75, 1.0),
    batch_size=(512, 2048),
    learning_rate=(0.025, 0.1),
)
DEFAULT = EpochConfig(
    batch_size=1024, learning_rate=0.05, workers=4, sync_ratio=0.75, memory_mb=1024
)


def _context(cap: float = 60.0, epochs: int = 10) -> JobContext:
    return JobContext(100_000, 8, 10_000, cap, None, epochs, job_id="job-1")


def _observe(
    model: EpochModel, config: EpochConfig, loss: float, rng: np.random.Generator
) -> Observation:
    """An epoch as the model says, with noise: λ worker runs and the epoch's latency."""
    context = _context()
    cands = Candidates.of([config])
    scaled, n = model.shard_work(cands, context, context.train_samples)
    durations = scaled[0] * rng.lognormal(0, 0.2, config.workers)
    kappa = int(cands.kappa[0])
    latency = float(np.sort(durations)[kappa - 1])
    cost = float(durations.sum() * config.memory_mb / 1024 * 1.66667e-5)
    runs = tuple(
        WorkerRun(config.memory_mb, int(n[0]), float(d), False, config.batch_size)
        for d in durations
    )
    return Observation(config, latency, loss, cost, runs, context.train_samples)


def _job(configurator: GpOptConfigurator, epochs: int, seed: int = 0) -> list[Observation]:
    truth = EpochModel.prior()
    rng = np.random.default_rng(seed)
    history: list[Observation] = []
    loss = 1.0
    for t in range(epochs):
        config = configurator.propose(t, history)
        loss *= 0.97
        history.append(_observe(truth, config, loss, rng))
    return history


def test_the_search_space_is_the_documented_product_of_its_grids() -> None:
    space = SearchSpace()
    assert len(space) == len(space.grid()) == 35_000
    assert min(space.memory_mb) == 128 and max(space.memory_mb) == 10_240
    assert max(space.workers) == 1000
    with pytest.raises(ValueError, match="memory_mb"):
        SearchSpace(memory_mb=(64, 1024))


def test_without_a_context_gp_opt_proposes_the_default() -> None:
    assert GpOptConfigurator(DEFAULT, space=SPACE).propose(0, []) == DEFAULT


def test_every_decision_is_recorded_with_predictions_and_a_feasible_pick() -> None:
    configurator = GpOptConfigurator(DEFAULT, _context(), GpOptSettings(background=False), SPACE)
    history = _job(configurator, 6)
    assert len(configurator.decisions) == 6
    for decision in configurator.decisions:
        assert decision.candidates == len(SPACE)
        low, high = decision.latency_interval_s
        assert low <= decision.latency_s <= high
        assert decision.decision_ms > 0
    # The deadline is loose: every epoch meets its share.
    assert all(d.p_feasible >= 0.9 for d in configurator.decisions)
    assert all(
        o.duration_s <= d.deadline_s for o, d in zip(history, configurator.decisions, strict=True)
    )


def test_a_tight_deadline_buys_more_workers_or_memory_than_a_loose_one() -> None:
    def first(cap: float) -> EpochConfig:
        c = GpOptConfigurator(DEFAULT, _context(cap), GpOptSettings(background=False), SPACE)
        return c.propose(0, [])

    loose, tight = first(1000.0), first(1.5)
    speed = lambda c: c.workers * min(c.memory_mb, 1769)  # noqa: E731
    assert speed(tight) > speed(loose)


def test_the_max_workers_of_the_runtime_bound_the_candidates() -> None:
    context = JobContext(100_000, 8, 10_000, 1.0, None, 10, max_workers=4)
    configurator = GpOptConfigurator(DEFAULT, context, GpOptSettings(background=False), SPACE)
    assert configurator.propose(0, []).workers <= 4


def test_the_cached_gp_prediction_equals_gpytorchs_exact_posterior() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.random((12, 3)), rng.standard_normal(12)
    surrogate = GpytorchSurrogate()
    surrogate.fit(x, y, optimise=True)
    points = rng.random((40, 3))
    mean, var = surrogate.predict(points)
    ux, uy, _ = average_repeats(x, y)
    model = surrogate.build_model(ux, uy)
    model.eval()
    with torch.no_grad():
        exact = model(torch.as_tensor(points))
    np.testing.assert_allclose(mean, exact.mean.numpy(), atol=1e-8)
    np.testing.assert_allclose(var, exact.variance.numpy(), atol=1e-8)


def test_repeated_configurations_are_averaged() -> None:
    x = np.array([[0.1, 0.2], [0.1, 0.2], [0.5, 0.5]])
    ux, uy, counts = average_repeats(x, np.array([1.0, 3.0, 5.0]))
    assert len(ux) == 2 and sorted(uy.tolist()) == [2.0, 5.0] and sorted(counts.tolist()) == [1, 2]


def test_a_configuration_run_again_is_known_better_than_one_run_once() -> None:
    """Ten epochs of a config pin its residual down; one leaves it shrunk to the prior."""
    far = np.array([[0.9, 0.9]])
    x = np.vstack([np.repeat([[0.1, 0.1]], 10, axis=0), far])
    y = np.r_[np.full(10, 0.5), 0.5]
    surrogate = GpytorchSurrogate()
    surrogate.fit(x, y, optimise=False)
    mean, var = surrogate.predict(np.array([[0.1, 0.1], [0.9, 0.9]]))
    assert mean[0] > 0.8 * 0.5 and mean[1] < 0.6 * 0.5
    assert var[0] < 0.25 * var[1]


def test_the_jobs_phase_is_not_credited_to_the_configs_run_early() -> None:
    """Two configs that progress alike, one run while the loss fell fast and one later:
    their progress residuals agree once the job's decay is fitted."""
    context = _context(epochs=20)
    prior = EpochModel.prior()
    early, late = DEFAULT, replace(DEFAULT, learning_rate=0.1)
    rng = np.random.default_rng(5)
    history, loss = [], 1.0
    shape = prior.progress.shape(Candidates.of([early, late]), context.train_samples)
    for t in range(12):
        config = early if t < 6 else late
        loss *= 1.0 - 0.1 * 0.85**t * shape[0 if t < 6 else 1] / shape[0]
        history.append(replace(_observe(prior, config, loss, rng), loss=loss))
    fitted = recalibrate(prior, history, context)
    assert fitted.progress.decay == pytest.approx(0.85, abs=0.03)
    configurator = GpOptConfigurator(DEFAULT, context, GpOptSettings(background=False), SPACE)
    x, residuals, masks = configurator._observations(history, fitted)
    progress = residuals["progress"][masks["progress"]]
    first, second = progress[:5], progress[5:]  # epoch 0 has no progress of its own
    assert abs(float(np.mean(first) - np.mean(second))) < 0.1


def test_recalibration_learns_the_scale_of_the_workers() -> None:
    prior = EpochModel.prior()
    slower = EpochModel.prior().worker.replace(
        compute_s_per_sample=prior.worker.compute_s_per_sample * 3,
        compute_s_per_batch=prior.worker.compute_s_per_batch * 3,
        overhead_s=prior.worker.overhead_s * 3,
    )
    truth = EpochModel(slower, prior.slowdowns)
    rng = np.random.default_rng(2)
    history = [_observe(truth, DEFAULT, 1.0 - 0.01 * t, rng) for t in range(3)]
    fitted = recalibrate(prior, history, _context())
    cands = Candidates.of([DEFAULT])
    ratio = (
        fitted.shard_work(cands, _context(), 100_000)[0]
        / prior.shard_work(cands, _context(), 100_000)[0]
    )
    assert ratio[0] == pytest.approx(3.0, rel=0.2)


def test_pruning_keeps_the_front_and_drops_what_is_beaten_in_both() -> None:
    latency = np.array([1.0, 2.0, 3.0, 3.0])
    objective = np.array([3.0, 2.0, 1.0, 5.0])
    assert _undominated(latency, objective, 0.0, 0.0).tolist() == [True, True, True, False]


def test_pruning_keeps_the_cheapest_candidates_likely_on_time_beside_the_cheapest() -> None:
    """The cheapest candidates are the slowest: cut by cost alone, the two kept here are
    both unlikely on time. Places go to the cheapest the prior deems on time."""
    settings = GpOptSettings(background=False, keep=2)
    configurator = GpOptConfigurator(DEFAULT, _context(3.0), settings, SPACE)
    config = configurator.propose(0, [])
    decision = configurator.last_decision
    assert decision is not None and decision.p_feasible >= 0.9
    low, high = decision.latency_interval_s  # a 90 % interval: its ends are q05 and q95
    q90 = decision.latency_s * (high / decision.latency_s) ** (Z90 / Z95)
    assert q90 <= decision.deadline_s * (1 + 1e-9)
    assert config.workers > 1


@pytest.mark.parametrize("n", [0, 1, 7, 40, 500])
def test_the_cheapest_rows_are_a_stable_sorts_first_even_among_ties(n: int) -> None:
    rng = np.random.default_rng(n)
    objective = rng.integers(0, 12, 300).astype(np.float64)  # many ties
    mask = rng.random(300) < 0.6
    stable = np.argsort(objective, kind="stable")
    expected = stable[mask[stable]][:n]
    assert _cheapest(objective, np.flatnonzero(mask), n).tolist() == expected.tolist()


def test_log_ei_is_finite_far_below_the_incumbent_and_ranks_by_feasibility() -> None:
    assert np.isfinite(log_h(np.array([-50.0, -1e3, 0.0, 5.0]))).all()
    z = np.array([0.3, 1.5])
    direct = np.log(
        np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
        + z * 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    )
    np.testing.assert_allclose(log_h(z), direct, rtol=1e-10)
    mean, sd = np.zeros(2), np.ones(2)
    constraint = (np.array([0.0, 3.0]), np.ones(2), 1.0)
    scores = log_constrained_ei(mean, sd, 0.0, [constraint])
    assert scores[0] > scores[1]


def test_a_warm_start_reads_earlier_jobs_and_keeps_this_ones(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    first = GpOptConfigurator(
        DEFAULT, _context(), GpOptSettings(background=False), SPACE, history=History(store)
    )
    first.close(_job(first, 4))
    assert store.list("") == ["configurator/jobs/job-1.json"]
    warm = GpOptConfigurator(
        DEFAULT, _context(), GpOptSettings(background=False), SPACE, history=History(store)
    )
    assert len(warm._past) == 1 and len(warm._past[0].epochs) == 4
    assert warm._surrogates["latency"].state() == first._surrogates["latency"].state()
    warm.propose(0, [])  # conditions on the earlier job's epochs at once
    assert warm.last_decision is not None


def test_background_refits_leave_decisions_working() -> None:
    configurator = GpOptConfigurator(DEFAULT, _context(), GpOptSettings(background=True), SPACE)
    _job(configurator, 5)
    configurator.close()
    assert len(configurator.decisions) == 5


def test_the_store_keeps_only_the_newest_jobs_observations(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    history = History(store)
    epoch = PastEpoch(DEFAULT.as_dict(), 1.0, 0.001, 0.1, 1_000)
    for number in range(1, KEEP_STORED + 6):
        history.save(PastJob(f"job-{number}", 1_000, 8, 100, (epoch,)))
    kept = store.list("configurator/jobs/")
    assert len(kept) == KEEP_STORED
    assert "configurator/jobs/job-6.json" in kept and "configurator/jobs/job-5.json" not in kept
    assert [job.job_id for job in history.load()][:2] == [
        f"job-{KEEP_STORED + 5}",
        f"job-{KEEP_STORED + 4}",
    ]


def test_the_latency_interval_widens_until_it_holds_the_jobs_own_epochs() -> None:
    rng = np.random.default_rng(5)
    truth = EpochModel.prior()
    # Epochs of many workers, half of them awaited: the model's own spread is the
    # order statistic's in the body of the slowdowns, not its guard on a short tail.
    space = replace(SPACE, workers=(16,), sync_ratio=(0.5,))
    steady = GpOptConfigurator(DEFAULT, _context(), GpOptSettings(background=False), space)
    erratic = GpOptConfigurator(DEFAULT, _context(), GpOptSettings(background=False), space)
    histories: dict[int, list[Observation]] = {id(steady): [], id(erratic): []}
    factors = rng.choice([1.0, 2.5], size=12, p=[0.6, 0.4])
    for t in range(12):
        for configurator, scale in ((steady, 1.0), (erratic, factors[t])):
            history = histories[id(configurator)]
            config = configurator.propose(t, history)
            epoch = _observe(truth, config, 1.0 - 0.02 * t, rng)
            history.append(replace(epoch, duration_s=epoch.duration_s * scale))
    widened = erratic.decisions[-1].extra["latency_widening"]
    assert steady.decisions[-1].extra["latency_widening"] == pytest.approx(1.0, abs=0.3)
    assert widened > 1.5
    inside = [
        d.latency_interval_s[0] <= o.duration_s <= d.latency_interval_s[1]
        for d, o in zip(erratic.decisions[6:], histories[id(erratic)][6:], strict=True)
    ]
    assert np.mean(inside) >= 0.5


def test_one_straggling_epoch_among_the_first_barely_widens_the_interval() -> None:
    """Five errors alone put the 90th percentile at nearly the largest: one epoch three
    times slower than predicted used to widen every later interval more than twofold."""
    rng = np.random.default_rng(11)
    truth = EpochModel.prior()
    space = replace(SPACE, workers=(16,), sync_ratio=(0.5,))
    configurator = GpOptConfigurator(DEFAULT, _context(), GpOptSettings(background=False), space)
    history: list[Observation] = []
    for t in range(CALIBRATION_EPOCHS + 1):
        config = configurator.propose(t, history)
        epoch = _observe(truth, config, 1.0 - 0.02 * t, rng)
        scale = 3.0 if t == 2 else 1.0
        history.append(replace(epoch, duration_s=epoch.duration_s * scale))
    widening = configurator.decisions[-1].extra["latency_widening"]
    assert 1.0 < widening < 1.8


def test_exploration_skips_candidates_that_could_be_far_dearer_than_the_incumbent() -> None:
    configurator = GpOptConfigurator(DEFAULT, _context(), GpOptSettings(background=False), SPACE)
    history = _job(configurator, 3)
    n = 6
    scored = _Scored(
        rows=np.arange(n),
        lat=np.zeros(n),
        lat_sd=np.full(n, 0.1),
        cost=np.zeros(n),
        cost_sd=np.full(n, 0.1),
        # The incumbent (0), two near it and sure, three near on average but uncertain.
        objective=np.array([0.0, 0.05, 0.1, 0.02, 0.03, 0.04]),
        objective_sd=np.array([0.01, 0.01, 0.01, 1.0, 1.5, 2.0]),
        p_feasible=np.ones(n),
        p_staying=np.ones(n),
        widening=1.0,
    )
    pick, _, considered = configurator._decide(scored, history, epoch=3)
    assert pick in (0, 1, 2)
    assert considered == 3


def test_an_epoch_explores_only_where_the_expected_improvement_is_worth_it() -> None:
    """CherryPick's rule: below 10 % expected improvement the incumbent runs."""

    def scored(sd: float) -> _Scored:
        n = 3
        return _Scored(
            rows=np.arange(n),
            lat=np.zeros(n),
            lat_sd=np.full(n, 0.1),
            cost=np.zeros(n),
            cost_sd=np.full(n, 0.1),
            objective=np.array([0.0, 0.01, 0.02]),  # the incumbent is row 0
            objective_sd=np.array([0.01, sd, sd]),
            p_feasible=np.ones(n),
            p_staying=np.ones(n),
            widening=1.0,
        )

    def decide(settings: GpOptSettings, sd: float) -> tuple[int, str]:
        configurator = GpOptConfigurator(DEFAULT, _context(), settings, SPACE)
        pick, reason, _ = configurator._decide(scored(sd), [], epoch=3)
        return pick, reason

    # Near-certain rows a percent or two dearer on average: EI of about 1.5 %.
    assert decide(GpOptSettings(background=False), 0.05) == (
        0,
        "best feasible posterior mean: no EI worth exploring",
    )
    assert decide(GpOptSettings(background=False, min_improvement=0.0), 0.05)[0] == 1
    # Rows that could well be much cheaper are still tried.
    assert decide(GpOptSettings(background=False, explore_slack=10.0), 0.5)[0] != 0
    with pytest.raises(ValueError, match="min_improvement"):
        GpOptSettings(min_improvement=1.0)


def test_a_job_ahead_of_its_schedule_keeps_part_of_the_time_it_saved() -> None:
    """Epochs that ran under their share leave more time per epoch left; the next plans
    to spend ``slack_spend`` of that gain (0.4 of it by default), and a job behind plans
    at what is left."""
    context = _context(cap=60.0, epochs=10)  # a nominal share of 6 s
    rng = np.random.default_rng(0)

    def share(settings: GpOptSettings, epoch_s: float) -> float:
        history = [
            replace(_observe(EpochModel.prior(), DEFAULT, 1.0, rng), duration_s=epoch_s)
            for _ in range(4)
        ]
        configurator = GpOptConfigurator(DEFAULT, context, settings, SPACE)
        return configurator._shares(4, history)[0]

    # 4 epochs of 3 s leave 48 s for 6 epochs: 8 s each, 2 s over the nominal share.
    assert share(GpOptSettings(background=False, slack_spend=1.0), 3.0) == pytest.approx(8.0)
    assert share(GpOptSettings(background=False), 3.0) == pytest.approx(6.8)
    assert share(GpOptSettings(background=False, slack_spend=0.0), 3.0) == pytest.approx(6.0)
    # 4 epochs of 9 s leave 24 s for 6 epochs: 4 s each, whatever the setting.
    assert share(GpOptSettings(background=False, slack_spend=0.0), 9.0) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="slack_spend"):
        GpOptSettings(slack_spend=1.5)


def test_a_steady_epochs_latency_quantiles_match_its_warm_and_cold_workers() -> None:
    """Following itself, a config with κ < λ finds only κ containers free: the κ-th
    fastest is taken among warm and cold workers together. Its predicted quantiles are
    those of that order statistic (Monte Carlo here), not the slower of the two groups'
    own quantiles."""
    model = EpochModel.prior()
    context = _context()
    config = EpochConfig(
        batch_size=1024, learning_rate=0.1, workers=32, sync_ratio=0.5, memory_mb=1024
    )
    cands = Candidates.of([config])
    predicted = model.predict(cands, context, previous=config)
    scaled = float(model.shard_work(cands, context, context.train_samples)[0][0])
    rng = np.random.default_rng(0)
    draws = model.slowdowns[rng.integers(len(model.slowdowns), size=(20_000, 32))] * scaled
    cold = rng.random((20_000, 32)) < 0.5  # each worker cold with the share that is
    kth = np.sort(draws + cold * model.worker.cold_start_s, axis=1)[:, 15]
    median, q90 = np.quantile(kth, [0.5, 0.9])
    log_lat, sd = predicted.log_latency[0], predicted.log_latency_sd[0]
    assert math.exp(log_lat) == pytest.approx(median, rel=0.03)
    assert math.exp(log_lat + 1.2815515655446004 * sd) == pytest.approx(q90, rel=0.03)


def test_with_nothing_on_time_now_the_pick_is_the_cheapest_on_time_once_warm() -> None:
    """A switch's cold starts can make every candidate late this epoch (a job's first
    epoch on a tight deadline); the fallback takes the cheapest that stays on time."""
    configurator = GpOptConfigurator(DEFAULT, _context(), GpOptSettings(background=False), SPACE)
    n = 4
    scored = _Scored(
        rows=np.arange(n),
        lat=np.array([0.0, -1.0, 0.0, 0.0]),
        lat_sd=np.full(n, 0.1),
        cost=np.zeros(n),
        cost_sd=np.full(n, 0.1),
        objective=np.array([0.0, 0.5, 0.3, 0.1]),
        objective_sd=np.full(n, 0.1),
        p_feasible=np.array([0.2, 0.5, 0.1, 0.1]),
        p_staying=np.array([0.5, 0.5, 0.95, 0.99]),
        widening=1.0,
    )
    pick, reason, _ = configurator._decide(scored, [], epoch=0)
    assert pick == 3 and "once warm" in reason
    none = replace(scored, p_staying=np.full(n, 0.5))
    pick, reason, _ = configurator._decide(none, [], epoch=0)
    assert pick == 1 and "least late" in reason


def test_with_nothing_on_time_now_a_config_nearly_on_time_is_kept_rather_than_left() -> None:
    """Near the chance constraint's edge a recalibration moves the current config just
    under it: staying, nearly as likely on time, beats a switch whose cold starts make
    this epoch late. A config far under it is left, and so is any at the job's end."""
    configurator = GpOptConfigurator(DEFAULT, _context(), GpOptSettings(background=False), SPACE)
    grid = SPACE.grid()
    stay = 0
    switch = int(np.flatnonzero(grid.memory_mb != grid.memory_mb[stay])[0])
    current = grid.config(stay)
    history = [Observation(current, 1.0, 0.9, 1e-6, (), 100_000)]

    def scored(p_current: float) -> _Scored:
        n = 2
        return _Scored(
            rows=np.array([stay, switch]),
            lat=np.zeros(n),
            lat_sd=np.full(n, 0.1),
            cost=np.zeros(n),
            cost_sd=np.full(n, 0.1),
            objective=np.array([0.1, 0.2]),
            objective_sd=np.full(n, 0.1),
            p_feasible=np.array([p_current, 0.05]),
            p_staying=np.array([p_current, 0.95]),
            widening=1.0,
        )

    pick, reason, _ = configurator._decide(scored(0.8), history, epoch=1)
    assert pick == 0 and "kept memory" in reason
    pick, reason, _ = configurator._decide(scored(0.6), history, epoch=1)
    assert pick == 1 and "once warm" in reason
    pick, _, _ = configurator._decide(scored(0.8), history, epoch=9)  # the last epoch
    assert pick == 1


def test_pruning_keeps_the_current_memory_and_workers_even_when_they_look_late() -> None:
    """A fallback can stay only on rows that were scored."""
    settings = GpOptSettings(background=False, keep=8)
    configurator = GpOptConfigurator(DEFAULT, _context(), settings, SPACE)
    grid, context = SPACE.grid(), _context()
    current = replace(DEFAULT, memory_mb=512, workers=16)
    groups = latency_groups(grid)
    now = configurator.prior.predict(grid, context, previous=current, same_latency=groups)
    steady = configurator.prior.predict(grid, context, previous=grid, same_latency=groups)
    assert not configurator._keeps(configurator._prune(now, steady, 1e-3), current).any()
    assert configurator._keeps(configurator._prune(now, steady, 1e-3, current), current).any()


def test_recalibration_at_one_memory_size_keeps_the_seconds_a_smaller_one_slows() -> None:
    """Runs at one memory size whose durations hardly grow with the shard invite least
    squares to call every second fixed; a smaller memory size would then look as fast.
    The fit keeps at least half the per-sample seconds of the scaled prior."""
    prior = EpochModel.prior()
    history = []
    for t, samples in enumerate((1_000, 4_000, 16_000, 1_000, 4_000, 16_000)):
        config = replace(DEFAULT, memory_mb=1769, workers=100_000 // samples)
        runs = tuple(
            WorkerRun(1769, samples, 0.1 + 1e-7 * samples + 1e-3 * i, False, 1024) for i in range(8)
        )
        history.append(Observation(config, 0.1, 1.0 - 0.01 * t, 1e-6, runs, 100_000))
    fitted = recalibrate(prior, history, _context())
    scale = np.median([r.duration_s for o in history for r in o.workers]) / np.median(
        [prior.shard_work(Candidates.of([o.config]), _context(), 100_000)[0][0] for o in history]
    )
    assert fitted.worker.compute_s_per_sample >= 0.5 * scale * prior.worker.compute_s_per_sample


@pytest.mark.parametrize("cap", [0.001, 60.0])
def test_pruning_keeps_each_row_once(cap: float) -> None:
    """On a grid smaller than ``keep``, with a deadline nothing meets and one most do."""
    configurator = GpOptConfigurator(DEFAULT, _context(cap), GpOptSettings(background=False), SPACE)
    kept: list[np.ndarray] = []
    prune = configurator._prune
    configurator._prune = lambda *args: kept.append(prune(*args)) or kept[-1]  # type: ignore[method-assign]
    configurator.propose(0, [])
    assert len(kept[0]) == len(set(kept[0].tolist())) > 0


def test_latency_solved_once_per_group_equals_every_row_solved() -> None:
    """Rows that differ only in learning rate share their latency: solving it once per
    group (what GP-OPT does over its grid) predicts what solving every row does."""
    grid, model, context = SPACE.grid(), EpochModel.prior(), _context()
    groups = latency_groups(grid)
    assert len(groups[0]) == len(grid) // len(SPACE.learning_rate)
    for previous in (None, DEFAULT, grid):
        every = model.predict(grid, context, previous=previous)
        grouped = model.predict(grid, context, previous=previous, same_latency=groups)
        np.testing.assert_array_equal(grouped.log_latency, every.log_latency)
        np.testing.assert_array_equal(grouped.log_latency_sd, every.log_latency_sd)


def test_distinct_rows_map_back_onto_every_row() -> None:
    """Latency mixtures are solved once per distinct input: each row must get its own
    combination's solution back, and no combination is solved twice."""
    rng = np.random.default_rng(3)
    columns = [rng.integers(0, 3, 500).astype(float), rng.choice([0.5, 0.25], 500)]
    for rows in (np.arange(500), np.flatnonzero(columns[0] > 0), np.arange(0)):
        first, inverse = _distinct(rows, *columns)
        for column in columns:
            np.testing.assert_array_equal(column[first][inverse], column[rows])
        assert len({tuple(c[i] for c in columns) for i in first}) == len(first)


def test_predicting_after_several_predecessors_equals_predicting_after_each() -> None:
    """A decision predicts its grid after itself and after the current config at once,
    solving again only the rows whose cold workers differ: each prediction must be the
    one a separate call makes, bit for bit."""
    grid, context = SPACE.grid(), _context()
    model = replace(EpochModel.prior(), coordinator_s=(0.2, 0.01))
    groups = latency_groups(grid)
    for current in (None, DEFAULT, grid.config(len(grid) // 3)):
        together = model.predict_after(grid, context, (grid, current), same_latency=groups)
        for previous, joint in zip((grid, current), together, strict=True):
            alone = model.predict(grid, context, previous=previous, same_latency=groups)
            for field in fields(alone):
                np.testing.assert_array_equal(
                    getattr(joint, field.name), getattr(alone, field.name), err_msg=field.name
                )


def test_with_nothing_on_time_even_once_warm_equal_lateness_is_decided_by_the_objective() -> None:
    """Rows that differ only in learning rate are equally late; the fallback must not
    take the first of them in the grid (the smallest learning rate, the least progress)."""
    configurator = GpOptConfigurator(DEFAULT, _context(), GpOptSettings(background=False), SPACE)
    n = 4
    scored = _Scored(
        rows=np.arange(n),
        lat=np.array([-1.0, -1.0, -1.0, 0.0]),
        lat_sd=np.full(n, 0.1),
        cost=np.zeros(n),
        cost_sd=np.full(n, 0.1),
        objective=np.array([2.0, 0.5, 1.0, 0.0]),
        objective_sd=np.full(n, 0.1),
        p_feasible=np.full(n, 0.1),
        p_staying=np.full(n, 0.2),
        widening=1.0,
    )
    pick, reason, _ = configurator._decide(scored, [], epoch=0)
    assert pick == 1 and "least late" in reason


def test_refits_build_the_surrogates_the_configurator_was_given() -> None:
    """The benchmark's scikit-learn GP must be refitted as itself, not as gpytorch."""
    built: list[str] = []

    class Tagged(GpytorchSurrogate):
        def __init__(self) -> None:
            super().__init__()
            built.append("tagged")

    configurator = GpOptConfigurator(
        DEFAULT, _context(), GpOptSettings(background=False), SPACE, surrogates=Tagged
    )
    _job(configurator, 3)
    assert len(built) > 3  # three at the start, three more per refit


def test_a_one_worker_epochs_tail_is_raised_while_few_records_show_the_stragglers() -> None:
    """The 90th percentile of one worker rests on the stragglers the records showed; a
    many-worker epoch's sits in the body of the distribution and does not move."""
    prior = EpochModel.prior()
    few, many = replace(prior, slowdown_records=16.0), replace(prior, slowdown_records=1e9)
    context = _context()

    def q90(model: EpochModel, config: EpochConfig) -> float:
        cands = Candidates.of([config])
        predicted = model.predict(cands, context, previous=cands)
        return math.exp(predicted.log_latency[0] + 1.2815515655446004 * predicted.log_latency_sd[0])

    one = replace(DEFAULT, workers=1, sync_ratio=1.0)
    half = replace(DEFAULT, workers=16, sync_ratio=0.5)
    assert q90(few, one) > 1.1 * q90(many, one)
    assert q90(few, half) == pytest.approx(q90(many, half), rel=1e-9)
    scaled = prior.shard_work(Candidates.of([one]), context, context.train_samples)[0][0]
    assert q90(many, one) == pytest.approx(prior.slowdown_quantile(np.array([0.9]))[0] * scaled)


def _conditioned(
    epochs: list[tuple[EpochConfig, float]], seed: int
) -> tuple[GpOptConfigurator, EpochModel, list[Observation]]:
    """A configurator whose GPs are conditioned on ``epochs``: each config run with the
    loss multiplied by its factor, latency and cost as the prior says, with noise."""
    configurator = GpOptConfigurator(DEFAULT, _context(), GpOptSettings(background=False), SPACE)
    rng = np.random.default_rng(seed)
    prior = EpochModel.prior()
    history, loss = [], 1.0
    for config, factor in epochs:
        loss *= factor
        history.append(replace(_observe(prior, config, loss, rng), loss=loss))
    configurator._condition(history, prior, optimise=False)
    return configurator, prior, history


def _score_whole_grid(
    configurator: GpOptConfigurator, prior: EpochModel, history: list[Observation]
) -> tuple[_Scored, Prediction, Prediction]:
    """Every grid row scored at epoch 8 of 10 with a 6 s share: ``(scored, now, steady)``."""
    context = configurator.context
    assert context is not None
    grid = configurator._grid
    now = prior.predict(grid, context, previous=history[-1].config)
    steady = prior.predict(grid, context, previous=grid)
    rows = np.arange(len(grid))
    scored = configurator._score(
        rows, now, steady, history, context.train_samples, 8, 6.0, math.inf
    )
    return scored, now, steady


def test_the_learning_rate_moves_no_latency_or_cost_residual_only_progress() -> None:
    """Epochs that differ in their learning rate alone are repeats of one config to the
    latency and cost GPs, which then score such rows alike; the progress GP tells them
    apart."""
    configurator, prior, history = _conditioned(
        [
            (replace(DEFAULT, learning_rate=(0.025, 0.1)[t % 2]), (0.9, 0.97)[t % 2])
            for t in range(8)
        ],
        seed=3,
    )
    slow, fast = replace(DEFAULT, learning_rate=0.025), replace(DEFAULT, learning_rate=0.1)
    x = np.column_stack([Candidates.of([slow, fast]).features(SPACE.bounds()), np.zeros((2, 1))])
    for name in ("latency", "cost"):
        assert len(configurator._surrogates[name]._x) == 1  # one config, eight epochs
        mean, var = configurator._surrogates[name].predict(surrogate_inputs(name, x))
        assert mean[0] == mean[1] and var[0] == var[1]
    mean, _ = configurator._surrogates["progress"].predict(surrogate_inputs("progress", x))
    assert mean[0] != pytest.approx(mean[1], abs=1e-6)
    # Scoring answers each (memory, λ, κ/λ, batch size) once for all its learning rates.
    scored, now, steady = _score_whole_grid(configurator, prior, history)
    groups = configurator._latency_groups[1]
    for group in np.unique(groups)[:20]:
        same = np.flatnonzero(groups == group)
        assert np.ptp(scored.lat[same]) == 0 and np.ptp(scored.cost[same]) == 0


def test_memory_moves_no_progress_residual_and_rows_are_scored_once_per_distinct_input() -> None:
    """Epochs that differ in memory alone are repeats of one config to the progress GP
    (memory buys seconds, not updates), so what one memory taught about progress holds
    at every other; the latency GP keeps them apart."""
    # A fifth of the loss an epoch: far more progress than the prior's, a residual to learn.
    configurator, prior, history = _conditioned(
        [(replace(DEFAULT, memory_mb=(512, 1769)[t % 2]), 0.8) for t in range(8)], seed=5
    )
    assert len(configurator._surrogates["progress"]._x) == 1  # one config, eight epochs
    assert len(configurator._surrogates["latency"]._x) == 2
    unseen = replace(DEFAULT, memory_mb=1024)
    x = np.column_stack(
        [Candidates.of([history[0].config, unseen]).features(SPACE.bounds()), np.zeros((2, 1))]
    )
    mean, var = configurator._surrogates["progress"].predict(surrogate_inputs("progress", x))
    assert mean[0] == mean[1] > 0.1 and var[0] == var[1]
    # Scoring predicts each distinct input once: the same as predicting every row.
    scored, now, steady = _score_whole_grid(configurator, prior, history)
    rows = len(configurator._grid)
    every = np.column_stack(
        [configurator._features, np.full((rows, 1), configurator._context_feature(100_000))]
    )
    shift = {
        name: configurator._surrogates[name].predict(surrogate_inputs(name, every))[0]
        for name in ("latency", "cost", "progress")
    }
    np.testing.assert_allclose(scored.lat, now.log_latency + shift["latency"], atol=1e-12)
    np.testing.assert_allclose(scored.cost, now.log_cost + shift["cost"], atol=1e-12)
    steady_cost = steady.log_cost + shift["cost"]
    switching = np.log1p(np.maximum(np.exp(scored.cost - steady_cost) - 1.0, 0.0) / 2)
    expected = steady_cost + switching - steady.log_progress - shift["progress"]
    np.testing.assert_allclose(scored.objective, expected, atol=1e-12)


def test_the_priors_progress_knee_is_the_losses_not_the_windows() -> None:
    """A worker with the same shard, batch size and learning rate progresses alike
    whatever the window; past the knee, halving the batch no longer doubles it."""
    prior = EpochModel.prior()

    def batch_256_over_512(window: int) -> float:
        context = JobContext(window, 8, 10_000, 60.0, None, 10)
        workers = window // 4000  # a shard of 4,000 ratings
        configs = [
            EpochConfig(batch_size=b, learning_rate=0.2, workers=workers, sync_ratio=1.0)
            for b in (256, 512)
        ]
        predicted = prior.predict(Candidates.of(configs), context)
        return float(np.exp(predicted.log_progress[0] - predicted.log_progress[1]))

    assert batch_256_over_512(1_000_000) == pytest.approx(batch_256_over_512(100_000))
    assert batch_256_over_512(1_000_000) < 1.5


def test_a_drop_at_a_switch_of_config_is_the_configs_not_the_phase() -> None:
    """Progress falls to 40 % when the job moves to a config the prior deems as good
    (here another memory size, which nothing fitted can blame), with no phase at all:
    the decay stays near none and the new config's residual shows the loss, where a
    slope across the switch read it as the phase and forgave the config."""
    context = _context(epochs=20)
    prior = EpochModel.prior()
    good, overrated = DEFAULT, replace(DEFAULT, memory_mb=1769)
    rng = np.random.default_rng(7)
    history, loss = [], 1.0
    for t in range(12):
        config = good if t < 6 else overrated
        worth = 1.0 if t < 6 else 0.4
        loss *= 1.0 - 0.1 * worth * math.exp(0.02 * rng.standard_normal())
        history.append(replace(_observe(prior, config, loss, rng), loss=loss))
    fitted = recalibrate(prior, history, context)
    assert fitted.progress.decay > 0.95
    configurator = GpOptConfigurator(DEFAULT, context, GpOptSettings(background=False), SPACE)
    _, residuals, masks = configurator._observations(history, fitted)
    progress = residuals["progress"][masks["progress"]]
    before, after = progress[:5], progress[5:]
    assert float(np.mean(before) - np.mean(after)) == pytest.approx(math.log(2.5), abs=0.1)


def test_a_late_update_is_worth_less_the_further_the_fresh_ones_moved_the_model() -> None:
    """κ/λ ½ against BSP: with many large steps per worker (batch 256 at a learning rate
    of 0.2 on 4,500-rating shards) a straggler's update is worth next to nothing, with a
    few small ones (batch 4,096 at 0.05) nearly the damped half the coordinator gives."""
    curve = EpochModel.prior().progress

    def half_over_full(batch: int, rate: float) -> float:
        configs = [
            EpochConfig(batch_size=batch, learning_rate=rate, workers=4, sync_ratio=r)
            for r in (0.5, 1.0)
        ]
        shape = curve.shape(Candidates.of(configs), 18_000)
        return float(shape[0] / shape[1])

    large, small = half_over_full(256, 0.2), half_over_full(4096, 0.05)
    assert 0.5 <= large < 0.52
    assert small > 0.7
    assert small <= 0.75  # never above the constant half-credit the coordinator's damping gives


def test_what_a_late_update_is_worth_is_learnt_and_carries_to_other_worker_counts() -> None:
    """A job that saw κ/λ ½ progress half as much as ¾ at 4 workers expects ½ to lose
    as much at 16: the stragglers' worth is fitted, not left to the residual GP, whose
    lengthscale in λ kept a lesson at 4 workers from reaching 8."""
    context = _context(epochs=20)
    prior = EpochModel.prior()
    full, half = DEFAULT, replace(DEFAULT, sync_ratio=0.5)  # κ 3 and 2 of 4
    rng = np.random.default_rng(11)
    history, loss = [], 1.0
    for t in range(10):
        config = full if t < 5 else half
        loss *= 1.0 - 0.1 * (1.0 if t < 5 else 0.5) * math.exp(0.02 * rng.standard_normal())
        history.append(replace(_observe(prior, config, loss, rng), loss=loss))
    fitted = recalibrate(prior, history, context)
    assert fitted.progress.late_credit < prior.progress.late_credit

    def half_over_full(model: EpochModel, workers: int) -> float:
        configs = [replace(c, workers=workers) for c in (full, half)]
        predicted = model.predict(Candidates.of(configs), context)
        return float(np.exp(predicted.log_progress[1] - predicted.log_progress[0]))

    assert half_over_full(fitted, 16) < half_over_full(prior, 16) - 0.1
    # Epochs of one κ/λ alone cannot tell: the prior's worth stays.
    assert recalibrate(prior, history[:5], context).progress.late_credit == 0.5


def test_a_fallback_switch_plans_on_the_share_its_own_late_epoch_leaves() -> None:
    """On a deadline no cold epoch meets, the first epoch switches to a config on time
    once warm, knowing it runs late; the config must then hold at the smaller share
    that late epoch leaves to the others, or the job leaves it the next epoch."""
    space = SearchSpace()
    prior = EpochModel.prior()
    grid = space.grid()
    epochs = 10
    probe = JobContext(100_000, 8, 10_000, 1.0, None, epochs, job_id="tight")
    steady = prior.predict(grid, probe, previous=grid)
    share = float(np.quantile(np.exp(steady.log_latency + Z90 * steady.log_latency_sd), 0.1))
    context = replace(probe, latency_cap_s=share * epochs)
    configurator = GpOptConfigurator(DEFAULT, context, GpOptSettings(background=False), space)
    config = configurator.propose(0, [])
    decision = configurator.last_decision
    assert decision is not None and "once warm" in decision.reason
    sd_now = math.log(decision.latency_interval_s[1] / decision.latency_s) / Z95
    late_now = decision.latency_s * math.exp(Z90 * sd_now)
    assert late_now > share
    after = (share * epochs - late_now) / (epochs - 1)
    own = prior.predict(Candidates.of([config]), context, previous=config)
    z = (math.log(after) - own.log_latency[0]) / own.log_latency_sd[0]
    assert z >= Z90 - 1e-9


def _straggling_model() -> EpochModel:
    """A fleet where a fifth of the invocations run 3-5× slower: κ = 4 of 6 is late
    whenever 3 of the 6 straggle, about one epoch in ten, a cliff past the body."""
    worker = DEFAULT_MODEL.replace(straggler_p=0.2, straggler_slowdown=(3.0, 5.0))
    return EpochModel.prior(worker)


CLIFF = EpochConfig(batch_size=1024, learning_rate=0.1, workers=6, sync_ratio=0.625, memory_mb=1024)


def test_the_order_statistics_own_chance_of_meeting_a_deadline_matches_its_draws() -> None:
    """``on_time_scores`` is P(the κ-th of λ worker durations ≤ the deadline), warm and
    cold workers mixed, as a normal score: Monte Carlo of that order statistic agrees
    at deadlines in the body, at the cliff and past it."""
    model, context = _straggling_model(), _context()
    cands = Candidates.of([CLIFF])
    scaled = float(model.shard_work(cands, context, context.train_samples)[0][0])
    rng = np.random.default_rng(0)
    draws = model.slowdowns[rng.integers(len(model.slowdowns), size=(40_000, 6))] * scaled
    cold = rng.random((40_000, 6)) < 2 / 6  # following itself: λ − κ containers busy
    kth = np.sort(draws + cold * model.worker.cold_start_s, axis=1)[:, 3]
    for deadline in np.quantile(kth, [0.5, 0.8, 0.88, 0.93, 0.97]):
        score = model.on_time_scores(cands, context, [CLIFF], np.array([math.log(deadline)]))[0]
        assert float(ndtr(score[0])) == pytest.approx(float(np.mean(kth <= deadline)), abs=0.015)


def test_past_a_straggler_cliff_the_chance_constraint_reads_the_tail_not_a_log_normal() -> None:
    """Between the 90th percentile and the cliff's far side, a log-normal through the
    median and that percentile expects fewer than half the late epochs the order
    statistic has; the configurator's P(on time) is the order statistic's."""
    model, context = _straggling_model(), _context()
    cands = Candidates.of([CLIFF])
    predicted = model.predict(cands, context, previous=CLIFF)
    q90 = math.exp(predicted.log_latency[0] + Z90 * predicted.log_latency_sd[0])
    deadline = 1.3 * q90
    log_normal = float(
        ndtr((math.log(deadline) - predicted.log_latency[0]) / predicted.log_latency_sd[0])
    )
    exact = float(
        ndtr(model.on_time_scores(cands, context, [CLIFF], np.array([math.log(deadline)]))[0][0])
    )
    assert 1 - exact > 2 * (1 - log_normal) > 0.02

    grid = SearchSpace(
        memory_mb=(1024,),
        workers=(6,),
        sync_ratio=(0.625,),
        batch_size=(1024,),
        learning_rate=(0.1,),
    )
    epochs = 10
    configurator = GpOptConfigurator(
        DEFAULT,
        _context(cap=deadline * epochs, epochs=epochs),
        GpOptSettings(background=False, use_gp=False, calibrate=False),
        grid,
        prior=model,
    )
    configurator.propose(1, [Observation(CLIFF, deadline, 1.0, 1e-5, (), 100_000)])
    decision = configurator.last_decision
    assert decision is not None
    assert decision.p_feasible == pytest.approx(exact, abs=0.02)
