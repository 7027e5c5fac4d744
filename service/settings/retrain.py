"""Retraining settings: when a job starts, what it trains on, and how it runs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from service.settings.choices import check_registered


class RetrainSettings(BaseModel):
    """Retraining jobs: the policy that starts them, the window they train on, the model
    and its stopping rule, and where and how their workers run."""

    retrain_enabled: bool = Field(
        True,
        description=(
            "Let drift alerts and the retrain policy start jobs; false: this process "
            "starts none of itself."
        ),
    )
    bootstrap_events: int = Field(
        1000, ge=1, description="Labelled events in before the first model is trained."
    )
    refresh_events: int | None = Field(
        10_000,
        ge=1,
        description=(
            "RETRAIN_POLICY=adwin: also retrain once this many labelled events arrived "
            "since the serving version, drift or not (none: on drift alerts only)."
        ),
    )
    history_sample: int = Field(
        50_000,
        ge=0,
        description=(
            "Older events a job samples uniformly to train on beside the events since "
            "the serving version."
        ),
    )
    max_window_events: int | None = Field(
        1_000_000,
        ge=1,
        description=(
            "Most recent events a job trains on: the newest this many of the log since the "
            "serving version (or a drift's change point); older ones join the history "
            "sample instead. None: every event since then, however many."
        ),
    )
    drift_window_history_ratio: float | None = Field(
        3.0,
        ge=0,
        description=(
            "A drift job trains on every event since the alert's change point plus a uniform "
            "sample of older events, at most this many per recent event (and at most "
            "HISTORY_SAMPLE); none: a drift job's window is like any other job's."
        ),
    )
    drift_window_persists: bool = Field(
        True,
        description=(
            "Jobs after a drift job (refreshes, policy and manual jobs) also build their "
            "window from the latest alert's change point, until the next alert or until "
            "HISTORY_SAMPLE events have arrived since it; false: only the drift job does."
        ),
    )
    drift_window_user_change_ratio: float | None = Field(
        1.4,
        gt=0,
        description=(
            "A change window leaves out the older events of users whose events since the "
            "change the job's base version predicts with an RMSE at least this many times "
            "the window's (3 events or more): they are learnt from the change on; none: "
            "every user's older events may be sampled."
        ),
    )
    factors: int = Field(8, ge=1, le=512, description="Latent factors of the trained model.")
    learning_rate: float = Field(0.05, gt=0, description="SGD learning rate of a job.")
    regularization: float = Field(0.1, ge=0, description="L2 regularization of a job's SGD.")
    item_bias_support: float = Field(
        20.0,
        ge=0,
        description=(
            "A trained version's item biases and factors are damped by n / (n + this), n the "
            "item's ratings in the job's window, so that an item rated once at 5 stars does "
            "not top every list; 0 keeps them as trained."
        ),
    )
    batch_size: int = Field(1024, ge=1, description="Ratings per SGD minibatch.")
    max_epochs: int = Field(30, ge=1, description="Most epochs a job runs.")
    target_loss: float | None = Field(
        None,
        gt=0,
        description=(
            "A job has converged once its loss stayed below this for a few epochs (none: "
            "once the loss stops improving)."
        ),
    )
    latency_cap_seconds: float = Field(
        120.0,
        gt=0,
        description=(
            "A job's deadline: it stops once this many seconds have passed. GP-OPT picks "
            "the cheapest config that meets each epoch's share of it, so a job takes about "
            "as long as this allows: at 600 s a refresh could take ten minutes to reflect "
            "new data. 120 s keeps a refresh within two minutes of its trigger. driftline demo "
            "(local runtime, with DRIFT_LATENCY_CAP_SECONDS 30): post-onset RMSE 0.8691 and "
            "hit-rate@10 0.027 for $0.0014 of jobs, against 0.8699-0.8709 and 0.017-0.023 "
            "for $0.0009-0.0011 at 600 s and none, and static's 0.8707 and 0.026 for "
            "$0.0095; refreshes took 10-25 s (600 s: 11-56 s, static: 8-29 s)."
        ),
    )
    drift_latency_cap_seconds: float | None = Field(
        30.0,
        gt=0,
        description=(
            "A drift-triggered job's deadline where tighter than LATENCY_CAP_SECONDS (None: "
            "the same): until it swaps in, the model that drifted serves. GP-OPT meets it "
            "with more workers; on functions that costs little more (bench policies: a "
            "20 s drift deadline against 120 s made drift jobs 1.7-6x faster than "
            "cost-aware's jobs, for a 9-26 % dearer adwin bill; 25 s: 1.7-4.7x, 30 s: "
            "1.5-3.9x, the tighter the dearer by the workers' requests). 30 s: on driftline demo "
            "drift jobs took 10-27 s (at none: 8-32 s) and one of a 22,700-event "
            "window bought workers to keep it, $0.0007."
        ),
    )
    drift_preempts_jobs: bool = Field(
        True,
        description=(
            "A drift alert that finds a scheduled job (a refresh) running stops it after its "
            "epoch in flight, unpublished and recorded 'preempted', and its drift job starts "
            "at once; false: the drift job waits for that job to end. Bootstrap, drift and "
            "manual jobs always run to the end."
        ),
    )
    retrain_budget_usd: float | None = Field(
        None, gt=0, description="Stop a job once its workers have cost this much (USD)."
    )
    seed: int | None = Field(
        0, description="Seed of jobs' shuffling and sampling and of the ANN index."
    )
    retrain_runtime: Literal["inprocess", "local", "lambda", "gpu", "ray", "sim", "thread"] = Field(
        "local",
        description=(
            "Where epochs run: this process, Lambda-like worker processes, the deployed "
            "Lambda function, torch worker processes, tasks on a Ray cluster (RAY_ADDRESS), "
            "in this process with simulated Lambda timings and bill, or workers on threads "
            "of this process."
        ),
    )
    retrain_worker_kinds: str | None = Field(
        None,
        description=(
            "The worker kinds GP-OPT may pick per epoch, comma-separated: lambda (the "
            "RETRAIN_RUNTIME's workers), inprocess (this process, for windows so small "
            "that start-ups dominate), gpu-a10g, gpu-l4, gpu-a100, gpu-h100 (torch workers "
            "with a GPU each: Ray tasks where RETRAIN_RUNTIME=ray, else worker processes "
            "on this machine). None: what this deployment can run: lambda and inprocess "
            "(lambda alone on sim), and the GPU types of the Ray cluster or of this "
            "machine's NVIDIA driver where torch is installed (docs/architecture.md)."
        ),
    )
    lambda_function: str = Field(
        "driftline-worker", description="The deployed worker (RETRAIN_RUNTIME=lambda)."
    )
    ray_address: str | None = Field(
        None,
        description=(
            "RETRAIN_RUNTIME=ray: the Ray cluster its workers run on (ray://head:10001, or "
            "auto for the cluster this machine is a node of); none: Ray's own RAY_ADDRESS, "
            "else a local Ray instance on this machine's cores."
        ),
    )
    retrain_policy: str = Field(
        "adwin",
        description=(
            "When to retrain: a name in retrain.policies.POLICIES (adwin, best-effort, "
            "cost-aware, continuum, periodic, never)."
        ),
    )
    retrain_interval_s: float = Field(
        300.0,
        gt=0,
        description="RETRAIN_POLICY=cost-aware: seconds between batch retrains (SandPiper: 5 min).",
    )
    continuum_weight: float = Field(
        10.0,
        gt=0,
        description=(
            "RETRAIN_POLICY=continuum: w in 'retrain when the pending data's latency regret "
            "exceeds w x the fixed cost of a retrain'; larger waits longer, retrains less."
        ),
    )
    periodic_events: int = Field(
        10_000, ge=1, description="RETRAIN_POLICY=periodic: labelled events between retrains."
    )
    retrain_configurator: str = Field(
        "gp",
        description=(
            "Who picks each epoch's config vector: a name in configurator.CONFIGURATORS "
            "(gp: GP-OPT, the cheapest config that meets the deadline, so a job takes "
            "about as long as LATENCY_CAP_SECONDS allows, and a drift alert pre-empts a "
            "refresh (DRIFT_PREEMPTS_JOBS); static: the RETRAIN_WORKERS, "
            "RETRAIN_MEMORY_MB, ... defaults every epoch)."
        ),
    )
    retrain_configurator_process: bool = Field(
        True,
        description=(
            "Run GP-OPT's decisions and refits in a child process of the service rather "
            "than beside /recommend's threads under one interpreter lock (bench serve: "
            "p99 under ingestion and a retrain 440 ms in process)."
        ),
    )
    retrain_sync: str = Field(
        "selective",
        description="How epochs synchronise workers: bsp, selective (κ of λ) or asp.",
    )
    retention_versions: int = Field(
        20,
        ge=1,
        description=(
            "Model versions whose artifacts are kept; older ones are deleted from the object "
            "store (never the serving one, the first one, or one a running job builds on)."
        ),
    )
    retrain_workers: int = Field(
        4, ge=1, le=1000, description="Workers per epoch (λ) of the config vector jobs start from."
    )
    retrain_sync_ratio: float = Field(
        0.75,
        gt=0,
        le=1,
        description=(
            "Share of an epoch's workers whose updates it waits for (κ/λ, selective sync) "
            "in the config vector jobs start from."
        ),
    )
    retrain_memory_mb: int = Field(
        1024,
        ge=128,
        le=10_240,
        description="Memory of each worker in MB in the config vector jobs start from.",
    )

    @field_validator("retrain_worker_kinds")
    @classmethod
    def _known_kinds(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from configurator.space import KINDS

        names = [n.strip() for n in value.split(",") if n.strip()]
        unknown = sorted(set(names) - set(KINDS))
        if not names or unknown:
            raise ValueError(f"unknown worker kinds {unknown or value!r}; choose from {KINDS}")
        return ",".join(dict.fromkeys(names))

    @property
    def worker_kinds(self) -> tuple[str, ...] | None:
        """``retrain_worker_kinds`` as a tuple (None: the deployment's own)."""
        value = self.retrain_worker_kinds
        return None if value is None else tuple(value.split(","))

    @field_validator("retrain_policy", "retrain_configurator", "retrain_sync")
    @classmethod
    def _registered_choice(cls, value: str, info: ValidationInfo) -> str:
        return check_registered(info.field_name or "", value)
