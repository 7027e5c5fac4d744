"""Where a job's epochs run: its backend, the function runtimes under it, its configurator.

The runtimes are opened once per process and kept (their containers stay warm); a
spec's runtime picks between training in this process and workers on a runtime. A job
on workers runs each epoch on the worker kind its configurator picked
(:mod:`retrain.worker_kinds`): its coordinator submits through a
:class:`~retrain.worker_kinds.KindRouter` over the runtimes opened here, and its
configurator is told the kinds the deployment offers, so it never picks another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from configurator import Configurator, History, JobContext, make_configurator
from configurator.process import ConfiguratorHost
from configurator.space import LAMBDA
from functions.handler import handler
from functions.mf import BiasedMF
from functions.objectstore import ObjectStore
from functions.runtimes import Runtime, open_runtime
from retrain.backends import InProcessBackend, TrainingBackend
from retrain.coordinator import DistributedBackend
from retrain.spec import JobSpec
from retrain.sync import sync_policy
from retrain.window import RatingsWindow
from retrain.worker_kinds import KindRouter, available_kinds, open_gpu_runtime

#: The most workers a configurator may pick per runtime: Lambda's default concurrency
#: (the sim runtime simulates it); on runtimes of this machine's processes or threads,
#: the spec's own λ, since more than that only contend for its cores.
_MAX_WORKERS = {"lambda": 1000, "sim": 1000}

#: In-flight invocations the local runtime allows per worker: selective sync starts a
#: straggler's shard again while the straggler still runs, as Lambda would.
_LOCAL_CONCURRENCY = 2

#: Runtimes that train in this process, without workers or checkpoints.
IN_PROCESS_BACKENDS: dict[str, Callable[[JobSpec], TrainingBackend]] = {
    "inprocess": lambda spec: InProcessBackend(seed=spec.seed),
}


def coordinator_job(job_id: int) -> str:
    """The coordinator's name for a job: its snapshots, deltas and checkpoint keys."""
    return f"job-{job_id}"


class Placement:
    """Opens the function runtimes jobs need and builds each job's backend and
    configurator.

    Parameters
    ----------
    lambda_function
        The deployed worker the ``lambda`` runtime invokes.
    configurator_host
        Where numeric configurators decide (None: in this process). Not ours to close:
        one host serves every retrainer of the process.
    """

    def __init__(
        self,
        store: ObjectStore,
        store_url: str,
        *,
        lambda_function: str,
        configurator_host: ConfiguratorHost | None,
        ray_address: str | None = None,
    ) -> None:
        self._store = store
        self._store_url = store_url
        self._lambda_function = lambda_function
        self._ray_address = ray_address
        self._configurator_host = configurator_host
        #: The runtimes opened so far, by name.
        self.runtimes: dict[str, Runtime] = {}

    def backend(self, job_id: int, spec: JobSpec) -> TrainingBackend:
        """Where this job's epochs run, as its spec says."""
        in_process = IN_PROCESS_BACKENDS.get(spec.runtime)
        if in_process is not None:
            return in_process(spec)
        return DistributedBackend(
            self.router(spec),
            self._store,
            self._store_url,
            coordinator_job(job_id),
            sync_policy(spec.sync, spec.sync_ratio),
            seed=spec.seed or 0,
        )

    def resumed_backend(self, job_id: int, spec: JobSpec) -> DistributedBackend | None:
        """The coordinator of ``job_id`` as its checkpoint left it; None without one."""
        return DistributedBackend.resume(
            self.router(spec), self._store, self._store_url, coordinator_job(job_id)
        )

    def configurator(
        self, job_id: int, spec: JobSpec, window: RatingsWindow, model: BiasedMF
    ) -> Configurator:
        """The spec's configurator, told what the job is, warm from earlier jobs'
        observations in the object store."""
        train_samples = len(window) - len(window) // 10  # run_training holds out a tenth
        context = JobContext(
            train_samples=max(train_samples, 1),
            factors=spec.factors,
            model_rows=model.n_users + model.n_items,
            latency_cap_s=spec.latency_cap_s,
            budget_usd=spec.budget_usd,
            max_epochs=spec.max_epochs,
            job_id=coordinator_job(job_id),
            max_workers=_MAX_WORKERS.get(spec.runtime, spec.workers),
            kinds=None if spec.runtime in IN_PROCESS_BACKENDS else self.kinds(spec),
        )
        return make_configurator(
            spec.configurator,
            spec.epoch_config(),
            context,
            History(self._store),
            host=self._configurator_host,
        )

    def kinds(self, spec: JobSpec) -> tuple[str, ...]:
        """The worker kinds a job of ``spec`` may run on: the spec's, else what this
        deployment can run (:func:`~retrain.worker_kinds.available_kinds`)."""
        if spec.kinds is not None:
            return spec.kinds
        return available_kinds(spec.runtime, self.runtime(spec))

    def router(self, spec: JobSpec) -> KindRouter:
        """The runtime a job's coordinator submits to: each worker kind's, by label."""
        return KindRouter(lambda kind: self.kind_runtime(spec, kind), self.kinds(spec))

    def kind_runtime(self, spec: JobSpec, kind: str) -> Runtime:
        """The runtime of worker kind ``kind`` (Lambda's: the spec's own), opened once."""
        if kind == LAMBDA:
            return self.runtime(spec)
        key = f"{spec.runtime}:{kind}"
        runtime = self.runtimes.get(key)
        if runtime is None:
            options = self._runtime_options(spec).get(spec.runtime, {})
            runtime = open_gpu_runtime(spec.runtime, kind, options)
            self.runtimes[key] = runtime
        return runtime

    def runtime(self, spec: JobSpec) -> Runtime:
        """The function runtime a spec names, opened once and kept (warm containers)."""
        runtime = self.runtimes.get(spec.runtime)
        if runtime is None:
            options = self._runtime_options(spec).get(spec.runtime, {})
            runtime = open_runtime(spec.runtime, **options)
            self.runtimes[spec.runtime] = runtime
        return runtime

    def _runtime_options(self, spec: JobSpec) -> Mapping[str, Mapping[str, Any]]:
        return {
            "local": {"concurrency": _LOCAL_CONCURRENCY * spec.workers},
            "thread": {"concurrency": _LOCAL_CONCURRENCY * spec.workers},
            "lambda": {"function_name": self._lambda_function},
            "sim": {"execute": handler},
            "ray": {"address": self._ray_address},
        }

    def close(self) -> None:
        """Stop the worker processes of the function runtimes that were started, the
        last opened first (a GPU kind's Ray runtime shares the connection of the one
        opened before it)."""
        for runtime in reversed(list(self.runtimes.values())):
            runtime.close()
        self.runtimes = {}
