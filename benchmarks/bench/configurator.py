"""``driftline bench configurator``: GP-OPT against its baselines on the same truth.

Each scenario is a retraining job: a window of 10k, 100k or 1M ratings (MovieLens-sized
model), a tight or a loose deadline, a cold start or a warm one (a previous job's
observations and hyper-parameters in the store), and one job whose window jumps from
100k to 1M ratings half-way. Every method runs every scenario for ``seeds`` seeds of
``epochs`` epochs against the ground truth of :mod:`benchmarks.gpopt.truth` (epoch
noise drawn from a generator seeded by scenario, seed and epoch, so methods meet the
same luck). The deadline share of an epoch is ``LATENCY_CAP_SECONDS / max_epochs``:
tight is the 10th and loose the 50th percentile of the candidates' true 90th-percentile
epoch latency, so a tenth or half of the space is feasible. An epoch's progress shrinks
with the loss the job has already shed (:meth:`ProgressTable.phase`), not with the
epochs it has run: a job that explored early is behind, as a real one is, and catches
up as it nears the same floor.

Six more scenarios choose the worker kind (Lambda, GPU containers, the service's own
process) on windows of 10^5 to 10^7 ratings; they and their figures (``kinds``) are
:mod:`benchmarks.bench.configurator_kinds`'. ``--quick`` runs everything smaller
(:func:`run_configurator`), with a progress bar.

Reported, medians over seeds and scenarios (spreads as 25th-75th percentiles):

* ``regret.<method>.<k>``: the k-th decision's true cost per progress over the feasible
  optimum's, minus one (at least 0: a pick cheaper than the optimum is infeasible, and
  counted in ``violations`` when it runs late);
* ``violations.<method>``: the share of epochs longer than the deadline share the
  method was given; ``violations_by_epoch.<method>.<epochs>``: the same share among a
  job's first epoch, its 2nd-5th, 6th-10th, 11th-20th and later ones (a job's first
  epochs are decided on the uncalibrated prior, its later ones on its own records);
* ``job_cost_usd.<method>`` and ``cost_vs_oracle.<method>``: what a job costs until its
  loss reaches what the oracle's reaches in ``target_epochs`` epochs (a job that never
  gets there is charged all its epochs and counted in ``target_missed``), and its ratio
  to the oracle's; ``deadline_met.<method>``: the share of jobs that got there within
  ``LATENCY_CAP_SECONDS``;
* ``cost_vs_static.<method>``: the same cost over the static default's on the same job
  (which seldom gets there: it is charged all its epochs); ``cost_vs_static_same_loss``:
  what the method spends until its loss reaches the static default's final one, over
  what the static default spent for it (None when most jobs never get there), and
  ``gp_saving_vs_static``/``_same_loss``: GP-OPT's saving, one minus those ratios;
* ``epochs_to_10pct`` and ``epochs_to_5pct``: the first epoch from which the regret
  stays at or below 10 % / 5 %;
* ``latency_error_median`` and ``interval_coverage``: GP-OPT's latency prediction error
  after 10 epochs and how often the observed latency lay in its 90 % interval;
* ``decision_ms_p50``/``_p99``/``_max``: ``propose()`` with 200 observations and 5,000
  candidates (after pruning), over ``decisions_timed`` decisions, next to
  ``naive_decision_ms_p99``: the same GPs predicted by exact gpytorch (a full
  posterior, prediction caches rebuilt every call);
* ``regret_plot``: a PNG of median regret against epochs per method.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from benchmarks.bench.configurator_kinds import (
    KIND_METHODS,
    KIND_SIZES,
    KindRun,
    KindScenario,
    kind_figures,
    kind_scenarios,
    run_kind_task,
)
from benchmarks.gpopt.methods import (
    CherryPickConfigurator,
    GridConfigurator,
    OracleConfigurator,
    RandomConfigurator,
    SklearnSurrogate,
    gp_opt,
    static,
)
from benchmarks.gpopt.progress import ProgressTable, measure_progress
from benchmarks.gpopt.truth import Truth
from configurator.base import Configurator, JobContext, Observation
from configurator.history import History
from configurator.space import KINDS, Candidates, EpochConfig, SearchSpace

log = logging.getLogger(__name__)

METHODS = (
    "gp",
    "random",
    "grid",
    "static",
    "analytic",
    "analytic_calibrated",
    "cherrypick",
    "sklearn_gp",
    "oracle",
)
#: Methods that read earlier jobs' observations: the only ones a warm start changes.
WARM_METHODS = ("gp", "sklearn_gp")
REPORTED_EPOCHS = (1, 3, 5, 10, 15, 20, 50)
#: The stretches of a job ``violations_by_epoch`` reports the late share of, by their
#: 1-based first and last epochs (None: to the job's end).
EPOCH_STRETCHES: dict[str, tuple[int, int | None]] = {
    "1": (1, 1),
    "2-5": (2, 5),
    "6-10": (6, 10),
    "11-20": (11, 20),
    "21+": (21, None),
}
SIZES = (10_000, 100_000, 1_000_000)
#: Users plus items of the model: MovieLens-latest-small's 610 users and 9,724 items.
MODEL_ROWS = 10_334
DEFAULT = EpochConfig(
    batch_size=1024, learning_rate=0.05, workers=4, sync_ratio=0.75, memory_mb=1024
)


@dataclass(frozen=True)
class Scenario:
    name: str
    samples: int
    tightness: float
    warm: bool = False
    jump_to: int | None = None


def scenarios(sizes: tuple[int, ...] = SIZES) -> list[Scenario]:
    if not sizes:
        return []
    out = []
    for n in sizes:
        for label, q in (("tight", 0.1), ("loose", 0.5)):
            out.append(Scenario(f"{_size(n)}-{label}-cold", n, q))
    middle = sizes[len(sizes) // 2]
    for label, q in (("tight", 0.1), ("loose", 0.5)):
        out.append(Scenario(f"{_size(middle)}-{label}-warm", middle, q, warm=True))
    out.append(Scenario(f"jump-{_size(middle)}-{_size(sizes[-1])}", middle, 0.5, jump_to=sizes[-1]))
    return out


def noise_key(scenario: Scenario) -> int:
    """The scenario's part of every epoch's noise seed, the same in every process
    (``hash`` of a string is salted per process, which made runs of the same seeds
    differ)."""
    return zlib.crc32(scenario.name.encode())


def _size(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


class MemoryStore:
    """An in-memory blob store for the warm start's history."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> None:
        self.blobs[key] = data

    def get(self, key: str) -> bytes:
        return self.blobs[key]

    def list(self, prefix: str) -> list[str]:
        return [k for k in self.blobs if k.startswith(prefix)]

    def delete(self, key: str) -> None:
        self.blobs.pop(key, None)


