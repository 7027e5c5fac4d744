"""The config vector a retraining epoch runs with (SandPiper's cv_t).

Workers λ, the sync ratio κ/λ and per-worker memory only matter once training runs on
distributed workers; the in-process trainer reads batch size and learning rate, and the
job record keeps the whole vector so every epoch says how it ran.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class EpochConfig:
    """One epoch's configuration.

    Parameters
    ----------
    batch_size
        Minibatch size of SGD.
    learning_rate
        SGD step size.
    workers
        λ, the number of workers an epoch launches.
    sync_ratio
        κ/λ, the share of workers an epoch waits for (1.0 is fully synchronous); None
        leaves it to the job's sync policy.
    memory_mb
        Memory per worker, which on Lambda also sets its vCPU share.

    Examples
    --------
    >>> EpochConfig(batch_size=512, learning_rate=0.05).workers
    1
    """

    batch_size: int
    learning_rate: float
    workers: int = 1
    sync_ratio: float | None = None
    memory_mb: int = 1769

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.sync_ratio is not None and not 0 < self.sync_ratio <= 1:
            raise ValueError(f"sync_ratio must be in (0, 1], got {self.sync_ratio}")
        if not 128 <= self.memory_mb <= 10_240:
            raise ValueError(f"memory_mb must be within 128..10240, got {self.memory_mb}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Memory sizes (MB): dense below one vCPU (1,769 MB), where the CPU share and so the
#: worker's speed change with every step, sparse above it, where the single-threaded
#: worker gains no speed and only the bill grows (kept so the model can tell).
MEMORY_GRID_MB = (128, 256, 384, 512, 640, 768, 1024, 1280, 1536, 1769, 2048, 3008, 5120, 10240)
#: λ: about 1.5× apart, since an epoch's latency and cost respond to ratios of λ.
WORKER_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1000)
#: κ/λ from half the workers to all of them (BSP); below a half, most of an epoch's
#: updates arrive stale and damped, which costs more progress than it saves time.
SYNC_RATIO_GRID = (0.5, 0.625, 0.75, 0.875, 1.0)
#: Minibatch sizes, powers of two: numpy's per-batch cost makes small ones slow.
BATCH_GRID = (256, 512, 1024, 2048, 4096)
#: Learning rates, doubling around the default 0.05.
LEARNING_RATE_GRID = (0.0125, 0.025, 0.05, 0.1, 0.2)


@dataclass(frozen=True)
class SearchSpace:
    """The candidate config vectors of an epoch: the product of one grid per dimension.

    The defaults give 14 × 20 × 5 × 5 × 5 = 35,000 candidates (see the grids' comments
    for why each has the levels it has). Memory stays within Lambda's 128–10,240 MB and
    λ within 1–1,000 (Lambda's default concurrency); κ is ⌈κ/λ · λ⌉ as in
    :class:`retrain.sync.SyncPolicy`.

    Examples
    --------
    >>> space = SearchSpace()
    >>> len(space)
    35000
    >>> grid = space.grid()
    >>> space.config(grid, space.index(grid, EpochConfig(1024, 0.05, 4, 0.75, 1024)))
    EpochConfig(batch_size=1024, learning_rate=0.05, workers=4, sync_ratio=0.75, memory_mb=1024)
    >>> SearchSpace(workers=(0, 2))
    Traceback (most recent call last):
    ...
    ValueError: workers must lie within 1..1000, got (0, 2)
    """

    memory_mb: tuple[int, ...] = MEMORY_GRID_MB
    workers: tuple[int, ...] = WORKER_GRID
    sync_ratio: tuple[float, ...] = SYNC_RATIO_GRID
    batch_size: tuple[int, ...] = BATCH_GRID
    learning_rate: tuple[float, ...] = LEARNING_RATE_GRID

    def __post_init__(self) -> None:
        bounds = {
            "memory_mb": (128, 10_240),
            "workers": (1, 1000),
            "sync_ratio": (0.0, 1.0),
            "batch_size": (1, 1 << 20),
            "learning_rate": (0.0, 10.0),
        }
        for name, (low, high) in bounds.items():
            levels = getattr(self, name)
            if not levels or len(set(levels)) != len(levels):
                raise ValueError(f"{name} needs distinct levels, got {levels}")
            if not all(low <= v <= high for v in levels) or min(levels) <= 0:
                shown = f"{low:g}..{high:g}"
                raise ValueError(f"{name} must lie within {shown}, got {levels}")
            object.__setattr__(self, name, tuple(sorted(levels)))

    def __len__(self) -> int:
        return (
            len(self.memory_mb)
            * len(self.workers)
            * len(self.sync_ratio)
            * len(self.batch_size)
            * len(self.learning_rate)
        )

    def grid(self) -> Candidates:
        """Every candidate, as columns (memory varies slowest, learning rate fastest)."""
        mesh = np.meshgrid(
            np.asarray(self.memory_mb, dtype=np.float64),
            np.asarray(self.workers, dtype=np.float64),
            np.asarray(self.sync_ratio, dtype=np.float64),
            np.asarray(self.batch_size, dtype=np.float64),
            np.asarray(self.learning_rate, dtype=np.float64),
            indexing="ij",
        )
        memory, workers, ratio, batch, lr = (m.ravel() for m in mesh)
        return Candidates(memory, workers, ratio, batch, lr)

    def index(self, grid: Candidates, config: EpochConfig) -> int:
        """The row of ``config`` in ``grid``; its nearest candidate if it is off the grid."""
        distance = (
            np.abs(np.log(grid.memory_mb / config.memory_mb))
            + np.abs(np.log(grid.workers / config.workers))
            + np.abs(grid.sync_ratio - (1.0 if config.sync_ratio is None else config.sync_ratio))
            + np.abs(np.log(grid.batch_size / config.batch_size))
            + np.abs(np.log(grid.learning_rate / config.learning_rate))
        )
        return int(np.argmin(distance))

    def config(self, grid: Candidates, row: int) -> EpochConfig:
        """The config vector of candidate ``row``."""
        return grid.config(row)

    def bounds(self) -> np.ndarray:
        """``2 x 5`` lower and upper bounds of :meth:`Candidates.features`' raw columns."""
        return np.array(
            [
                [math.log(self.memory_mb[0]), math.log(self.memory_mb[-1])],
                [math.log(self.workers[0]), math.log(max(self.workers[-1], 2))],
                [self.sync_ratio[0], 1.0],
                [math.log(self.batch_size[0]), math.log(max(self.batch_size[-1], 2))],
                [math.log(self.learning_rate[0]), math.log(self.learning_rate[-1])],
            ]
        ).T


@dataclass(frozen=True)
class Candidates:
    """Config vectors as columns, ``m`` rows each: how 35,000 candidates stay cheap.

    ``kappa`` is derived: ⌈sync_ratio · workers⌉, at least 1.
    """

    memory_mb: np.ndarray
    workers: np.ndarray
    sync_ratio: np.ndarray
    batch_size: np.ndarray
    learning_rate: np.ndarray

    def __len__(self) -> int:
        return len(self.memory_mb)

    @property
    def kappa(self) -> np.ndarray:
        return np.maximum(1.0, np.ceil(self.sync_ratio * self.workers - 1e-9))

    def take(self, rows: np.ndarray) -> Candidates:
        """The candidates at ``rows`` (indices or a mask)."""
        return Candidates(
            self.memory_mb[rows],
            self.workers[rows],
            self.sync_ratio[rows],
            self.batch_size[rows],
            self.learning_rate[rows],
        )

    def config(self, row: int) -> EpochConfig:
        return EpochConfig(
            batch_size=int(self.batch_size[row]),
            learning_rate=float(self.learning_rate[row]),
            workers=int(self.workers[row]),
            sync_ratio=float(self.sync_ratio[row]),
            memory_mb=int(self.memory_mb[row]),
        )

    def keeps(self, rows: np.ndarray, current: EpochConfig) -> np.ndarray:
        """Per row of ``rows``, whether it keeps ``current``'s memory and λ: no container
        to start (containers are per memory size)."""
        return (self.memory_mb[rows] == current.memory_mb) & (self.workers[rows] == current.workers)

    @classmethod
    def of(cls, configs: list[EpochConfig]) -> Candidates:
        """Candidates holding ``configs`` in order."""

        def column(name: str) -> np.ndarray:
            values = [getattr(c, name) for c in configs]
            return np.asarray([1.0 if v is None else v for v in values], dtype=np.float64)

        return cls(
            column("memory_mb"),
            column("workers"),
            column("sync_ratio"),
            column("batch_size"),
            column("learning_rate"),
        )

    def features(self, bounds: np.ndarray) -> np.ndarray:
        """``m x 5`` inputs of the surrogate in [0, 1]: logs of memory, λ, batch size and
        learning rate and κ/λ as is, scaled by ``bounds`` (:meth:`SearchSpace.bounds`),
        so that one lengthscale prior suits every dimension."""
        raw = np.column_stack(
            [
                np.log(self.memory_mb),
                np.log(self.workers),
                self.sync_ratio,
                np.log(self.batch_size),
                np.log(self.learning_rate),
            ]
        )
        low, high = bounds
        return (raw - low) / np.where(high > low, high - low, 1.0)
