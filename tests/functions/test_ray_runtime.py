"""The ray runtime reports tasks of a local Ray instance as the other runtimes report
invocations: cold starts, queueing, time limits, failures and the bill."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from functions.pricing import vm_prices
from functions.runtimes import ERROR, OK, OUT_OF_MEMORY, TIMEOUT, RayRuntime, open_runtime
from functions.runtimes.ray import DEFAULT_HANDLER, GPU_HANDLER, _ray_failure, ray_prices

ray = pytest.importorskip("ray")

WORKERS = "tests.functions.runtime_workers"


def out_of_memory(event: dict, context: Any) -> dict:
    """A handler that runs out of memory (run inside a Ray worker by the test below)."""
    raise MemoryError("cannot allocate the factors")


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    """One small local instance for the module, whatever RAY_ADDRESS says."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_the_first_task_in_a_worker_process_is_cold_and_later_ones_warm() -> None:
    with RayRuntime(handler=f"{WORKERS}:echo") as runtime:
        records = [runtime.submit({"n": n}, memory_mb=512, timeout_s=30).result() for n in range(4)]
    assert all(r.status == OK for r in records)
    assert [r.result["echo"] for r in records] == [{"n": n} for n in range(4)]
    seen: set[int] = set()
    for record in records:  # Ray picks the process; the handler loads once in each
        pid = record.result["pid"]
        assert record.cold_start == (pid not in seen)
        assert record.init_duration_s > 0 if record.cold_start else record.init_duration_s == 0
        seen.add(pid)
    assert 0 < records[-1].result["remaining_ms"] <= 30_000
    assert records[-1].result["memory_mb"] == 512
    assert all(r.peak_rss_mb > 0 for r in records)


def test_the_bill_is_the_reserved_cpus_at_a_c5_vcpus_price() -> None:
    with RayRuntime(handler=f"{WORKERS}:sleep") as runtime:
        record = runtime.submit({"seconds": 0.2}, memory_mb=1769, timeout_s=30).result()
    assert record.ok and record.duration_s >= 0.2
    billed_s = record.duration_s + record.init_duration_s
    assert record.billed_ms == pytest.approx(billed_s * 1000, abs=1)
    vcpu_second = vm_prices("c5").vcpu_hour_usd / 3600
    assert record.cost_usd == pytest.approx(record.billed_ms / 1000 * 1.0 * vcpu_second)
    # A task's CPUs are Lambda's share of its memory, in amounts Ray accepts.
    prices = ray_prices()
    assert (prices.cpus(512), prices.cpus(1769), prices.cpus(3008)) == (0.2894, 1.0, 2.0)


def test_tasks_that_find_no_free_cpu_queue_unbilled() -> None:
    with RayRuntime(handler=f"{WORKERS}:sleep", num_cpus=1) as runtime:
        assert runtime.submit({"seconds": 0}, memory_mb=256, timeout_s=30).result().ok
        futures = [runtime.submit({"seconds": 1.0}, memory_mb=256, timeout_s=30) for _ in range(3)]
        records = [f.result() for f in futures]
    assert all(r.ok for r in records)
    last = max(records, key=lambda r: r.queued_s)
    assert last.queued_s >= 0.8  # two CPUs: the third waited for one...
    assert last.duration_s < 1.5 and last.billed_ms < 1500 + 1000 * last.init_duration_s


def test_a_task_past_its_time_limit_is_cancelled_and_reported_as_a_timeout() -> None:
    with RayRuntime(handler=f"{WORKERS}:sleep") as runtime:
        started = time.perf_counter()
        record = runtime.submit({"seconds": 60}, memory_mb=256, timeout_s=1).result()
        assert time.perf_counter() - started < 20
        after = runtime.submit({"seconds": 0}, memory_mb=256, timeout_s=10).result()
    assert record.status == TIMEOUT and record.result is None
    assert record.duration_s >= 1.0 and record.billed_ms >= 1000 and record.cost_usd > 0
    assert after.ok  # the cluster goes on


def test_a_failing_handler_fails_the_invocation_with_its_message() -> None:
    with RayRuntime(handler=f"{WORKERS}:fail") as runtime:
        first = runtime.submit({}, memory_mb=256, timeout_s=10).result()
        second = runtime.submit({}, memory_mb=256, timeout_s=10).result()
    assert first.status == ERROR and "ValueError: bad shard" in (first.error or "")
    assert second.status == ERROR and first.result is None


def test_a_handler_that_cannot_load_fails_its_invocation_without_raising() -> None:
    with RayRuntime(handler="functions.no_such_module:handler") as runtime:
        record = runtime.submit({}, memory_mb=256, timeout_s=10).result()
    assert record.status == ERROR and "handler failed to load" in (record.error or "")
    assert record.cost_usd == 0.0


def test_running_out_of_memory_is_reported_as_such() -> None:
    handler = "tests.functions.test_ray_runtime:out_of_memory"
    with RayRuntime(handler=handler) as runtime:
        record = runtime.submit({}, memory_mb=256, timeout_s=10).result()
    assert record.status == OUT_OF_MEMORY and "cannot allocate" in (record.error or "")
    # Ray's memory monitor killing a task on a full node says so too.
    killed = ray.exceptions.OutOfMemoryError("Task was killed due to the node running low")
    assert _ray_failure(ray, killed)[0] == OUT_OF_MEMORY
    assert _ray_failure(ray, ray.exceptions.WorkerCrashedError())[0] == ERROR


def test_a_task_the_cluster_cannot_place_fails_naming_what_it_asked_for() -> None:
    with RayRuntime(handler=f"{WORKERS}:echo", max_queue_s=1.0) as runtime:
        record = runtime.submit({}, memory_mb=10_240, timeout_s=10).result()  # 6 CPUs of 2
    assert record.status == ERROR
    assert "not started within 1.0 s" in (record.error or "") and "num_cpus=6.0" in record.error
    assert record.cost_usd == 0.0


def test_the_runtime_is_registered_by_name() -> None:
    with open_runtime("ray", handler=f"{WORKERS}:echo") as runtime:
        assert runtime.name == "ray"
        assert runtime.submit({}, memory_mb=128, timeout_s=10).result().ok
    with pytest.raises(ValueError, match="num_cpus"):
        RayRuntime(num_gpus=-1)
    with RayRuntime(num_gpus=1) as gpu, RayRuntime() as cpu:  # nothing submitted
        assert gpu.handler == GPU_HANDLER and cpu.handler == DEFAULT_HANDLER