@dataclass
class Run:
    """One method's job in one scenario and seed."""

    regret: list[float]
    violated: list[bool]
    costs: list[float]
    latencies: list[float]
    losses: list[float]
    predicted: list[tuple[float, float, float] | None]


class Job:
    """A scenario's truth, deadline and oracle, shared by its methods."""

    def __init__(
        self, scenario: Scenario, progress: ProgressTable, space: SearchSpace, epochs: int
    ) -> None:
        self.scenario = scenario
        self.space = space
        self.epochs = epochs
        self.grid = space.grid()
        context = JobContext(scenario.samples, 8, MODEL_ROWS, 1.0, None, epochs)
        self.truth = Truth(context, progress)
        self.jumped = self.truth.with_samples(scenario.jump_to) if scenario.jump_to else None
        q90 = self.truth.quantile_latency(self.grid, 0.9)
        self.share = float(np.quantile(q90, scenario.tightness))
        self.context = JobContext(
            scenario.samples, 8, MODEL_ROWS, self.share * epochs, None, epochs, job_id="bench"
        )
        self.oracle = OracleConfigurator(space, self.truth_at, lambda t: self.share)
        self._best = {}
        for which in {self.truth_at(0), self.truth_at(epochs - 1)}:
            row = self.oracle.best_row(0 if which is self.truth else epochs - 1)
            self._best[id(which)] = float(which.objective(self.grid.take(np.array([row])))[0])
        first = self.grid.take(np.array([self.oracle.best_row(0)]))
        self.reach = progress.reach(float(self.truth.mean_progress(first)[0]))

    def shortened(self, epochs: int, job_id: str) -> Job:
        """The same job (truth, deadline share, oracle) run for fewer epochs: a previous
        job of a warm start, without computing the truth's quantiles again."""
        out = copy.copy(self)
        out.epochs = epochs
        out.context = replace(
            self.context, latency_cap_s=self.share * epochs, max_epochs=epochs, job_id=job_id
        )
        return out

    def truth_at(self, epoch: int) -> Truth:
        if self.jumped is not None and epoch >= self.epochs // 2:
            return self.jumped
        return self.truth

    def regret(self, config: EpochConfig, epoch: int) -> float:
        truth = self.truth_at(epoch)
        value = float(truth.objective(Candidates.of([config]))[0])
        return max(0.0, value / self._best[id(truth)] - 1.0)

    def deadline_for(self, history: list[Observation]) -> float:
        left = max(1, self.epochs - len(history))
        return max(self.context.latency_cap_s - sum(o.duration_s for o in history), 1e-3) / left

    def run(self, method: Configurator, seed: int) -> Run:
        history: list[Observation] = []
        out = Run([], [], [], [], [], [])
        loss, fallen = 1.0, 0.0
        for t in range(self.epochs):
            deadline = self.deadline_for(history)
            config = method.propose(t, history)
            decision = getattr(method, "last_decision", None)
            truth = self.truth_at(t)
            rng = np.random.default_rng([seed, t, noise_key(self.scenario)])
            phase = truth.progress.phase(fallen, self.reach)
            outcome = truth.run(config, history[-1].config if history else None, phase, rng)
            loss *= 1.0 - outcome.progress
            fallen += outcome.progress
            samples = truth.context.train_samples
            history.append(
                Observation(
                    config, outcome.latency_s, loss, outcome.cost_usd, outcome.workers, samples
                )
            )
            out.regret.append(self.regret(config, t))
            out.violated.append(outcome.latency_s > deadline * (1 + 1e-9))
            out.costs.append(outcome.cost_usd)
            out.latencies.append(outcome.latency_s)
            out.losses.append(loss)
            out.predicted.append(
                (decision.latency_s, *decision.latency_interval_s) if decision is not None else None
            )
        method.close(history)
        return out


