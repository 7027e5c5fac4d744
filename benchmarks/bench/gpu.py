"""``driftline bench gpu``: the torch worker against the numpy worker, by window and batch.

For each window (2·10^5 and 2·10^6 ratings by default; ``--windows`` adds 2·10^7) a
synthetic rating stream of that size with a planted low-rank structure, a model of
one user per hundred ratings and one item per three hundred (8 factors), and for each
batch size both workers' minibatch steps (:class:`functions.trainers.NumpyTrainer`,
:class:`functions.gpu.TorchTrainer`) from the same model and the same shuffle:

* **time per epoch**: the shuffle of the window, plus ``steps`` minibatch steps timed
  after ``warmup`` untimed ones, scaled to the epoch's ``⌈n/b⌉`` steps (a fixed number
  of steps keeps a 2·10^7 window to seconds on a CPU); the torch worker's one-time
  start (the model's and the shard's tensors to the device) is reported apart, as
  ``torch_setup_s``,
  and the device's first use (a CUDA context) is taken before anything is timed;
* **loss after equal epochs**: on the smallest window both workers train
  ``loss_epochs`` whole epochs and report their training MSE; on the others, the MSE
  after the same timed steps on the same samples. The two workers compute the same
  update, so these agree to float64 rounding where both ran;
* **crossover window**: per batch size, the window at which the torch worker's epoch
  becomes shorter than numpy's, interpolated in log-window between the measured ones
  (None: not within them; ``below`` the smallest when torch is faster there already);
  ``crossover_window`` is the smallest over batch sizes;
* ``worker_split``: of the numpy worker's whole invocation, the share that is not its
  steps (:mod:`benchmarks.bench.gpu_split`), on the largest window up to 2·10^6: the
  torch worker runs that part on the host's CPU too, so the steps' speed-up is not the
  worker's;
* ``fitted_gpu_model``: the simulator's GPU model (:func:`~functions.runtimes.sim.gpu.
  fit_gpu_model`) fitted to the torch epochs measured plus the worker split's host
  seconds per sample, to calibrate the simulator from.

Runs on CUDA where torch finds it, on the CPU otherwise (``device`` says which).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from functions.mf import BiasedMF
from functions.trainers import NumpyTrainer

WINDOWS = (200_000, 2_000_000)
#: The largest window the worker split runs on (whole worker invocations, repeated).
SPLIT_WINDOW_MAX = 2_000_000
BATCH_SIZES = (1024, 8192, 65_536)
FACTORS = 8


def synthetic_window(n: int, seed: int = 0) -> tuple[BiasedMF, np.ndarray, np.ndarray, np.ndarray]:
    """A model and ``n`` encoded ratings ``(model, users, items, ratings)``: a planted
    rank-4 structure plus noise on 1–5 stars, users and items drawn with a long tail."""
    rng = np.random.default_rng(seed)
    n_users, n_items = max(1_000, n // 100), max(500, n // 300)
    users = np.minimum((rng.pareto(1.2, n) * n_users / 20).astype(np.int64), n_users - 1)
    items = np.minimum((rng.pareto(1.0, n) * n_items / 30).astype(np.int64), n_items - 1)
    pu, qi = rng.normal(0, 0.6, (n_users, 4)), rng.normal(0, 0.6, (n_items, 4))
    truth = 3.5 + np.einsum("ij,ij->i", pu[users], qi[items]) + rng.normal(0, 0.5, n)
    ratings = np.clip(np.round(truth * 2) / 2, 1.0, 5.0)
    model = BiasedMF(factors=FACTORS, learning_rate=0.05, regularization=0.05, seed=seed)
    model.global_mean = float(ratings.mean())
    model.grow([f"u{k}" for k in range(n_users)], [f"i{k}" for k in range(n_items)])
    return model, users, items, ratings


def _time_steps(
    trainer: Any, order: np.ndarray, batch: int, steps: int, warmup: int
) -> tuple[float, float]:
    """Seconds per timed step and the MSE of the samples' batches (before each step)."""
    trainer.shuffle(order)
    sse = samples = 0.0
    start, timed = 0, 0.0
    for k in range(warmup + steps):
        if start >= len(order):
            start = 0
        stop = min(start + batch, len(order))
        tick = time.perf_counter()
        loss = trainer.step(start, stop)
        if k >= warmup:
            timed += time.perf_counter() - tick
        sse, samples = sse + loss * (stop - start), samples + (stop - start)
        start += batch
    return timed / max(steps, 1), sse / samples


def _epoch_loss(trainer: Any, n: int, batch: int, epochs: int, seed: int) -> float:
    """Training MSE of the last of ``epochs`` whole epochs (as the worker runs them)."""
    rng = np.random.default_rng(seed)
    loss = math.nan
    for _ in range(epochs):
        trainer.shuffle(rng.permutation(n))
        sse = 0.0
        for start in range(0, n, batch):
            stop = min(start + batch, n)
            sse += trainer.step(start, stop) * (stop - start)
        loss = sse / n
    return loss


