"""The config vector a retraining epoch runs with (SandPiper's cv_t).

Workers λ, the sync ratio κ/λ and per-worker memory only matter once training runs on
distributed workers; the in-process trainer reads batch size and learning rate, and the
job record keeps the whole vector so every epoch says how it ran.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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
        κ/λ, the share of workers an epoch waits for (1.0 is fully synchronous).
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
    sync_ratio: float = 1.0
    memory_mb: int = 1769

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if not 0 < self.sync_ratio <= 1:
            raise ValueError(f"sync_ratio must be in (0, 1], got {self.sync_ratio}")
        if not 128 <= self.memory_mb <= 10_240:
            raise ValueError(f"memory_mb must be within 128..10240, got {self.memory_mb}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