def _methods(job: Job, seed: int, history: History | None) -> dict[str, Callable[[], Configurator]]:
    space, context = job.space, job.context
    deadline = lambda t: job.share  # noqa: E731 - the nominal share, as the oracle's
    return {
        "gp": lambda: gp_opt(DEFAULT, context, space, history),
        "random": lambda: RandomConfigurator(space, seed),
        "grid": lambda: GridConfigurator(space, seed, deadline),
        "static": lambda: static(DEFAULT),
        "analytic": lambda: gp_opt(DEFAULT, context, space, use_gp=False, calibrate=False),
        "analytic_calibrated": lambda: gp_opt(DEFAULT, context, space, use_gp=False),
        "cherrypick": lambda: CherryPickConfigurator(space, context, seed, deadline),
        "sklearn_gp": lambda: gp_opt(DEFAULT, context, space, history, surrogates=SklearnSurrogate),
        "oracle": lambda: job.oracle,
    }


def _warm_history(job: Job, seed: int, surrogate: str) -> History:
    """A previous job's observations (another seed, fewer epochs), kept in a store."""
    store = MemoryStore()
    history = History(store)
    previous = job.shortened(min(job.epochs, 15), "prev-1")
    extra = {"surrogates": SklearnSurrogate} if surrogate == "sklearn_gp" else {}
    method = gp_opt(DEFAULT, previous.context, job.space, history, **extra)
    previous.run(method, seed + 10_000)
    return History(store)


def _first_below(regret: list[float], level: float) -> int | None:
    """1-based epoch from which the regret stays at or below ``level``."""
    above = [i for i, r in enumerate(regret) if r > level + 1e-12]
    first = (above[-1] + 1) if above else 0
    return first + 1 if first < len(regret) else None


