"""The worker-kind scenarios of ``driftline bench configurator``: Lambda, GPU containers
or the service's own process, chosen by GP-OPT per job against the oracle's choice.

Each scenario is a job on a window of 10^5, 10^6 or 10^7 ratings with a tight or a loose
deadline, so that either kind can win: GPU containers pay a start-up of a minute and a
half and then train fast, the service's own process starts at once on one core, Lambda
scales out and bills its stragglers. Tight is as in the Lambda scenarios (the 10th
percentile of the Lambda candidates' true 90th-percentile epoch latency, per epoch);
loose is the product's default ``LATENCY_CAP_SECONDS``, 600 s for the job. The truth is
:mod:`benchmarks.gpopt.kinds`. Methods:

* ``gp``: GP-OPT over every kind (35,345 candidates with the default grids);
* ``gp_lambda``: GP-OPT over Lambda alone, at the same deadline;
* ``oracle``: the job's best plan knowing the truth (:class:`KindOracle`), every kind;
* ``oracle_lambda``: the same over Lambda alone.

Reported per scenario (medians over seeds): the kind each method ran most of its
epochs on and how often GP-OPT's matches the oracle's; what the whole job cost, its
ratio to the oracle's on the same seed and, as ``gp_lambda_cost_vs_gp``, what
Lambda-only GP-OPT paid over what GP-OPT paid; the final loss over the oracle's (a job
can be cheap by progressing less); the share of jobs within the deadline and of epochs
past their share (a planned GPU start-up is past it). A kind's start-up is planned over
the job's epochs, so a job is costed whole rather than to an earlier loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from benchmarks.gpopt.kinds import KindOracle, KindTruth, kind_of_job
from benchmarks.gpopt.methods import gp_opt
from benchmarks.gpopt.progress import ProgressTable
from configurator.base import Configurator, JobContext, Observation
from configurator.space import KINDS, Candidates, EpochConfig, SearchSpace

KIND_SIZES = (100_000, 1_000_000, 10_000_000)
KIND_METHODS = ("gp", "gp_lambda", "oracle", "oracle_lambda")
#: Users plus items of the model (as the Lambda scenarios').
MODEL_ROWS = 10_334
DEFAULT = EpochConfig(
    batch_size=1024, learning_rate=0.05, workers=4, sync_ratio=0.75, memory_mb=1024
)


#: The loose scenarios' deadline: ``LATENCY_CAP_SECONDS``' default.
LOOSE_CAP_S = 600.0


@dataclass(frozen=True)
class KindScenario:
    """A window and a deadline: ``tightness`` a quantile of the Lambda candidates'
    latencies (per epoch), or None for ``LOOSE_CAP_S`` for the job."""

    name: str
    samples: int
    tightness: float | None


def kind_scenarios(sizes: tuple[int, ...] = KIND_SIZES) -> list[KindScenario]:
    out = []
    for n in sizes:
        out.append(KindScenario(f"kinds-{_size(n)}-tight", n, 0.1))
        out.append(KindScenario(f"kinds-{_size(n)}-loose", n, None))
    return out


def _size(n: int) -> str:
    return f"1e{round(math.log10(n))}"


@dataclass
class KindRun:
    """One method's job in one kind scenario and seed."""

    configs: list[EpochConfig]
    costs: list[float]
    latencies: list[float]
    losses: list[float]
    violated: list[bool]


