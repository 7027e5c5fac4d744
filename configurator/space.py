"""The config vector a retraining epoch runs with (SandPiper's cv_t).

Workers λ, the sync ratio κ/λ and per-worker memory only matter once training runs on
distributed workers; the in-process trainer reads batch size and learning rate, and the
job record keeps the whole vector so every epoch says how it ran.

The worker kind is part of the vector: Lambda functions at their memory sizes, the
service's own process (no start-up, one core taken from serving), or GPU containers of
a type of the price file (a start-up, then billed per second while held). Each kind has
its own grid; the search space is their union.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

#: Worker kinds, by their code in :class:`Candidates`' ``kind`` column. The GPU kinds
#: are the GPU container types of ``functions/prices.json`` (``gpu-<type>``).
LAMBDA = "lambda"
IN_PROCESS = "inprocess"
GPU_KINDS = ("gpu-a10g", "gpu-l4", "gpu-a100", "gpu-h100")
KINDS = (LAMBDA, IN_PROCESS, *GPU_KINDS)
#: Memory a config of another kind than Lambda carries (Lambda's one vCPU): it has no
#: memory size to choose.
NO_MEMORY_MB = 1769


def kind_code(name: str) -> int:
    """The code of worker kind ``name`` (its index in ``KINDS``)."""
    try:
        return KINDS.index(name)
    except ValueError:
        raise ValueError(f"unknown worker kind {name!r}; choose from {list(KINDS)}") from None


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
        Memory per worker, which on Lambda also sets its vCPU share (other kinds carry
        ``NO_MEMORY_MB``).
    kind
        Where the workers run: one of ``KINDS`` (``lambda``, ``inprocess``,
        ``gpu-<type>``).

    Examples
    --------
    >>> EpochConfig(batch_size=512, learning_rate=0.05).workers
    1
    >>> EpochConfig(batch_size=65536, learning_rate=0.05, kind="gpu-a10g").kind
    'gpu-a10g'
    """

    batch_size: int
    learning_rate: float
    workers: int = 1
    sync_ratio: float | None = None
    memory_mb: int = 1769
    kind: str = LAMBDA

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
        kind_code(self.kind)

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
#: GPU containers per epoch: a GPU trains a 10^7-rating window in about a second, so
#: more than a few only pay for a deadline shorter than that.
GPU_WORKER_GRID = (1, 2, 4, 8)
#: A GPU's minibatches, 4x apart: its per-batch seconds (kernel launches, the sort of a
#: batch's rows, the wait for its loss) make small batches as slow as numpy's.
GPU_BATCH_GRID = (1024, 4096, 16384, 65536)