def _cost_to_target(run: Run, target: float) -> tuple[float, float, bool]:
    for i, loss in enumerate(run.losses):
        if loss <= target:
            return sum(run.costs[: i + 1]), sum(run.latencies[: i + 1]), True
    return sum(run.costs), sum(run.latencies), False


def run_configurator(
    dataset: Path | None = None,
    limit: int | None = None,
    batch_size: int = 500,
    seeds: int | None = None,
    epochs: int | None = None,
    target_epochs: int = 20,
    sizes: tuple[int, ...] = SIZES,
    methods: tuple[str, ...] | None = None,
    space: SearchSpace | None = None,
    progress: ProgressTable | None = None,
    decision_timing: bool | None = None,
    plot: Path | None = None,
    processes: int | None = None,
    quick: bool = False,
    kind_sizes: tuple[int, ...] | None = KIND_SIZES,
    show_progress: bool | None = None,
) -> dict[str, Any]:
    """Run the benchmark; returns its figures (see the module docstring).

    Seeds run on ``processes`` processes (default: one per core), a scenario's truth
    built once per task. ``quick`` (``--quick``) is a first look in a few minutes on two
    cores: ``QUICK`` seeds and epochs, the methods of ``QUICK_METHODS``, loss progress
    measured on a small window (``QUICK_PROGRESS``), no decision timing; flags given
    explicitly still apply. ``kind_sizes`` are the windows of the worker-kind scenarios
    (:mod:`benchmarks.bench.configurator_kinds`; None: none). A progress bar goes to
    the standard error while it runs (``show_progress``; by default when it is a
    terminal).

    BLAS and torch run on one thread each: on a small shared machine their thread pools
    spin against each other and slow every GP fit many times over.
    """
    import torch
    from threadpoolctl import threadpool_limits

    plan = _Plan.of(quick, seeds, epochs, methods, decision_timing)
    torch.set_num_threads(1)
    with threadpool_limits(1), _progress_bar(show_progress) as bar:
        return _run(
            plan.seeds,
            plan.epochs,
            target_epochs,
            sizes,
            plan.methods,
            space,
            progress or (_quick_progress(space, bar) if quick else None),
            plan.decision_timing,
            plot,
            processes,
            kind_sizes,
            bar,
        )


#: ``--quick``: seeds and epochs per job, and the methods run.
QUICK = (1, 15)
QUICK_METHODS = ("gp", "analytic_calibrated", "static", "oracle")
#: ``--quick``'s loss-progress measurement: a window, worker counts and sync ratios.
QUICK_PROGRESS = (10_000, (8,), (0.5, 0.75, 1.0))


@dataclass(frozen=True)
class _Plan:
    """Seeds, epochs, methods and decision timing: the given ones, else the defaults or
    ``--quick``'s."""

    seeds: int
    epochs: int
    methods: tuple[str, ...]
    decision_timing: bool

    @classmethod
    def of(
        cls,
        quick: bool,
        seeds: int | None,
        epochs: int | None,
        methods: tuple[str, ...] | None,
        decision_timing: bool | None,
    ) -> _Plan:
        if quick:
            return cls(
                seeds or QUICK[0],
                epochs or QUICK[1],
                methods or QUICK_METHODS,
                bool(decision_timing),
            )
        return cls(seeds or 30, epochs or 50, methods or METHODS, decision_timing is not False)


def _quick_progress(space: SearchSpace | None, bar: _Bar) -> ProgressTable:
    window, workers, ratios = QUICK_PROGRESS
    with bar.stage(f"measuring loss progress on a {window:,}-rating window"):
        return measure_progress(
            space or SearchSpace(), window=window, workers=workers, ratios=ratios
        )


