"""``driftline bench sync``: BSP vs ASP vs selective synchronisation, same window.

Matrix factorisation on a window of MovieLens. First λ = 8 workers on the ``local``
runtime (real worker processes that behave and bill like Lambda) with seeded straggler
injection: each invocation, with probability 0.2, runs 3–5× slower. The target training
loss is what BSP reaches after ``target_epochs`` epochs; every policy then trains from
the same starting model until it reaches that loss, and the time to get there is
compared. The local runtime starts with ``PROVISIONED`` warm containers per worker
(Lambda's provisioned concurrency), so that the comparison is of the policies and not
of how many containers each happens to start on a two-core machine.

Then the same at λ = 64 and 256 on the ``sim`` runtime: the coordinator and the workers'
updates are the real ones (the runtime executes the worker in this process), the
workers' durations come from the calibrated performance model with the same straggler
distribution, and the coordinator's own time (reading updates, averaging, writing
snapshots) is measured and added to virtual time. Each λ has its own target: BSP's loss
after ``target_epochs`` epochs at that λ.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.datasets.registry import open_ratings
from configurator.space import EpochConfig
from functions.handler import handler
from functions.mf import BiasedMF
from functions.objectstore import FileObjectStore
from functions.performance import DEFAULT_MODEL
from functions.runtimes import LocalRuntime, Runtime
from functions.runtimes.sim import SimRuntime
from retrain.coordinator import DistributedBackend
from retrain.sync import SyncPolicy
from retrain.window import RatingsWindow

SIMULATED_WORKERS = (64, 256)
STRAGGLER_PROBABILITY = 0.2
STRAGGLER_SLOWDOWN = (3.0, 5.0)
SELECTIVE_RATIO = 0.75
#: Warm containers per worker the local runtime starts before the clock starts.
PROVISIONED = 3
POLICIES = {
    "bsp": SyncPolicy.bsp(),
    "asp": SyncPolicy.asp(),
    "selective": SyncPolicy.selective(SELECTIVE_RATIO),
}

#: Opens a runtime for λ workers; yields it with a clock reading its seconds.
RuntimeFactory = Callable[[int], Any]


def _straggler(seed: int) -> Callable[[], float]:
    rng = np.random.default_rng(seed)

    def slowdown() -> float:
        if rng.random() < STRAGGLER_PROBABILITY:
            return float(rng.uniform(*STRAGGLER_SLOWDOWN))
        return 1.0

    return slowdown


@contextmanager
def _local(workers: int) -> Iterator[tuple[Runtime, Callable[[], float]]]:
    runtime = LocalRuntime(concurrency=4 * workers, slowdown=_straggler(seed=7))
    with runtime:
        runtime.provision(1024, PROVISIONED * workers)
        yield runtime, time.perf_counter


@contextmanager
def _simulated(workers: int) -> Iterator[tuple[Runtime, Callable[[], float]]]:
    model = DEFAULT_MODEL.replace(
        straggler_p=STRAGGLER_PROBABILITY, straggler_slowdown=STRAGGLER_SLOWDOWN
    )
    runtime = SimRuntime(model, seed=7, execute=handler, charge_caller=True)
    with runtime:
        yield runtime, lambda: runtime.clock.now


def _fresh_model(train: RatingsWindow) -> BiasedMF:
    model = BiasedMF(factors=8, learning_rate=0.05, regularization=0.05, seed=0)
    model.global_mean = float(np.mean(train.ratings))
    model.grow(train.user_ids, train.item_ids)
    return model


def _train(
    policy: SyncPolicy,
    train: RatingsWindow,
    workers: int,
    runtime_for: RuntimeFactory,
    workdir: Path,
    target: float | None,
    max_epochs: int,
) -> dict[str, Any]:
    """Epochs until ``target`` (or ``max_epochs``); losses, times and cost."""
    root = workdir / f"{policy.name}-{workers}-{'target' if target is None else 'run'}"
    config = EpochConfig(batch_size=256, learning_rate=0.05, workers=workers, memory_mb=1024)
    with runtime_for(workers) as (runtime, clock):
        backend = DistributedBackend(
            runtime, FileObjectStore(root), f"file://{root}", policy.name, policy
        )
        model = _fresh_model(train)
        backend.prepare(model, train)
        losses, started, reached = [], clock(), None
        for _ in range(max_epochs):
            losses.append(backend.run_epoch(config).loss)
            if target is not None and losses[-1] <= target:
                reached = clock() - started
                break
        elapsed = clock() - started
        backend.result()  # stragglers still running finish and are billed
    return {
        "losses": losses,
        "time_to_target_s": reached,
        "elapsed_s": elapsed,
        "epochs": len(losses),
        "model": model,
        "cost_usd": sum(r.cost_usd for r in backend.stats.invocations),
    }


def _rmse(model: BiasedMF, holdout: RatingsWindow) -> float:
    predictions = model.predict(holdout.user_ids, holdout.item_ids, clip=(0.5, 5.0))
    return float(np.sqrt(np.mean((predictions - holdout.ratings) ** 2)))


def _race(
    prefix: str,
    train: RatingsWindow,
    holdout: RatingsWindow,
    workers: int,
    runtime_for: RuntimeFactory,
    workdir: Path,
    target_epochs: int,
    max_epochs: int,
) -> dict[str, Any]:
    """The three policies to BSP's loss after ``target_epochs``, at λ = ``workers``.

    A policy that does not reach the target in ``max_epochs`` has a null time; its
    speed-up is then computed from its elapsed time and is a lower bound.
    """
    reference = _train(SyncPolicy.bsp(), train, workers, runtime_for, workdir, None, target_epochs)
    target = reference["losses"][-1]
    figures: dict[str, Any] = {f"{prefix}target_loss": target}
    for name, policy in POLICIES.items():
        run = _train(policy, train, workers, runtime_for, workdir, target, max_epochs)
        figures[f"{prefix}{name}_time_to_target_s"] = run["time_to_target_s"]
        figures[f"{prefix}{name}_reached_target"] = run["time_to_target_s"] is not None
        figures[f"{prefix}{name}_epochs"] = run["epochs"]
        figures[f"{prefix}{name}_final_rmse"] = _rmse(run["model"], holdout)
        figures[f"{prefix}{name}_cost_usd"] = run["cost_usd"]
        figures[f"{prefix}{name}_elapsed_s"] = run["elapsed_s"]
    selective = figures[f"{prefix}selective_time_to_target_s"]
    for other in ("bsp", "asp"):
        time_other = figures[f"{prefix}{other}_time_to_target_s"]
        if time_other is None:
            time_other = figures[f"{prefix}{other}_elapsed_s"]
        speedup = time_other / selective if selective else None
        figures[f"{prefix}speedup_selective_vs_{other}"] = speedup
    bsp_rmse = figures[f"{prefix}bsp_final_rmse"]
    figures[f"{prefix}selective_rmse_vs_bsp"] = figures[f"{prefix}selective_final_rmse"] / bsp_rmse
    return figures


def run_sync(
    dataset: Path | None = None,
    limit: int | None = None,
    batch_size: int = 500,
    workers: int = 8,
    target_epochs: int = 6,
    max_epochs: int = 40,
    simulated_workers: tuple[int, ...] | list[int] = SIMULATED_WORKERS,
) -> dict[str, Any]:
    stream = open_ratings(dataset, limit=limit or 30_000)[0]
    window = RatingsWindow(stream.user_ids, stream.item_ids, stream.ratings)
    train, holdout = window.split_holdout()
    figures: dict[str, Any] = {
        "events": len(window),
        "workers": workers,
        "selective_ratio": SELECTIVE_RATIO,
        "straggler_probability": STRAGGLER_PROBABILITY,
        "straggler_slowdown": list(STRAGGLER_SLOWDOWN),
    }
    with tempfile.TemporaryDirectory(prefix="driftline-bench-") as tmp:
        workdir = Path(tmp)
        figures.update(
            _race("", train, holdout, workers, _local, workdir, target_epochs, max_epochs)
        )
        for lam in simulated_workers:
            prefix = f"sim{lam}_"
            figures.update(
                _race(prefix, train, holdout, lam, _simulated, workdir, target_epochs, max_epochs)
            )
            figures[f"{prefix}samples_per_worker"] = math.ceil(len(train) / lam)
    return figures