def measure_window(
    n: int,
    batch_sizes: Sequence[int],
    steps: int,
    warmup: int,
    device: Any,
    loss_epochs: int,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Both workers on a synthetic window of ``n`` ratings at each batch size."""
    from functions.gpu import TorchTrainer

    model, users, items, ratings = synthetic_window(n, seed)
    tick = time.perf_counter()
    order = np.random.default_rng(seed).permutation(n)
    shuffle_s = time.perf_counter() - tick

    def trainer(name: str, copy: BiasedMF) -> Any:
        if name == "numpy":
            return NumpyTrainer(copy, users, items, ratings)
        return TorchTrainer(copy, users, items, ratings, device)

    out = []
    for b in batch_sizes:
        epoch_steps = math.ceil(n / b)
        timed = min(steps, epoch_steps)
        row: dict[str, Any] = {"window": n, "batch_size": b, "steps_per_epoch": epoch_steps}
        for name in ("numpy", "torch"):
            tick = time.perf_counter()
            runner = trainer(name, model.copy())
            setup = time.perf_counter() - tick
            per_step, loss = _time_steps(runner, order, b, timed, warmup)
            row[f"{name}_s_per_step"] = per_step
            row[f"{name}_s_per_epoch"] = shuffle_s + per_step * epoch_steps
            row[f"{name}_loss_after_steps"] = loss
            if name == "torch":
                row["torch_setup_s"] = setup
            if loss_epochs:
                row[f"{name}_loss_after_epochs"] = _epoch_loss(
                    trainer(name, model.copy()), n, b, loss_epochs, seed
                )
        row["steps_timed"] = timed
        row["speedup"] = row["numpy_s_per_epoch"] / row["torch_s_per_epoch"]
        out.append(row)
    return out


def crossover(rows: list[dict[str, Any]]) -> float | str | None:
    """The window where the torch worker's epoch becomes the shorter, by log-linear
    interpolation of the log speed-up between measured windows; ``"below"`` the
    smallest when it is shorter there already, None when it never is."""
    rows = sorted(rows, key=lambda r: r["window"])
    logs = [(math.log(r["window"]), math.log(r["speedup"])) for r in rows]
    if logs and logs[0][1] >= 0:
        return "below"
    for (x0, y0), (x1, y1) in zip(logs, logs[1:], strict=False):
        if y0 < 0 <= y1:
            return float(math.exp(x0 + (x1 - x0) * (-y0) / (y1 - y0)))
    return None


def run_gpu(
    dataset: Path | None = None,
    limit: int | None = None,
    batch_size: int = 500,
    windows: Sequence[int] | None = None,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    steps: int = 8,
    warmup: int = 2,
    loss_epochs: int = 1,
    seed: int = 0,
    split: bool = True,
) -> dict[str, Any]:
    """Run the benchmark; returns its figures (see the module docstring). ``dataset``,
    ``limit`` and ``batch_size`` (the ingest batch) do not apply: the windows are
    synthetic, of the sizes ``windows``."""
    import torch

    from benchmarks.bench.gpu_split import measure_worker_split
    from functions.gpu import default_device
    from functions.gpu_performance import fit_gpu_model

    started = time.perf_counter()
    device = default_device()
    torch.zeros(1, device=device).sum().item()  # the device's first use, not timed
    windows = tuple(sorted(windows or WINDOWS))
    rows: list[dict[str, Any]] = []
    for k, n in enumerate(windows):
        rows += measure_window(
            n, batch_sizes, steps, warmup, device, loss_epochs if k == 0 else 0, seed
        )
    by_batch = {str(b): crossover([r for r in rows if r["batch_size"] == b]) for b in batch_sizes}
    numeric = [v for v in by_batch.values() if isinstance(v, float)]
    overall: float | str | None = (
        "below" if "below" in by_batch.values() else (min(numeric) if numeric else None)
    )
    worker_split = None
    if split and (small := [n for n in windows if n <= SPLIT_WINDOW_MAX]):
        worker_split = measure_worker_split(max(small), batch_sizes, seed=seed)
    host_s = worker_split["host_s_per_sample"] if worker_split else 0.0
    fitted = None
    measured = [(r["window"], r["batch_size"], r["torch_s_per_epoch"]) for r in rows]
    if len({(n, b) for n, b, _ in measured}) >= 3:
        model = fit_gpu_model(measured, host_s_per_sample=host_s)
        fitted = {
            "overhead_s": model.overhead_s,
            "compute_s_per_sample": model.compute_s_per_sample,
            "host_s_per_sample": model.host_s_per_sample,
            "compute_s_per_batch": model.compute_s_per_batch,
        }
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "windows": list(windows),
        "batch_sizes": list(batch_sizes),
        "steps_timed": steps,
        "loss_epochs": loss_epochs,
        "results": rows,
        "crossover_by_batch": by_batch,
        "crossover_window": overall,
        "worker_split": worker_split,
        "fitted_gpu_model": fitted,
        "bench_seconds": time.perf_counter() - started,
    }


__all__ = ["BATCH_SIZES", "WINDOWS", "crossover", "measure_window", "run_gpu", "synthetic_window"]