def _run(
    seeds: int,
    epochs: int,
    target_epochs: int,
    sizes: tuple[int, ...],
    methods: tuple[str, ...],
    space: SearchSpace | None,
    progress: ProgressTable | None,
    decision_timing: bool,
    plot: Path | None,
    processes: int | None = None,
    kind_sizes: tuple[int, ...] | None = None,
    bar: _Bar | None = None,
) -> dict[str, Any]:
    bar = bar or _Bar(None)
    space = space or SearchSpace()
    started = time.perf_counter()
    if progress is None:
        with bar.stage("measuring loss progress with the real worker"):
            progress = measure_progress(space)
    runs: dict[str, list[tuple[Scenario, Run]]] = {m: [] for m in methods}
    ledger = _Ledger(methods, min(target_epochs, epochs))
    parts = _parts(len(scenarios(sizes)) + len(kind_scenarios(kind_sizes or ())), processes)
    tasks: list[_Task | _KindTask] = [
        _Task(scenario, chunk, epochs, methods, space, progress)
        for scenario in scenarios(sizes)
        for chunk in _chunks(range(seeds), parts)
    ]
    tasks += [
        _KindTask(scenario, chunk, epochs, KIND_METHODS, space, progress)
        for scenario in kind_scenarios(kind_sizes or ())
        for chunk in _chunks(range(seeds), parts)
    ]
    kinds: dict[str, list[tuple[dict[str, KindRun], float]]] = {}
    with bar.stage(f"{len(tasks)} jobs of {seeds} seeds × {epochs} epochs", total=len(tasks)):
        for task, results in zip(tasks, _map(_run_any, tasks, processes, bar), strict=True):
            if isinstance(task, _KindTask):
                kinds.setdefault(task.scenario.name, []).extend(results)
                continue
            for done, cap in results:
                for name, run in done.items():
                    if name in runs:
                        runs[name].append((task.scenario, run))
                ledger.add(done, cap)
            log.info(
                "%s seeds %s done after %.0f s",
                task.scenario.name,
                task.seeds,
                time.perf_counter() - started,
            )
    figures = _report(runs, methods, epochs)
    figures.update(ledger.figures())
    figures.update(
        {
            "candidates": len(space),
            "seeds": seeds,
            "epochs": epochs,
            "scenarios": [s.name for s in scenarios(sizes)],
            "progress_decay": progress.decay,
            "progress_noise_sd": progress.noise_sd,
        }
    )
    if kinds:
        figures["kinds"] = kind_figures(kinds)
        figures["kind_candidates"] = len(replace(space, kinds=KINDS))
    if "gp" in methods:
        figures.update(_prediction_quality(runs["gp"]))
    if decision_timing:
        with bar.stage("timing decisions"):
            figures.update(decision_times(space))
    if plot is not None:
        figures["regret_plot"] = str(_plot(figures, methods, epochs, plot))
    figures["bench_seconds"] = time.perf_counter() - started
    return figures


class _Ledger:
    """What each method's jobs cost, paired job by job with the oracle's and the static
    default's on the same scenario and seed (warm scenarios run no static default)."""

    def __init__(self, methods: tuple[str, ...], target_epoch: int) -> None:
        self.methods = methods
        self.target_epoch = target_epoch
        self.missed: dict[str, int] = dict.fromkeys(methods, 0)
        self.costs: dict[str, list[float]] = {m: [] for m in methods}
        self.vs_oracle: dict[str, list[float]] = {m: [] for m in methods}
        self.met: dict[str, list[bool]] = {m: [] for m in methods}
        self.vs_static: dict[str, list[float]] = {m: [] for m in methods}
        self.same_loss: dict[str, list[float]] = {m: [] for m in methods}

    def add(self, done: dict[str, Run], cap: float) -> None:
        oracle = done["oracle"]
        target = oracle.losses[self.target_epoch - 1]
        oracle_cost, _, _ = _cost_to_target(oracle, target)
        static = done.get("static")
        static_cost = _cost_to_target(static, target)[0] if static is not None else math.nan
        for name, run in done.items():
            if name not in self.methods:
                continue
            cost, latency, reached = _cost_to_target(run, target)
            self.missed[name] += not reached
            self.costs[name].append(cost)
            self.vs_oracle[name].append(cost / oracle_cost)
            self.met[name].append(reached and latency <= cap)
            if static is not None:
                self.vs_static[name].append(cost / static_cost)
                matched, _, matched_ok = _cost_to_target(run, static.losses[-1])
                self.same_loss[name].append(matched / sum(static.costs) if matched_ok else math.inf)

    def figures(self) -> dict[str, Any]:
        return {
            "job_cost_usd": {m: _median(v) for m, v in self.costs.items()},
            "cost_vs_oracle": {m: _median(v) for m, v in self.vs_oracle.items()},
            "cost_vs_oracle_spread": {m: _spread(v) for m, v in self.vs_oracle.items()},
            "deadline_met": {m: float(np.mean(v)) if v else None for m, v in self.met.items()},
            "target_missed": self.missed,
            "cost_vs_static": {m: _median(v) for m, v in self.vs_static.items()},
            "cost_vs_static_same_loss": {m: _median_of_all(v) for m, v in self.same_loss.items()},
            "gp_saving_vs_static": _saving(self.vs_static.get("gp")),
            "gp_saving_vs_static_same_loss": _saving(self.same_loss.get("gp")),
        }


