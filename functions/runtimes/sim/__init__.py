"""The ``sim`` runtime: Lambda workers as a discrete-event simulation in virtual time.

Nothing runs. Each invocation's duration comes from a :class:`PerformanceModel`
(:mod:`functions.performance`, shared with the configurator), fitted on measured runs
with :func:`calibrate`, so a thousand workers and their stragglers, cold starts, time
limits and bill take a fraction of a second instead of the real minutes.
The configurator and the cost benchmarks use it to try configurations nobody paid for.

Model of one invocation (see ``docs/simulator.md`` for the fit and its measured error)::

    duration = [cold] cold_start_s
             + slowdown * ( overhead_s
                          + requests * request_latency_s + bytes / bandwidth_bytes_per_s
                          + (samples * compute_s_per_sample
                             + batches * compute_s_per_batch) / cpu_share(memory_mb) )

    cpu_share(memory_mb) = min(memory_mb / mb_per_vcpu, max_vcpus, worker_vcpus)

* Lambda gives one vCPU per 1,769 MB (``mb_per_vcpu`` from ``functions/prices.json``),
  at most 6. The numpy worker is effectively single-threaded (``worker_vcpus=1``): below
  1,769 MB its compute slows in proportion to the CPU share, above it gains nothing.
  The fixed overhead and the object-store I/O are not scaled.
* ``slowdown`` is drawn per invocation from the runtime's seeded generator: a straggler
  (probability ``straggler_p``) runs ``uniform(*straggler_slowdown)`` times slower, and
  every invocation carries a mean-one log-normal jitter of ``jitter_sigma``.
* A container's first invocation is a cold start; containers are per memory size and
  stay warm ``keep_warm_s`` after their last invocation, as in the local runtime.
* At most ``concurrency`` invocations run at once; the rest queue (``queued_s``) unbilled.
* An invocation that would overrun its time limit stops early, as the worker does
  (:mod:`functions.handler`, ``time_margin_s``): it ends ``time_margin_s`` before the
  limit with status ``ok`` and ``labels["stopped_early"]`` true. Only when even its fixed
  part passes the limit, or with ``stop_early=False`` (what the local runtime's injected
  stragglers do: they sleep after the handler returned), is its status ``timeout``.
* Billing is Lambda's, from :mod:`functions.pricing`: GB-seconds per started millisecond
  of the virtual duration plus the request price.

Virtual time
------------
:meth:`SimRuntime.submit` starts (or queues) an invocation at the runtime's virtual
``clock.now`` and returns a :class:`SimFuture`. Futures complete in virtual-time order
when the simulation advances, which it does when somebody waits: ``future.result()``,
``concurrent.futures.wait`` (any ``return_when``) and ``as_completed`` all advance it, one
completion at a time, until what they wait for is done. So a caller written for a real
runtime, such as the coordinator, runs on it unchanged. Real-time ``timeout`` arguments
have no meaning here: a wait advances virtual time to the next completion at once.
:meth:`SimRuntime.step`, :meth:`SimRuntime.advance_to` and :meth:`SimRuntime.run` drive
the simulation explicitly.

The worker's result is not computed: records carry ``result=None``. The work of an
invocation comes from ``samples_of(payload)``; by default (:class:`StoreWork`) the
shard named by the worker event is read from the object store for its sample count. A
``samples=`` label overrides that. With ``write_deltas=True`` each successful invocation
writes an empty delta (no rows) under the event's ``delta_key``, so that a coordinator
that reads deltas runs end to end, its model unchanged: timing and cost only.

GPU containers (:mod:`functions.runtimes.sim.gpu`) are the torch worker's seconds on one
GPU (fixed, per-sample and per-batch seconds, calibrated from its measured speed-ups over
the numpy worker), a container's start-up, and EC2's per-second bill for being held;
:func:`simulate_gpu_epochs` times synchronous epochs on them.

The VM baselines (:mod:`functions.runtimes.sim.vm`) run the same per-sample compute
in the same virtual time on a peak-sized VM or an autoscaled fleet, billed for being up.

:func:`simulate_epochs` replays the coordinator's κ-of-λ epochs (BSP, selective, ASP)
directly, without a store or a model, for configuration searches.

>>> model = PerformanceModel(compute_s_per_sample=1e-5, overhead_s=0.1, cold_start_s=0.5)
>>> with SimRuntime(model) as sim:
...     first = sim.submit({}, memory_mb=1769, timeout_s=60, samples=100_000).result()
...     second = sim.submit({}, memory_mb=1769, timeout_s=60, samples=100_000).result()
>>> round(first.duration_s, 3), first.cold_start, round(second.duration_s, 3), sim.clock.now
(1.6, True, 1.1, 2.7)
"""

from functions.gpu_performance import GpuKind, GpuModel, fit_gpu_model, gpu_kind, gpu_kinds
from functions.performance import (
    DEFAULT_MODEL,
    CalibrationFit,
    PerformanceModel,
    Work,
    calibrate,
    fit_performance_model,
)
from functions.runtimes.base import register_runtime
from functions.runtimes.sim.bill import FunctionBill, function_bill
from functions.runtimes.sim.clock import SimFuture, VirtualClock
from functions.runtimes.sim.epochs import EpochTiming, Simulation, simulate_epochs
from functions.runtimes.sim.gpu import GpuSimulation, simulate_gpu_epochs
from functions.runtimes.sim.runtime import SimRuntime
from functions.runtimes.sim.vm import AutoscaledFleet, PeakSizedVm
from functions.runtimes.sim.work import StoreWork, UncostablePayload

__all__ = [
    "AutoscaledFleet",
    "FunctionBill",
    "GpuKind",
    "GpuModel",
    "GpuSimulation",
    "PeakSizedVm",
    "function_bill",
    "DEFAULT_MODEL",
    "CalibrationFit",
    "EpochTiming",
    "PerformanceModel",
    "SimFuture",
    "SimRuntime",
    "Simulation",
    "StoreWork",
    "UncostablePayload",
    "VirtualClock",
    "Work",
    "calibrate",
    "fit_gpu_model",
    "fit_performance_model",
    "gpu_kind",
    "gpu_kinds",
    "simulate_epochs",
    "simulate_gpu_epochs",
]

register_runtime("sim", SimRuntime)
