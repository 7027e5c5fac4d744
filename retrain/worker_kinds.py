"""Where each worker kind's workers run, and which kinds a deployment offers.

GP-OPT picks a worker kind per epoch (:data:`configurator.space.KINDS`); this module
turns the kind into a place to run:

* ``lambda``: the deployment's function runtime (``RETRAIN_RUNTIME``: the deployed
  Lambda function, local worker processes, Ray tasks, ...), as every job ran before
  kinds existed;
* ``gpu-<type>``: the torch worker (:mod:`functions.gpu`) with a GPU each: on a Ray
  cluster (``RETRAIN_RUNTIME=ray``) a task with ``num_gpus=1``, elsewhere worker
  processes on this machine (the ``gpu`` runtime), billed at the type's list price
  (``functions/prices.json``) either way;
* ``inprocess``: no runtime: the coordinator trains the epoch itself, in the service's
  process (:meth:`retrain.coordinator.DistributedBackend.run_epoch`).

Which kinds a job may pick is ``RETRAIN_WORKER_KINDS``; unset, the kinds this deployment
can run (:func:`available_kinds`): Lambda's and in-process always, a GPU type only where
one is there to run on, so a fresh install never plans a kind it cannot execute.
:class:`KindRouter` is the runtime a job's coordinator submits to: each invocation goes
to its kind's runtime.
"""

from __future__ import annotations

import importlib.util
import re
import weakref
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any

from configurator.space import GPU_KINDS, IN_PROCESS, LAMBDA
from functions.pricing import GpuMeter, gpu_prices
from functions.runtimes import InvocationRecord, Runtime, open_runtime

#: Runtimes whose jobs keep Lambda's kind alone: the simulator's virtual clock cannot
#: time an epoch trained for real in this process, nor has it GPU containers.
LAMBDA_ONLY_RUNTIMES = frozenset({"sim"})
#: Where NVIDIA's driver lists this machine's GPUs, one folder each.
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def gpu_type(device_name: str) -> str | None:
    """The price file's GPU type a device name is, if any.

    >>> gpu_type("NVIDIA L4"), gpu_type("NVIDIA A10G"), gpu_type("NVIDIA L40S")
    ('l4', 'a10g', None)
    """
    for kind in GPU_KINDS:
        name = kind.removeprefix("gpu-")
        if re.search(rf"\b{re.escape(name)}\b", device_name, flags=re.IGNORECASE):
            return name
    return None


def local_gpu_types(root: Path = NVIDIA_GPUS) -> tuple[str, ...]:
    """The price file's GPU types among this machine's GPUs, where the torch worker can
    run (torch installed): read from the driver's listing, without importing torch."""
    if importlib.util.find_spec("torch") is None or not root.is_dir():
        return ()
    found = set()
    for info in root.glob("*/information"):
        for line in info.read_text(errors="replace").splitlines():
            if line.startswith("Model:") and (name := gpu_type(line)) is not None:
                found.add(name)
    return tuple(sorted(found))


def _gpu_types_of(runtime_name: str, base: Runtime) -> tuple[str, ...]:
    """GPU types a deployment can run: its Ray cluster's, else this machine's."""
    if runtime_name == "ray":
        listed = getattr(base, "accelerator_types", None)
        named = listed() if listed is not None else ()
        return tuple(sorted({t for n in named if (t := gpu_type(n)) is not None}))
    return local_gpu_types()


def available_kinds(runtime_name: str, base: Runtime) -> tuple[str, ...]:
    """The kinds a deployment of ``RETRAIN_RUNTIME=runtime_name`` (whose function
    runtime is ``base``) can run: see the module docstring."""
    if runtime_name in LAMBDA_ONLY_RUNTIMES:
        return (LAMBDA,)
    gpus = tuple(f"gpu-{t}" for t in _gpu_types_of(runtime_name, base))
    return (LAMBDA, IN_PROCESS, *gpus)


def _ray_gpu_runtime(prices_name: str, options: Mapping[str, Any]) -> Runtime:
    """Ray tasks with a GPU and a CPU each, billed at the GPU type's list price (the
    instance's vCPUs are in it)."""
    from functions.runtimes.ray import RayPrices, ray_prices

    hour = gpu_prices(prices_name).hour_usd
    prices = RayPrices(0.0, ray_prices().mb_per_vcpu, gpu_hour_usd=hour)
    return open_runtime(
        "ray", address=options.get("address"), num_gpus=1.0, num_cpus=1.0, prices=prices
    )