class KindJob:
    """A kind scenario's truth, deadline and oracles, shared by its methods."""

    def __init__(
        self, scenario: KindScenario, progress: ProgressTable, space: SearchSpace, epochs: int
    ) -> None:
        self.scenario = scenario
        self.epochs = epochs
        self.lambda_space = replace(space, kinds=("lambda",))
        self.space = replace(space, kinds=KINDS)
        context = JobContext(scenario.samples, 8, MODEL_ROWS, 1.0, None, epochs)
        self.truth = KindTruth(context, progress)
        self.share = LOOSE_CAP_S / epochs
        if scenario.tightness is not None:
            q90 = self.truth.quantile_latency(self.lambda_space.grid(), 0.9)
            self.share = float(np.quantile(q90, scenario.tightness))
        self.context = JobContext(
            scenario.samples, 8, MODEL_ROWS, self.share * epochs, None, epochs, job_id="kinds"
        )
        self.oracles = {
            "oracle": KindOracle(self.space, self.truth, self.share, epochs),
            "oracle_lambda": KindOracle(self.lambda_space, self.truth, self.share, epochs),
        }

    def method(self, name: str) -> Configurator:
        if name in self.oracles:
            return self.oracles[name]
        space = self.space if name == "gp" else self.lambda_space
        return gp_opt(DEFAULT, self.context, space)

    def run(self, method: Configurator, seed: int) -> KindRun:
        history: list[Observation] = []
        out = KindRun([], [], [], [], [])
        loss, fallen = 1.0, 0.0
        first = self.truth.mean_progress(Candidates.of([self.oracles["oracle"].config]))[0]
        reach = self.truth.progress.reach(float(first))
        for t in range(self.epochs):
            left = max(1, self.epochs - len(history))
            spent = sum(o.duration_s for o in history)
            deadline = max(self.context.latency_cap_s - spent, 1e-3) / left
            config = method.propose(t, history)
            rng = np.random.default_rng([seed, t, int(self.scenario.samples), 7])
            phase = self.truth.progress.phase(fallen, reach)
            outcome = self.truth.run(config, history[-1].config if history else None, phase, rng)
            loss *= 1.0 - outcome.progress
            fallen += outcome.progress
            history.append(
                Observation(
                    config,
                    outcome.latency_s,
                    loss,
                    outcome.cost_usd,
                    outcome.workers,
                    self.scenario.samples,
                )
            )
            out.configs.append(config)
            out.costs.append(outcome.cost_usd)
            out.latencies.append(outcome.latency_s)
            out.losses.append(loss)
            out.violated.append(outcome.latency_s > deadline * (1 + 1e-9))
        method.close(history)
        return out


def run_kind_task(
    scenario: KindScenario,
    seeds: tuple[int, ...],
    epochs: int,
    methods: tuple[str, ...],
    space: SearchSpace,
    progress: ProgressTable,
) -> list[tuple[dict[str, KindRun], float]]:
    """Every method on each of ``seeds`` of one kind scenario."""
    job = KindJob(scenario, progress, space, epochs)
    out = []
    for seed in seeds:
        done = {name: job.run(job.method(name), seed) for name in methods}
        out.append((done, job.context.latency_cap_s))
    return out


def kind_figures(results: dict[str, list[tuple[dict[str, KindRun], float]]]) -> dict[str, Any]:
    """Per scenario: kinds chosen, job costs and their ratios, final losses, deadlines
    met (see the module docstring)."""
    out: dict[str, Any] = {}
    for name, jobs in results.items():
        methods = list(jobs[0][0]) if jobs else []
        chosen: dict[str, list[str]] = {m: [] for m in methods}
        costs: dict[str, list[float]] = {m: [] for m in methods}
        vs_oracle: dict[str, list[float]] = {m: [] for m in methods}
        loss_vs: dict[str, list[float]] = {m: [] for m in methods}
        met: dict[str, list[bool]] = {m: [] for m in methods}
        late: dict[str, list[bool]] = {m: [] for m in methods}
        vs_lambda: list[float] = []
        for done, cap in jobs:
            oracle = done["oracle"]
            for m, run in done.items():
                chosen[m].append(kind_of_job(run.configs))
                costs[m].append(sum(run.costs))
                vs_oracle[m].append(sum(run.costs) / sum(oracle.costs))
                loss_vs[m].append(run.losses[-1] / oracle.losses[-1])
                met[m].append(sum(run.latencies) <= cap)
                late[m].extend(run.violated)
            if "gp" in done and "gp_lambda" in done:
                vs_lambda.append(sum(done["gp_lambda"].costs) / sum(done["gp"].costs))
        oracle_kind = chosen["oracle"][0] if chosen.get("oracle") else None
        matches = [k == oracle_kind for k in chosen.get("gp", [])]
        out[name] = {
            "kind_chosen": chosen,
            "oracle_kind": oracle_kind,
            "gp_kind_matches_oracle": float(np.mean(matches)) if matches else None,
            "job_cost_usd": {m: float(np.median(v)) for m, v in costs.items()},
            "cost_vs_oracle": {m: float(np.median(v)) for m, v in vs_oracle.items()},
            "final_loss_vs_oracle": {m: float(np.median(v)) for m, v in loss_vs.items()},
            "gp_lambda_cost_vs_gp": float(np.median(vs_lambda)) if vs_lambda else None,
            "deadline_met": {m: float(np.mean(v)) for m, v in met.items()},
            "late": {m: float(np.mean(v)) for m, v in late.items()},
        }
    return out


__all__ = [
    "KIND_METHODS",
    "KIND_SIZES",
    "KindJob",
    "KindRun",
    "KindScenario",
    "kind_figures",
    "kind_scenarios",
    "run_kind_task",
]
