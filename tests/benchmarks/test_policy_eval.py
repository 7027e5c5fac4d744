"""The policy evaluation's figures on hand-made runs."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.policy_eval.figures import WINDOWS, incorporation_latency, recovery
from benchmarks.policy_eval.ladder import Ladder
from benchmarks.policy_eval.run import Run, Scenario


def _scenario() -> Scenario:
    times = np.arange(1_000, dtype=float)  # one event a second
    ladder = Ladder(np.zeros((2, 1_000), dtype=np.float32), bootstrap=0, step=500)
    return Scenario(times, 1.0, 1_000, ladder, (400.0,), np.ones(1_000))


def test_incorporation_latency_runs_from_arrival_to_the_swap_that_took_the_event_in() -> None:
    scene = _scenario()
    run = Run(swap_times=[0.0, 600.0], swap_data_ends=[0, 500])
    # events 0-499 wait for the swap at 600 (350.5 s on average), 500-999 for the horizon
    assert incorporation_latency(scene, run) == pytest.approx(300.5)


def test_recovery_needs_five_windows_in_a_row_back_at_095() -> None:
    scene = _scenario()
    accuracy = np.ones(WINDOWS)
    edges = np.linspace(0, 1_000, WINDOWS + 1)
    dip = (edges[:-1] >= 400) & (edges[:-1] < 600)
    accuracy[dip] = 0.8
    accuracy[np.searchsorted(edges, 700)] = 0.9  # a lone dip after the recovery
    assert recovery(scene, accuracy) == pytest.approx(edges[dip.nonzero()[0][-1] + 1] - 400, abs=1)
    assert recovery(scene, np.ones(WINDOWS)) == 0.0
    assert recovery(scene, np.full(WINDOWS, 0.5)) == 600.0


def test_top_k_hits_rank_by_score_serve_unknown_users_by_item_bias_and_miss_unknown_items() -> None:
    from benchmarks.policy_eval.ladder import top_k_hits
    from functions.mf import BiasedMF

    model = BiasedMF(factors=2, seed=0)
    users = [f"u{n % 5}" for n in range(200)]
    items = [f"i{n % 20}" for n in range(200)]
    ratings = np.array([5.0 if n % 20 == 0 else 1.0 for n in range(200)])
    model.fit(users, items, ratings, epochs=20)
    support = np.full(model.n_items, 10)
    liked, disliked = model.item_index["i0"], model.item_index["i1"]
    rows = np.array([0, -1, 0])
    hits = top_k_hits(model, rows, np.array([liked, liked, disliked]), support, k=1)
    assert hits.tolist() == [True, True, False]
    assert not top_k_hits(model, np.array([0]), np.array([model.n_items]), support, k=1)[0]


def test_a_drift_job_on_functions_meets_its_tighter_deadline_with_more_workers() -> None:
    from benchmarks.policy_eval.runtimes import FunctionRuntime, JobModel, PeakVmRuntime
    from functions.pricing import vm_prices

    jobs = JobModel(latency_cap_s=120.0, drift_latency_cap_s=20.0)
    samples = 2e6
    functions = FunctionRuntime(jobs, seed=1)
    assert functions.workers_for(samples, 20.0) > 4 * functions.workers_for(samples)
    scheduled = functions.run(0.0, samples, "cost-aware")
    urgent = functions.run(0.0, samples, "drift")
    assert urgent.finish_s <= 20.0 * 1.5 < scheduled.finish_s <= 120.0 * 1.5
    # The same GB-seconds on more workers: dearer by their overheads, not by multiples.
    assert scheduled.cost_usd < urgent.cost_usd < 2 * scheduled.cost_usd
    # A VM's speed is its capacity's, whatever started the job.
    vm = PeakVmRuntime(jobs, np.full(600, 50.0), vm_prices("c5"))
    assert vm.run(0.0, samples, "drift") == vm.run(0.0, samples, "cost-aware")


def test_reaction_runs_from_each_onset_to_the_first_job_started_after_it() -> None:
    from benchmarks.policy_eval.figures import reaction
    from benchmarks.policy_eval.run import Job

    scene = _scenario()  # one drift at 400 s, horizon 1,000 s
    run = Run(jobs=[Job(s, s + 20, 0, 1.0, 0.0, "drift") for s in (300.0, 450.0, 700.0)])
    assert reaction(scene, run) == 50.0
    assert reaction(scene, Run()) == 600.0  # no job after it: until the horizon


def test_a_job_adds_history_by_the_services_window_rule() -> None:
    from benchmarks.policy_eval.run import replay
    from benchmarks.policy_eval.runtimes import FunctionRuntime, JobModel
    from retrain.policies import make_policy
    from service.settings import Settings

    jobs = JobModel()
    settings = Settings()
    assert jobs.history_sample == settings.history_sample
    assert jobs.drift_history_ratio == settings.drift_window_history_ratio
    # Weighted events (200 true samples each): the window dwarfs the history bound.
    scene = _scenario()
    scene = Scenario(scene.times, 200.0, scene.horizon_s, scene.ladder, (), scene.rates)
    rare = replay(scene, make_policy("periodic", every_events=100_000), FunctionRuntime(jobs, 0))
    often = replay(scene, make_policy("periodic", every_events=20_000), FunctionRuntime(jobs, 0))
    for run in (rare, often):
        first, *rest = run.jobs
        assert first.samples == first.data_end * 200.0  # nothing older than the first window
        expected = [
            (b.data_end - a.data_end) * 200.0 + min(jobs.history_sample, a.data_end * 200.0)
            for a, b in zip(run.jobs, rest, strict=False)
        ]
        assert [job.samples for job in rest] == expected
    # Retraining less often trains less: each job's history is bounded, not a share.
    assert sum(j.samples for j in rare.jobs) < sum(j.samples for j in often.jobs)
    assert rare.cost_usd < often.cost_usd
    # A drift job right after a small window takes at most three older samples per new one.
    assert jobs.history_for("drift", 1_000.0, 1e6) == 3_000.0
    assert jobs.history_for("periodic", 1_000.0, 1e6) == 50_000


def test_serving_errors_take_each_span_between_swaps_from_the_rung_then_serving() -> None:
    from benchmarks.policy_eval.figures import serving_errors

    rng = np.random.default_rng(0)
    table = rng.random((3, 1_000)).astype(np.float32)
    ladder = Ladder(table, bootstrap=100, step=300)
    scene = Scenario(np.arange(1_000, dtype=float), 1.0, 1_000, ladder, (), np.ones(1_000))
    run = Run(swap_times=[100.0, 450.5, 450.5, 800.0], swap_data_ends=[100, 420, 700, 999])
    errors = serving_errors(scene, run)
    serving = np.searchsorted(run.swap_times, scene.times, side="right") - 1  # by event
    rungs = np.array([ladder.rung(end) for end in run.swap_data_ends])[serving[100:]]
    assert np.isnan(errors[:100]).all()
    assert np.array_equal(errors[100:], table[rungs, np.arange(100, 1_000)])


def test_the_ladder_trains_as_fit_does_and_computes_its_errors_when_asked() -> None:
    from benchmarks.policy_eval.ladder import RATING_CLIP, CodedStream, build_ladder
    from functions.mf import BiasedMF

    rng = np.random.default_rng(3)
    users, items = rng.integers(0, 300, 6_000), rng.integers(0, 200, 6_000)
    ratings = rng.integers(1, 11, 6_000) / 2
    ladder = build_ladder(CodedStream(users, items, ratings), bootstrap=1_000, rungs=5, seed=2)
    # The same ladder by BiasedMF.fit on id strings, kept as models.
    ids_u, ids_i = np.array([f"u{c}" for c in users]), np.array([f"i{c}" for c in items])
    model, draws = BiasedMF(factors=16, seed=2), np.random.default_rng(2)
    model.fit(list(ids_u[:1_000]), list(ids_i[:1_000]), ratings[:1_000], 6)
    models = [model.copy()]
    for start in range(1_000, 6_000 - 1_000 + 1, 1_000):
        rows = np.r_[np.arange(start, start + 1_000), draws.integers(0, start, size=1_000)]
        model.fit(list(ids_u[rows]), list(ids_i[rows]), ratings[rows], epochs=3)
        models.append(model.copy())
    assert ladder.step == 1_000 and ladder.hits.shape[0] == len(models) == 6
    for k, rung in enumerate(models):
        u, i = rung.encode_users(list(ids_u)), rung.encode_items(list(ids_i))
        expected = (rung.predict_encoded(u, i, RATING_CLIP) - ratings) ** 2
        np.testing.assert_allclose(ladder.errors[k, :], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(
            ladder.errors[k, 2_000:2_100], ladder.errors[k, :][2_000:2_100]
        )