def _local_gpu_runtime(prices_name: str, options: Mapping[str, Any]) -> Runtime:
    """Torch worker processes on this machine, billed at the GPU type's list price."""
    meter = GpuMeter(gpu_prices(prices_name))
    return open_runtime("gpu", concurrency=options.get("concurrency", 1), prices=meter)


#: How a GPU kind's workers run, by ``RETRAIN_RUNTIME``; other runtimes use
#: :data:`DEFAULT_GPU_RUNTIME`. An entry gets the GPU type and the runtime's options.
GPU_RUNTIMES: dict[str, Callable[[str, Mapping[str, Any]], Runtime]] = {
    "ray": _ray_gpu_runtime,
}
DEFAULT_GPU_RUNTIME = _local_gpu_runtime


def open_gpu_runtime(runtime_name: str, kind: str, options: Mapping[str, Any]) -> Runtime:
    """The runtime of GPU kind ``kind`` in a deployment of ``RETRAIN_RUNTIME=runtime_name``."""
    if kind not in GPU_KINDS:
        raise ValueError(f"{kind!r} is not a GPU kind; choose from {list(GPU_KINDS)}")
    build = GPU_RUNTIMES.get(runtime_name, DEFAULT_GPU_RUNTIME)
    return build(kind.removeprefix("gpu-"), options)


class KindRouter(Runtime):
    """The runtime a job's coordinator submits to: each invocation runs on the runtime of
    its ``kind`` label (Lambda's when it has none), opened on first use by ``open_kind``
    and owned by whoever gave it (the placement keeps them warm across jobs).

    Parameters
    ----------
    open_kind
        The runtime of a worker kind (never called for ``inprocess``, which has none).
    kinds
        The kinds the deployment offers: the only ones a job may run.
    """

    name = "kinds"

    def __init__(self, open_kind: Callable[[str], Runtime], kinds: tuple[str, ...]) -> None:
        self.kinds = kinds
        self._open_kind = open_kind
        self._owners: weakref.WeakKeyDictionary[Future[InvocationRecord], Runtime] = (
            weakref.WeakKeyDictionary()
        )

    def runtime(self, kind: str) -> Runtime:
        """The runtime ``kind``'s workers run on; ValueError for a kind not offered."""
        if kind not in self.kinds or kind == IN_PROCESS:
            raise ValueError(
                f"worker kind {kind!r} has no workers here: this deployment offers "
                f"{list(self.kinds)} (RETRAIN_WORKER_KINDS)"
            )
        return self._open_kind(kind)

    @property
    def clock(self) -> Any:
        """The virtual clock of Lambda's runtime where it has one (the simulator)."""
        return getattr(self.runtime(LAMBDA), "clock", None) if LAMBDA in self.kinds else None

    def submit(
        self, payload: dict[str, Any], memory_mb: int, timeout_s: float = 900.0, **labels: Any
    ) -> Future[InvocationRecord]:
        runtime = self.runtime(str(labels.get("kind", LAMBDA)))
        future = runtime.submit(payload, memory_mb, timeout_s, **labels)
        self._owners[future] = runtime
        return future

    def wait_any(self, futures: Collection[Future[InvocationRecord]]) -> None:
        """Their runtime's wait where all are of one (a simulator's advances its
        clock), else the first of any to complete."""
        owners = {id(r): r for f in futures if (r := self._owners.get(f)) is not None}
        if len(owners) == 1:
            next(iter(owners.values())).wait_any(futures)
        else:
            wait(futures, return_when=FIRST_COMPLETED)

    def close(self) -> None:
        """Nothing: the runtimes are their opener's to close."""
        return None


__all__ = [
    "DEFAULT_GPU_RUNTIME",
    "GPU_RUNTIMES",
    "KindRouter",
    "LAMBDA_ONLY_RUNTIMES",
    "available_kinds",
    "gpu_type",
    "local_gpu_types",
    "open_gpu_runtime",
]
