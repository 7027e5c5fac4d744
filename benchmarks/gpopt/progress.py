"""Loss progress per config vector, measured with real worker updates on MovieLens.

The coordinator (:class:`retrain.coordinator.DistributedBackend`) trains a window of
MovieLens with the real worker executed in this process by the sim runtime (its
durations simulated with the true straggler distribution, so which κ updates arrive
first is as in the truth), from the same warm-started model, for every batch size,
learning rate and sync ratio of the search space at a few worker counts. Progress is
the relative fall of the training loss in an epoch. It depends on λ through the
shard a worker trains on, so it is looked up by shard size (log-linear between the
measured λ, held constant beyond them). The epochs' decay (``phase``) and the noise of
progress around it are measured too.

The phase follows the loss, not the epoch count: an epoch progresses less the nearer
the loss is to its floor, whatever brought it there, so a job that explored early has
fallen less and progresses more later, towards the same floor (the figures that show
it: ``BENCHMARKS.md``, section "configurator").
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.datasets.registry import open_ratings
from configurator.space import Candidates, EpochConfig, SearchSpace
from functions.handler import handler
from functions.mf import BiasedMF
from functions.objectstore import FileObjectStore
from functions.performance import DEFAULT_MODEL
from functions.runtimes.sim import SimRuntime
from retrain.coordinator import DistributedBackend
from retrain.sync import SyncPolicy
from retrain.window import RatingsWindow

#: Ratings of the measured window, worker counts and sync ratios measured (others are
#: looked up at the nearest), epochs per run, and configs run again with another seed
#: to measure the noise of progress.
#:
#: Every ratio is a whole κ at every measured λ (:func:`measure_progress` checks): a
#: ratio that rounds up to another κ would be measured as that one (at λ = 2, ¾ is
#: κ = 2 of 2: synchronous).
WINDOW = 40_000
WORKERS = (8, 32, 128)
RATIOS = (0.5, 0.625, 0.75, 0.875, 1.0)
EPOCHS = 2
REPEATS = 6


@dataclass(frozen=True)
class ProgressTable:
    """Measured progress: ``values[w, b, l, r]`` at shard sizes ``shards[w]``."""

    shards: np.ndarray
    batch_size: tuple[int, ...]
    learning_rate: tuple[float, ...]
    sync_ratio: tuple[float, ...]
    values: np.ndarray
    decay: float
    noise_sd: float

    def reach(self, first: float) -> float:
        """The summed relative progress left to a job whose first epoch progresses
        ``first``: the geometric series of a job repeating that epoch."""
        return math.inf if self.decay >= 1.0 else first / (1.0 - self.decay)

    def phase(self, fallen: float, reach: float) -> float:
        """How much less an epoch progresses than the first one did, once the job's
        summed progress is ``fallen`` of the ``reach`` it has in all: the gap left to
        the floor. A job repeating the config ``reach`` was measured on gets
        ``decay ** epoch`` exactly."""
        if not math.isfinite(reach):
            return 1.0
        return float(min(1.0, max(0.0, 1.0 - max(fallen, 0.0) / reach)))

    def lookup(self, cands: Candidates, shard: np.ndarray) -> np.ndarray:
        """Progress of each candidate at its shard size."""
        b = _level(self.batch_size, cands.batch_size)
        lr = _level(self.learning_rate, cands.learning_rate)
        r = _level(self.sync_ratio, cands.sync_ratio)
        logs = np.log(self.shards)
        pos = np.clip(np.interp(np.log(shard), logs, np.arange(len(logs))), 0, len(logs) - 1)
        low = np.floor(pos).astype(int)
        high = np.minimum(low + 1, len(logs) - 1)
        frac = pos - low
        return (1 - frac) * self.values[low, b, lr, r] + frac * self.values[high, b, lr, r]


def _level(levels: tuple[float, ...], values: np.ndarray) -> np.ndarray:
    grid = np.asarray(levels, dtype=np.float64)
    return np.abs(np.log(values[:, None] / grid[None, :])).argmin(axis=1)


def phase_decay(first: np.ndarray, second: np.ndarray, ratios: tuple[float, ...]) -> float:
    """By how much a config's second epoch progresses less than its first (the median
    over configs, the last axis being ``ratios``), read from synchronous configs alone.

    With κ < λ the second epoch also folds in the first one's late updates and can
    progress more than the first, so those configs would hide the decay.
    """
    synchronous = np.isclose(np.asarray(ratios, dtype=np.float64), 1.0)
    if not synchronous.any():
        synchronous[:] = True
    useful = (first > 1e-4) & (second > 0) & synchronous
    if not useful.any():
        return 1.0
    return float(np.exp(np.median(np.log(second[useful] / first[useful]))))


def _check_whole_kappas(workers: tuple[int, ...], ratios: tuple[float, ...]) -> None:
    """Refuse a ratio that some measured λ would run as another κ/λ."""
    for w in workers:
        for r in ratios:
            kappa = SyncPolicy.selective(r).kappa(w)
            if not math.isclose(kappa, r * w):
                raise ValueError(
                    f"κ/λ {r} at λ = {w} runs κ = {kappa}, κ/λ {kappa / w:g}: measure at "
                    "worker counts where every ratio is a whole κ"
                )


def _window(limit: int) -> RatingsWindow:
    stream = open_ratings(limit=limit)[0]
    return RatingsWindow(stream.user_ids, stream.item_ids, stream.ratings)


def _start_model(train: RatingsWindow, seed: int) -> BiasedMF:
    """A model one epoch in, as a serving model being retrained would be."""
    model = BiasedMF(factors=8, learning_rate=0.05, regularization=0.05, seed=seed)
    model.global_mean = float(np.mean(train.ratings))
    model.grow(train.user_ids, train.item_ids)
    u, i = model.encode_users(train.user_ids), model.encode_items(train.item_ids)
    model.fit_epoch(
        u, i, np.asarray(train.ratings), batch_size=256, rng=np.random.default_rng(seed)
    )
    return model


def _run(
    start: BiasedMF, train: RatingsWindow, config: EpochConfig, root: Path, seed: int
) -> list[float]:
    """Relative progress of each of ``EPOCHS`` epochs of ``config``."""
    runtime_model = DEFAULT_MODEL.replace(straggler_p=0.2, straggler_slowdown=(3.0, 5.0))
    with SimRuntime(runtime_model, seed=seed, execute=handler) as runtime:
        backend = DistributedBackend(
            runtime,
            FileObjectStore(root),
            f"file://{root}",
            root.name,
            SyncPolicy.selective(config.sync_ratio or 1.0),
            seed=seed,
            checkpoint=False,
        )
        model = start.copy()
        backend.prepare(model, train)
        before = model.mse_encoded(backend._users, backend._items, backend._ratings)
        progress = []
        for _ in range(EPOCHS):
            loss = backend.run_epoch(config).loss
            progress.append((before - loss) / before if math.isfinite(loss) else -1.0)
            before = loss
        backend.result()
    return progress


def measure_progress(
    space: SearchSpace,
    window: int = WINDOW,
    workers: tuple[int, ...] = WORKERS,
    ratios: tuple[float, ...] = RATIOS,
    seed: int = 0,
) -> ProgressTable:
    """Measure the table over ``space``'s batch sizes and learning rates."""
    _check_whole_kappas(workers, ratios)
    train, _ = _window(window).split_holdout()
    start = _start_model(train, seed)
    shape = (len(workers), len(space.batch_size), len(space.learning_rate), len(ratios))
    first, second = np.zeros(shape), np.zeros(shape)

    def config(index: tuple[int, ...]) -> EpochConfig:
        w, b, lr, r = index
        return EpochConfig(
            batch_size=space.batch_size[b],
            learning_rate=space.learning_rate[lr],
            workers=workers[w],
            sync_ratio=ratios[r],
            memory_mb=1769,
        )

    repeats = []
    with tempfile.TemporaryDirectory(prefix="driftline-progress-") as tmp:
        for index in np.ndindex(*shape):
            root = Path(tmp) / f"p-{'-'.join(map(str, index))}"
            values = _run(start, train, config(index), root, seed)
            first[index], second[index] = values[0], values[-1]
        rng = np.random.default_rng(seed)
        for n, flat in enumerate(rng.choice(first.size, min(REPEATS, first.size), replace=False)):
            index = np.unravel_index(flat, shape)
            again = _run(start, train, config(index), Path(tmp) / f"r-{n}", seed + 1)[0]
            if first[index] > 0 and again > 0:
                repeats.append(math.log(again / first[index]))
    decay = phase_decay(first, second, ratios)
    noise = float(np.std(repeats) / math.sqrt(2)) if len(repeats) >= 2 else 0.0
    shards = np.array([math.ceil(len(train) / w) for w in workers], dtype=np.float64)
    order = np.argsort(shards)
    return ProgressTable(
        shards[order], space.batch_size, space.learning_rate, ratios, first[order], decay, noise
    )
