"""What every configurator offers the retraining coordinator."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from configurator.space import KINDS, LAMBDA, EpochConfig


@dataclass(frozen=True)
class WorkerRun:
    """One worker invocation of an epoch, as far as a configurator cares.

    An epoch of λ workers gives λ of these: what the analytic model is recalibrated
    from (SandPiper's observed metrics, per function rather than per epoch).
    """

    memory_mb: int
    samples: int
    duration_s: float
    cold_start: bool = False
    batch_size: int | None = None
    ok: bool = True
    kind: str = LAMBDA


@dataclass(frozen=True)
class Observation:
    """How one epoch went under a config: the data a configurator learns from.

    ``duration_s`` is the epoch's latency (launch to the κ-th fresh update and the
    coordinator's averaging); ``workers`` the invocations it launched, when the backend
    runs workers; ``samples`` the training samples of the window it ran on.
    """

    config: EpochConfig
    duration_s: float
    loss: float
    cost_usd: float = 0.0
    workers: tuple[WorkerRun, ...] = ()
    samples: int | None = None


@dataclass(frozen=True)
class JobContext:
    """What a configurator knows about its job before the first epoch.

    Parameters
    ----------
    train_samples
        Ratings in the training window (the work of an epoch).
    factors
        Latent factors of the model (the size of snapshots and deltas).
    model_rows
        Users plus items of the model (with ``factors``, the snapshot's size).
    latency_cap_s, budget_usd, max_epochs
        The job's deadline ``LATENCY_CAP_SECONDS``, its ``RETRAIN_BUDGET_USD`` (None: no
        budget) and its most epochs: each epoch's share of what is left is its limit.
    timeout_s
        A worker's time limit (900 s on Lambda).
    job_id
        The job, for the decisions kept across jobs.
    max_workers
        The most workers the runtime runs at once (local worker processes: a few;
        Lambda: 1,000): larger λ are not candidates.
    kinds
        The worker kinds the deployment offers (``KINDS``): the search space's are
        narrowed to them. None: the space's own.
    """

    train_samples: int
    factors: int = 8
    model_rows: int = 0
    latency_cap_s: float = 600.0
    budget_usd: float | None = None
    max_epochs: int = 30
    timeout_s: float = 900.0
    job_id: str = ""
    max_workers: int = 1000
    kinds: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kinds is not None and (not self.kinds or set(self.kinds) - set(KINDS)):
            raise ValueError(f"kinds must be some of {list(KINDS)}, got {self.kinds}")
        if self.train_samples < 1 or self.factors < 1 or self.max_epochs < 1:
            raise ValueError("train_samples, factors and max_epochs must be at least 1")
        if self.max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {self.max_workers}")
        if self.model_rows < 0:
            raise ValueError(f"model_rows must not be negative, got {self.model_rows}")
        if not (self.latency_cap_s > 0 and self.timeout_s > 0):
            raise ValueError("latency_cap_s and timeout_s must be positive")
        if self.budget_usd is not None and not self.budget_usd > 0:
            raise ValueError(f"budget_usd must be positive, got {self.budget_usd}")

    @property
    def snapshot_bytes(self) -> int:
        """Bytes of a model snapshot: a bias and ``factors`` floats per row."""
        return 8 * self.model_rows * (self.factors + 1)

    def features(self) -> tuple[float, ...]:
        """The job's context as surrogate inputs in about [0, 1]: log window size over
        10^3..10^8 ratings, so observations of other jobs inform this one."""
        return ((math.log10(self.train_samples) - 3.0) / 5.0,)


@dataclass(frozen=True)
class Decision:
    """Why a config was picked, for the job record (``/jobs/{id}``).

    Predictions are of the epoch as the configurator saw it before it ran; the
    observed fields are filled in once it has (:meth:`observed`).
    """

    candidates: int
    considered: int
    latency_s: float
    latency_interval_s: tuple[float, float]
    cost_usd: float
    cost_interval_usd: tuple[float, float]
    deadline_s: float
    p_feasible: float
    decision_ms: float
    reason: str
    observed_latency_s: float | None = None
    observed_cost_usd: float | None = None
    regret: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def observed(self, latency_s: float, cost_usd: float) -> Decision:
        return Decision(
            **{**self.as_dict(), "observed_latency_s": latency_s, "observed_cost_usd": cost_usd}
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "candidates": self.candidates,
            "considered": self.considered,
            "latency_s": self.latency_s,
            "latency_interval_s": tuple(self.latency_interval_s),
            "cost_usd": self.cost_usd,
            "cost_interval_usd": tuple(self.cost_interval_usd),
            "deadline_s": self.deadline_s,
            "p_feasible": self.p_feasible,
            "decision_ms": self.decision_ms,
            "reason": self.reason,
            "observed_latency_s": self.observed_latency_s,
            "observed_cost_usd": self.observed_cost_usd,
            "regret": self.regret,
            "extra": dict(self.extra),
        }


class Configurator(ABC):
    """Picks the config vector of the next epoch from the epochs observed so far."""

    #: Why the last proposal was made, if the configurator says (searching ones do).
    last_decision: Decision | None = None

    @abstractmethod
    def propose(self, epoch: int, history: Sequence[Observation]) -> EpochConfig:
        """The config for epoch ``epoch`` (0-based) given ``history``."""

    def close(self, history: Sequence[Observation] = ()) -> None:
        """Release what the configurator holds (a background fitting thread); called
        when the job ends with every epoch it ran (``history``), which a configurator
        may keep for later jobs."""
        return None