def _saving(ratios: list[float] | None) -> float | None:
    median = _median_of_all(ratios or [])
    return None if median is None else 1.0 - median


def _median_of_all(values: list[float]) -> float | None:
    """The median counting every value, a job that never got there (inf) included."""
    if not values:
        return None
    value = float(np.median(values))
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class _Task:
    """Some seeds of one scenario: what one process runs (the scenario's truth is built
    once per task)."""

    scenario: Scenario
    seeds: tuple[int, ...]
    epochs: int
    methods: tuple[str, ...]
    space: SearchSpace
    progress: ProgressTable


@dataclass(frozen=True)
class _KindTask:
    """Some seeds of one worker-kind scenario."""

    scenario: KindScenario
    seeds: tuple[int, ...]
    epochs: int
    methods: tuple[str, ...]
    space: SearchSpace
    progress: ProgressTable


def _run_any(task: _Task | _KindTask) -> list[tuple[Any, float]]:
    """A task of either kind, torch and BLAS on one thread."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    with threadpool_limits(1):
        if isinstance(task, _KindTask):
            return list(
                run_kind_task(
                    task.scenario, task.seeds, task.epochs, task.methods, task.space, task.progress
                )
            )
        return list(_run_task(task))


def _run_task(task: _Task) -> list[tuple[dict[str, Run], float]]:
    """Every method (and the oracle, the yardstick) on each of the task's seeds."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    with threadpool_limits(1):
        job = Job(task.scenario, task.progress, task.space, task.epochs)
        out = []
        for seed in task.seeds:
            done: dict[str, Run] = {}
            for name in (*[m for m in task.methods if m != "oracle"], "oracle"):
                if task.scenario.warm and name not in WARM_METHODS and name != "oracle":
                    continue  # identical to its cold run
                warm = task.scenario.warm and name in WARM_METHODS
                history = _warm_history(job, seed, name) if warm else None
                done[name] = job.run(_methods(job, seed, history)[name](), seed)
            out.append((done, job.context.latency_cap_s))
        return out


def _processes() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def _parts(scenario_count: int, processes: int | None) -> int:
    """Seed chunks per scenario: enough tasks for every process, no more (each task
    builds its scenario's truth, seconds of work)."""
    workers = processes or _processes()
    return max(1, math.ceil(workers / max(scenario_count, 1)))


def _chunks(seeds: range, parts: int) -> list[tuple[int, ...]]:
    parts = max(1, min(parts, len(seeds)))
    return [tuple(seeds[i::parts]) for i in range(parts)]


T = TypeVar("T")
R = TypeVar("R")


def _map(
    fn: Callable[[T], R], tasks: list[T], processes: int | None, bar: _Bar | None = None
) -> list[R]:
    """``fn`` over ``tasks`` on a pool of processes (in this one when there is one core),
    the bar advanced as each task ends."""
    bar = bar or _Bar(None)
    workers = min(processes or _processes(), len(tasks))
    if workers <= 1:
        out = []
        for task in tasks:
            out.append(fn(task))
            bar.advance()
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(fn, task): k for k, task in enumerate(tasks)}
        results: dict[int, R] = {}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            bar.advance()
    return [results[k] for k in range(len(tasks))]


