"""``driftline bench sync``: BSP vs ASP vs selective synchronisation, same window.

Matrix factorisation on a window of MovieLens, λ workers on the ``local`` runtime (real
worker processes that behave and bill like Lambda) with seeded straggler injection:
each invocation, with probability 0.2, runs 3–5× slower. The target training loss is
what BSP reaches after ``target_epochs`` epochs; every policy then trains from the same
starting model until it reaches that loss, and the time to get there is compared. The
same three policies are then simulated at λ = 64 and 256 on the ``sim`` runtime.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from configurator.space import EpochConfig
from functions.mf import BiasedMF
from functions.objectstore import FileObjectStore
from functions.runtimes import LocalRuntime
from functions.runtimes.sim import DEFAULT_MODEL, simulate_epochs
from retrain.coordinator import DistributedBackend, SyncPolicy
from retrain.window import RatingsWindow
from service.datasets import MOVIELENS_SMALL, load_ratings

SIMULATED_WORKERS = (64, 256)
STRAGGLER_PROBABILITY = 0.2
STRAGGLER_SLOWDOWN = (3.0, 5.0)


def _straggler(seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)

    def slowdown() -> float:
        if rng.random() < STRAGGLER_PROBABILITY:
            return float(rng.uniform(*STRAGGLER_SLOWDOWN))
        return 1.0

    return slowdown


def _fresh_model(train: RatingsWindow) -> BiasedMF:
    model = BiasedMF(factors=8, learning_rate=0.05, regularization=0.05, seed=0)
    model.global_mean = float(np.mean(train.ratings))
    model.grow(train.user_ids, train.item_ids)
    return model


def _train(
    policy: SyncPolicy,
    train: RatingsWindow,
    workers: int,
    workdir: Path,
    target: float | None,
    max_epochs: int,
) -> dict[str, Any]:
    """Epochs until ``target`` (or ``max_epochs``); losses, times and cost."""
    root = workdir / policy.name
    config = EpochConfig(batch_size=256, learning_rate=0.05, workers=workers, memory_mb=1024)
    with LocalRuntime(concurrency=workers, slowdown=_straggler(seed=7)) as runtime:
        backend = DistributedBackend(
            runtime, FileObjectStore(root), f"file://{root}", policy.name, policy
        )
        model = _fresh_model(train)
        backend.prepare(model, train)
        losses, started, reached = [], time.perf_counter(), None
        for _ in range(max_epochs):
            losses.append(backend.run_epoch(config).loss)
            if target is not None and losses[-1] <= target:
                reached = time.perf_counter() - started
                break
        elapsed = time.perf_counter() - started
        backend.result()
        cost = sum(r.cost_usd for r in backend.stats.invocations)
    return {
        "losses": losses,
        "time_to_target_s": reached,
        "elapsed_s": elapsed,
        "epochs": len(losses),
        "model": model,
        "cost_usd": cost,
    }


def _rmse(model: BiasedMF, holdout: RatingsWindow) -> float:
    predictions = model.predict(holdout.user_ids, holdout.item_ids, clip=(0.5, 5.0))
    return float(np.sqrt(np.mean((predictions - holdout.ratings) ** 2)))


def run_sync(
    dataset: Path | None = None,
    limit: int | None = None,
    batch_size: int = 500,
    workers: int = 8,
    target_epochs: int = 6,
    max_epochs: int = 40,
) -> dict[str, Any]:
    stream = load_ratings(dataset or MOVIELENS_SMALL, limit=limit or 30_000)
    window = RatingsWindow(stream.user_ids, stream.item_ids, stream.ratings)
    train, holdout = window.split_holdout()
    figures: dict[str, Any] = {"events": len(window), "workers": workers}
    with tempfile.TemporaryDirectory(prefix="driftline-bench-") as tmp:
        workdir = Path(tmp)
        bsp = _train(SyncPolicy.bsp(), train, workers, workdir / "t", None, target_epochs)
        target = bsp["losses"][-1]
        figures["target_loss"] = target
        policies = {
            "bsp": SyncPolicy.bsp(),
            "asp": SyncPolicy.asp(),
            "selective": SyncPolicy.selective(0.75),
        }
        for name, policy in policies.items():
            run = _train(policy, train, workers, workdir, target, max_epochs)
            figures[f"{name}_time_to_target_s"] = run["time_to_target_s"]
            figures[f"{name}_epochs"] = run["epochs"]
            figures[f"{name}_final_rmse"] = _rmse(run["model"], holdout)
            figures[f"{name}_cost_usd"] = run["cost_usd"]
    sel, b, a = (figures[f"{p}_time_to_target_s"] for p in ("selective", "bsp", "asp"))
    figures["speedup_selective_vs_bsp"] = b / sel if sel and b else None
    figures["speedup_selective_vs_asp"] = a / sel if sel and a else None
    for lam in SIMULATED_WORKERS:
        figures.update(_simulated(lam, len(train), figures))
    return figures


def _simulated(workers: int, samples: int, measured: dict[str, Any]) -> dict[str, Any]:
    """The same three policies on the ``sim`` runtime at λ = ``workers``.

    Each policy runs the number of epochs it needed to reach the target on the local
    runtime (an assumption: the loss curve per epoch is taken not to depend on λ), with
    the calibrated performance model and the same straggler distribution.
    """
    model = DEFAULT_MODEL.replace(
        straggler_p=STRAGGLER_PROBABILITY, straggler_slowdown=STRAGGLER_SLOWDOWN
    )
    kappas = {"bsp": "bsp", "asp": "asp", "selective": math.ceil(0.75 * workers)}
    out: dict[str, Any] = {}
    for name, kappa in kappas.items():
        run = simulate_epochs(
            kappa,
            workers,
            max(1, samples // workers),
            measured[f"{name}_epochs"],
            model,
            memory_mb=1024,
            batch_size=256,
            seed=7,
        )
        out[f"sim{workers}_{name}_time_to_target_s"] = run.latency_s
        out[f"sim{workers}_{name}_cost_usd"] = run.cost_usd
    sel = out[f"sim{workers}_selective_time_to_target_s"]
    out[f"sim{workers}_speedup_selective_vs_bsp"] = out[f"sim{workers}_bsp_time_to_target_s"] / sel
    out[f"sim{workers}_speedup_selective_vs_asp"] = out[f"sim{workers}_asp_time_to_target_s"] / sel
    return out
