"""What a retraining job is asked to do, fixed when it is created.

The spec is recorded with the job (``as_params``) and read back when a restarted service
resumes it (``from_params``), so a resumed job trains with what it was started with,
not with whatever the settings say after the restart.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from configurator.space import KINDS, EpochConfig
from retrain.convergence import ConvergenceRule
from retrain.window import ChangeWindowPolicy, WindowPolicy


@dataclass(frozen=True)
class JobSpec:
    """A retraining job's model, data, stopping rule, placement and default config vector.

    Examples
    --------
    >>> spec = JobSpec(workers=8, sync_ratio=0.5, kinds=("lambda", "gpu-l4"))
    >>> JobSpec.from_params(spec.as_params()) == spec
    True
    >>> JobSpec(workers=0)
    Traceback (most recent call last):
    ...
    ValueError: workers must be at least 1, got 0

    A drift job's spec names where the change began; its window starts there:

    >>> type(JobSpec().window_policy()).__name__
    'WindowPolicy'
    >>> type(JobSpec(drift_history_ratio=0.5, change_after_id=900).window_policy()).__name__
    'ChangeWindowPolicy'
    """

    factors: int = 8
    learning_rate: float = 0.05
    regularization: float = 0.1
    batch_size: int = 1024
    max_epochs: int = 30
    target_loss: float | None = None
    latency_cap_s: float = 600.0
    #: A drift job's deadline when tighter than ``latency_cap_s`` (see ``for_trigger``);
    #: None: every job has ``latency_cap_s``.
    drift_latency_cap_s: float | None = None
    budget_usd: float | None = None
    history_sample: int = 50_000
    #: Most events since the version (or the change point) a window holds, the newest;
    #: None: all of them.
    max_window_events: int | None = None
    workers: int = 4
    sync_ratio: float = 0.75
    memory_mb: int = 1024
    runtime: str = "local"
    sync: str = "selective"
    configurator: str = "static"
    policy: str = "adwin"
    seed: int | None = 0
    #: Older events per event since the change in a drift job's window; None: a drift
    #: job's window is like any other's.
    drift_history_ratio: float | None = None
    #: Ratings at which an item's bias and factors keep half their trained value (see
    #: ``BiasedMF.damp_items``); 0 keeps them as trained.
    item_bias_support: float = 20.0
    #: Id of the last event before the change point of the alert that started the job,
    #: or of the latest alert's for a later job while ``change_window_persists``; None
    #: for other jobs (and for every job while the ratio is None).
    change_after_id: int | None = None
    #: Later jobs keep building their window from the latest alert's change point
    #: until the next alert (``Retrainer.request``).
    change_window_persists: bool = False
    #: A change window leaves out the older events of users the base version predicts
    #: this many times worse than the rest since the change (``changed_users``).
    user_change_ratio: float | None = None
    #: The worker kinds the job's configurator may pick (``configurator.space.KINDS``);
    #: None: those the deployment can run (``retrain.worker_kinds.available_kinds``).
    kinds: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("factors", "batch_size", "max_epochs", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 < self.sync_ratio <= 1:
            raise ValueError(f"sync_ratio must be in (0, 1], got {self.sync_ratio}")
        if self.learning_rate <= 0 or self.latency_cap_s <= 0:
            raise ValueError("learning_rate and latency_cap_s must be positive")
        if self.max_window_events is not None and self.max_window_events < 1:
            raise ValueError(f"max_window_events must be at least 1, got {self.max_window_events}")
        if self.drift_latency_cap_s is not None and not self.drift_latency_cap_s > 0:
            raise ValueError(
                f"drift_latency_cap_s must be positive, got {self.drift_latency_cap_s}"
            )
        if self.history_sample < 0 or self.regularization < 0 or self.item_bias_support < 0:
            raise ValueError(
                "history_sample, regularization and item_bias_support must not be negative"
            )
        if self.drift_history_ratio is not None and not self.drift_history_ratio >= 0:
            raise ValueError(f"drift_history_ratio must be >= 0, got {self.drift_history_ratio}")
        if self.change_after_id is not None and self.change_after_id < 0:
            raise ValueError(f"change_after_id must be >= 0, got {self.change_after_id}")
        if self.kinds is not None:  # a job record's JSON list comes back as a tuple
            object.__setattr__(self, "kinds", tuple(self.kinds))
            if not self.kinds or set(self.kinds) - set(KINDS):
                raise ValueError(f"kinds must be some of {list(KINDS)}, got {self.kinds}")

    def for_trigger(self, trigger: str) -> JobSpec:
        """The spec of a job started for ``trigger``: a drift job's deadline is
        ``drift_latency_cap_s`` where that is tighter.

        A drift job is urgent: until it swaps in, the serving model is the one that
        drifted. On functions, finishing sooner costs little more (the same GB-seconds
        on more workers, plus their requests and cold starts), so the configurator
        meets a tight deadline with more workers, while scheduled jobs keep the
        cheaper, looser one (BENCHMARKS.md "policies").

        >>> spec = JobSpec(latency_cap_s=600.0, drift_latency_cap_s=60.0)
        >>> spec.for_trigger("drift").latency_cap_s, spec.for_trigger("refresh").latency_cap_s
        (60.0, 600.0)
        """
        cap = self.drift_latency_cap_s
        if trigger != "drift" or cap is None or cap >= self.latency_cap_s:
            return self
        return replace(self, latency_cap_s=cap)

    def as_params(self) -> dict[str, Any]:
        """The job record's ``params`` (plain JSON)."""
        return asdict(self)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> JobSpec:
        """The spec a job was created with; fields it lacks (older jobs) take defaults.

        Older records named two fields differently (``latency_cap_s`` and ``budget_usd``
        are unchanged; nothing else is renamed), and unknown keys are ignored.
        """
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in known})

    def epoch_config(self) -> EpochConfig:
        """The config vector a configurator starts from."""
        return EpochConfig(
            self.batch_size,
            self.learning_rate,
            workers=self.workers,
            sync_ratio=self.sync_ratio,
            memory_mb=self.memory_mb,
        )

    def window_policy(self) -> WindowPolicy | ChangeWindowPolicy:
        """How the job's window is built: from the change point for a drift job that
        knows it, else the events since the version plus a history sample."""
        if self.change_after_id is None or self.drift_history_ratio is None:
            return WindowPolicy(self.history_sample, self.seed or 0, self.max_window_events)
        return ChangeWindowPolicy(
            self.change_after_id,
            self.drift_history_ratio,
            self.history_sample,
            self.seed or 0,
            self.user_change_ratio,
            self.max_window_events,
        )

    def rule(self) -> ConvergenceRule:
        return ConvergenceRule(
            target_loss=self.target_loss,
            max_epochs=self.max_epochs,
            latency_cap_s=self.latency_cap_s,
            budget_usd=self.budget_usd,
        )