class _Bar:
    """Progress on the standard error: a rich bar (``progress``), a line per stage and
    per job done where the standard error is no terminal (``plain``), or nothing."""

    def __init__(self, progress: Any, plain: bool = False) -> None:
        self._progress = progress
        self._plain = plain
        self._task: Any = None
        self._stage: tuple[str, int | None, float, int] | None = None

    @contextmanager
    def stage(self, what: str, total: int | None = None) -> Iterator[None]:
        started = time.perf_counter()
        if self._plain:
            self._stage = (what, total, started, 0)
            self._say(f"{what} ...")
        if self._progress is None:
            yield
            if self._plain:
                self._say(f"{what}: done in {time.perf_counter() - started:.0f} s")
            return
        self._task = self._progress.add_task(what, total=total)
        try:
            yield
        finally:
            self._progress.update(self._task, completed=total or 1, total=total or 1)
            self._task = None

    def advance(self) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task)
        if self._plain and self._stage is not None:
            what, total, started, done = self._stage
            self._stage = (what, total, started, done + 1)
            self._say(f"{what}: {done + 1}/{total} after {time.perf_counter() - started:.0f} s")

    @staticmethod
    def _say(line: str) -> None:
        import sys

        print(f"bench configurator: {line}", file=sys.stderr, flush=True)


@contextmanager
def _progress_bar(show: bool | None) -> Iterator[_Bar]:
    """A :class:`_Bar` on the standard error, so that ``--json`` output stays one object:
    a rich bar when ``show`` (None: when the standard error is a terminal; a line per
    stage and job otherwise), nothing when ``show`` is False."""
    import sys

    if show is None and not sys.stderr.isatty():
        yield _Bar(None, plain=True)
        return
    if not show and show is not None:
        yield _Bar(None)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        yield _Bar(progress)


def _median(values: list[float]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.median(finite)) if finite else None


def _median_epoch(firsts: list[int | None]) -> float | None:
    """Median epoch from which the regret stays low; a run that never gets there counts
    as never (None when that is the median)."""
    return _median_of_all([math.inf if f is None else float(f) for f in firsts])


def _spread(values: list[float]) -> list[float] | None:
    finite = [v for v in values if math.isfinite(v)]
    return [float(np.quantile(finite, 0.25)), float(np.quantile(finite, 0.75))] if finite else None


def _report(
    runs: dict[str, list[tuple[Scenario, Run]]], methods: tuple[str, ...], epochs: int
) -> dict[str, Any]:
    regret: dict[str, dict[str, float | None]] = {}
    spread: dict[str, dict[str, list[float] | None]] = {}
    curve: dict[str, list[float | None]] = {}
    violations: dict[str, float] = {}
    by_epoch: dict[str, dict[str, float]] = {}
    to10: dict[str, float | None] = {}
    to5: dict[str, float | None] = {}
    for name in methods:
        done = [r for _, r in runs[name]]
        if not done:
            continue
        matrix = np.array([r.regret for r in done])
        curve[name] = [float(np.median(matrix[:, k])) for k in range(matrix.shape[1])]
        regret[name] = {str(k): curve[name][k - 1] for k in REPORTED_EPOCHS if k <= epochs}
        spread[name] = {
            str(k): [float(np.quantile(matrix[:, k - 1], q)) for q in (0.25, 0.75)]
            for k in REPORTED_EPOCHS
            if k <= epochs
        }
        violations[name] = float(np.mean([v for r in done for v in r.violated]))
        by_epoch[name] = _violations_by_epoch(done)
        firsts10 = [_first_below(r.regret, 0.10) for r in done]
        firsts5 = [_first_below(r.regret, 0.05) for r in done]
        to10[name] = _median_epoch(firsts10)
        to5[name] = _median_epoch(firsts5)
    return {
        "regret": regret,
        "regret_spread": spread,
        "regret_curve": curve,
        "violations": violations,
        "violations_by_epoch": by_epoch,
        "epochs_to_10pct": to10,
        "epochs_to_5pct": to5,
    }