@dataclass(frozen=True)
class SearchSpace:
    """The candidate config vectors of an epoch: per worker kind, the product of one grid
    per dimension.

    The defaults give Lambda alone: 14 × 20 × 5 × 5 × 5 = 35,000 candidates (see the
    grids' comments for why each has the levels it has). Memory stays within Lambda's
    128–10,240 MB and λ within 1–1,000 (Lambda's default concurrency); κ is ⌈κ/λ · λ⌉ as
    in :class:`retrain.sync.SyncPolicy`. ``kinds`` adds the other worker kinds, each with
    its own grid: in-process, one worker at Lambda's batch sizes (it is the numpy worker);
    a GPU type, ``gpu_workers`` containers at ``gpu_batch_size``, always synchronous (a
    dedicated GPU has no stragglers to leave behind, and a container still busy with a
    stale shard would need another start-up).

    Examples
    --------
    >>> space = SearchSpace()
    >>> len(space)
    35000
    >>> grid = space.grid()
    >>> space.config(grid, space.index(grid, EpochConfig(1024, 0.05, 4, 0.75, 1024))).as_dict()
    ... # doctest: +NORMALIZE_WHITESPACE
    {'batch_size': 1024, 'learning_rate': 0.05, 'workers': 4, 'sync_ratio': 0.75,
     'memory_mb': 1024, 'kind': 'lambda'}
    >>> len(SearchSpace(kinds=KINDS))  # + 5 × 5 in process + 4 types × 4 × 4 × 5 on GPUs
    35345
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
    kinds: tuple[str, ...] = (LAMBDA,)
    gpu_workers: tuple[int, ...] = GPU_WORKER_GRID
    gpu_batch_size: tuple[int, ...] = GPU_BATCH_GRID

    def __post_init__(self) -> None:
        bounds = {
            "memory_mb": (128, 10_240),
            "workers": (1, 1000),
            "sync_ratio": (0.0, 1.0),
            "batch_size": (1, 1 << 20),
            "learning_rate": (0.0, 10.0),
            "gpu_workers": (1, 1000),
            "gpu_batch_size": (1, 1 << 20),
        }
        for name, (low, high) in bounds.items():
            levels = getattr(self, name)
            if not levels or len(set(levels)) != len(levels):
                raise ValueError(f"{name} needs distinct levels, got {levels}")
            if not all(low <= v <= high for v in levels) or min(levels) <= 0:
                shown = f"{low:g}..{high:g}"
                raise ValueError(f"{name} must lie within {shown}, got {levels}")
            object.__setattr__(self, name, tuple(sorted(levels)))
        if not self.kinds or len(set(self.kinds)) != len(self.kinds):
            raise ValueError(f"kinds needs distinct worker kinds, got {self.kinds}")
        object.__setattr__(self, "kinds", tuple(sorted(self.kinds, key=kind_code)))

    def _parts(self) -> list[tuple[int, tuple[tuple[float, ...], ...]]]:
        """Per kind in the space, its code and its grids (memory, λ, κ/λ, batch, lr)."""
        parts: list[tuple[int, tuple[tuple[float, ...], ...]]] = []
        for kind in self.kinds:
            if kind == LAMBDA:
                grids: tuple[tuple[float, ...], ...] = (
                    self.memory_mb,
                    self.workers,
                    self.sync_ratio,
                    self.batch_size,
                    self.learning_rate,
                )
            elif kind == IN_PROCESS:
                grids = ((NO_MEMORY_MB,), (1,), (1.0,), self.batch_size, self.learning_rate)
            else:
                grids = (
                    (NO_MEMORY_MB,),
                    self.gpu_workers,
                    (1.0,),
                    self.gpu_batch_size,
                    self.learning_rate,
                )
            parts.append((kind_code(kind), grids))
        return parts

    def __len__(self) -> int:
        return sum(math.prod(len(g) for g in grids) for _, grids in self._parts())

    def grid(self) -> Candidates:
        """Every candidate, as columns: kind by kind in ``KINDS`` order (Lambda first),
        within a kind memory varying slowest and the learning rate fastest."""
        columns: list[list[np.ndarray]] = [[] for _ in range(6)]
        for code, grids in self._parts():
            mesh = np.meshgrid(*(np.asarray(g, dtype=np.float64) for g in grids), indexing="ij")
            for column, values in zip(columns, mesh, strict=False):
                column.append(values.ravel())
            columns[5].append(np.full(mesh[0].size, float(code)))
        memory, workers, ratio, batch, lr, kind = (np.concatenate(c) for c in columns)
        return Candidates(memory, workers, ratio, batch, lr, kind)

    def index(self, grid: Candidates, config: EpochConfig) -> int:
        """The row of ``config`` in ``grid``; its nearest candidate if it is off the grid
        (of its kind, where the grid has it)."""
        distance = (
            np.abs(np.log(grid.memory_mb / config.memory_mb))
            + np.abs(np.log(grid.workers / config.workers))
            + np.abs(grid.sync_ratio - (1.0 if config.sync_ratio is None else config.sync_ratio))
            + np.abs(np.log(grid.batch_size / config.batch_size))
            + np.abs(np.log(grid.learning_rate / config.learning_rate))
            + 1e3 * (grid.kind != kind_code(config.kind))
        )
        return int(np.argmin(distance))

    def config(self, grid: Candidates, row: int) -> EpochConfig:
        """The config vector of candidate ``row``."""
        return grid.config(row)

    def bounds(self) -> np.ndarray:
        """``2 x 5`` lower and upper bounds of :meth:`Candidates.features`' raw columns,
        over every kind's grid."""
        kinds = [grids for _, grids in self._parts()]
        memory, workers, ratio, batch, lr = (
            sorted({v for grids in kinds for v in grids[d]}) for d in range(5)
        )
        return np.array(
            [
                [math.log(memory[0]), math.log(memory[-1])],
                [math.log(workers[0]), math.log(max(workers[-1], 2))],
                [ratio[0], 1.0],
                [math.log(batch[0]), math.log(max(batch[-1], 2))],
                [math.log(lr[0]), math.log(lr[-1])],
            ]
        ).T

    @property
    def several_kinds(self) -> bool:
        """Whether the space holds more than one worker kind (the residual GPs then see
        the kind)."""
        return len(self.kinds) > 1


@dataclass(frozen=True)
class Candidates:
    """Config vectors as columns, ``m`` rows each: how 35,000 candidates stay cheap.

    ``kappa`` is derived: ⌈sync_ratio · workers⌉, at least 1. ``kind`` holds each row's
    worker kind as its code in ``KINDS`` (all Lambda when not given).
    """

    memory_mb: np.ndarray
    workers: np.ndarray
    sync_ratio: np.ndarray
    batch_size: np.ndarray
    learning_rate: np.ndarray
    kind: np.ndarray = field(default=None)  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        if self.kind is None:
            object.__setattr__(self, "kind", np.zeros(len(self.memory_mb)))

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
            self.kind[rows],
        )

    def config(self, row: int) -> EpochConfig:
        return EpochConfig(
            batch_size=int(self.batch_size[row]),
            learning_rate=float(self.learning_rate[row]),
            workers=int(self.workers[row]),
            sync_ratio=float(self.sync_ratio[row]),
            memory_mb=int(self.memory_mb[row]),
            kind=KINDS[int(self.kind[row])],
        )

    def keeps(self, rows: np.ndarray, current: EpochConfig) -> np.ndarray:
        """Per row of ``rows``, whether it keeps ``current``'s kind, memory and λ: no
        container to start (containers are per kind and memory size)."""
        return (
            (self.memory_mb[rows] == current.memory_mb)
            & (self.workers[rows] == current.workers)
            & (self.kind[rows] == kind_code(current.kind))
        )

    def kinds(self) -> np.ndarray:
        """The distinct kind codes among the rows."""
        return np.unique(self.kind).astype(int)

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
            np.asarray([kind_code(c.kind) for c in configs], dtype=np.float64),
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

    def kind_feature(self) -> np.ndarray:
        """``m`` kind codes scaled to [0, 1]: the surrogates' input where a space holds
        several kinds."""
        return self.kind / (len(KINDS) - 1)