def _violations_by_epoch(runs: list[Run]) -> dict[str, float]:
    """The late share in each of ``EPOCH_STRETCHES`` the runs reached."""
    out = {}
    for label, (first, last) in EPOCH_STRETCHES.items():
        late = [v for r in runs for v in r.violated[first - 1 : last]]
        if late:
            out[label] = float(np.mean(late))
    return out


def _prediction_quality(runs: list[tuple[Scenario, Run]]) -> dict[str, Any]:
    errors, inside = [], []
    for _, run in runs:
        for t, (observed, predicted) in enumerate(zip(run.latencies, run.predicted, strict=True)):
            if predicted is None:
                continue
            mean, low, high = predicted
            inside.append(low <= observed <= high)
            if t >= 10:
                errors.append(abs(mean - observed) / observed)
    return {
        "latency_error_median": _median(errors),
        "interval_coverage": float(np.mean(inside)) if inside else None,
    }


def decision_times(
    space: SearchSpace, observations: int = 200, candidates: int = 5000, repeats: int = 200
) -> dict[str, Any]:
    """``propose()`` with ``observations`` epochs observed and ``candidates`` kept after
    pruning, against exact gpytorch prediction without caching on the same data.

    ``repeats`` decisions are timed: the 99th percentile of thirty is their slowest, and
    one stall of a shared machine sets it; of two hundred it is the third slowest, which
    the slowest, reported beside it, shows apart."""
    import torch

    from configurator.gp import OUTPUTS, surrogate_inputs

    context = JobContext(100_000, 8, MODEL_ROWS, 1e6, None, observations + repeats + 1, job_id="t")
    method = gp_opt(DEFAULT, context, space, keep=candidates)
    rng = np.random.default_rng(0)
    grid = space.grid()
    history: list[Observation] = []
    loss = 1.0
    for _ in range(observations):
        config = grid.config(int(rng.integers(len(grid))))
        loss *= 0.99
        history.append(
            Observation(
                config,
                float(rng.uniform(0.1, 2.0)),
                loss,
                float(rng.uniform(1e-6, 1e-4)),
                (),
                100_000,
            )
        )
    method.propose(observations, history)  # fits the hyper-parameters once
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        method.propose(observations, history)
        times.append((time.perf_counter() - t0) * 1000)
    x, residuals, masks = method._observations(history, method._model)
    rows = grid.features(space.bounds())[:candidates]
    features = np.column_stack([rows, np.zeros((len(rows), 1))])
    naive = []
    for _ in range(max(3, min(repeats // 6, 5))):
        t0 = time.perf_counter()
        for name in OUTPUTS:
            surrogate = method._surrogates[name]
            inputs = surrogate_inputs(name, x[masks[name]])
            gp = surrogate.build_model(inputs, residuals[name][masks[name]])  # type: ignore[attr-defined]
            gp.eval()
            with torch.no_grad():
                posterior = gp(torch.as_tensor(surrogate_inputs(name, features)))
                posterior.mean.numpy(), posterior.covariance_matrix.diagonal().numpy()
        naive.append((time.perf_counter() - t0) * 1000)
    kept = method.last_decision.extra.get("scored") if method.last_decision else None
    return {
        "decision_ms_p50": float(np.percentile(times, 50)),
        "decision_ms_p99": float(np.percentile(times, 99)),
        "decision_ms_max": float(np.max(times)),
        "decisions_timed": repeats,
        "naive_decision_ms_p99": float(np.percentile(naive, 99)),
        "decision_observations": observations,
        "decision_candidates_scored": kept,
    }


def _plot(figures: dict[str, Any], methods: tuple[str, ...], epochs: int, path: Path) -> Path:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in methods:
        curve = figures["regret_curve"].get(name)
        if curve:
            ax.plot(range(1, len(curve) + 1), [max(c, 1e-4) for c in curve], label=name)
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("median regret (cost per progress over the optimum's, − 1)")
    ax.axhline(0.10, color="grey", lw=0.5, ls="--")
    ax.axhline(0.05, color="grey", lw=0.5, ls=":")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["run_configurator", "scenarios", "decision_times"]
