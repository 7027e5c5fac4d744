"""The local runtime behaves and bills like Lambda, with real worker processes."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator

import pytest

from functions.pricing import lambda_prices
from functions.runtimes import (
    ERROR,
    OK,
    OUT_OF_MEMORY,
    TIMEOUT,
    LocalRuntime,
    open_runtime,
)

pytestmark = pytest.mark.slow

WORKERS = "tests.functions.runtime_workers"


@pytest.fixture
def runtime() -> Iterator[LocalRuntime]:
    with LocalRuntime(concurrency=2, handler=f"{WORKERS}:echo") as local:
        yield local


def test_first_invocation_is_cold_and_the_next_reuses_the_warm_container(
    runtime: LocalRuntime,
) -> None:
    first = runtime.submit({"n": 1}, memory_mb=512, timeout_s=30).result()
    second = runtime.submit({"n": 2}, memory_mb=512, timeout_s=30).result()
    assert first.status == OK and first.result["echo"] == {"n": 1}
    assert first.cold_start and not second.cold_start
    assert first.result["pid"] == second.result["pid"]
    assert 0 < second.result["remaining_ms"] <= 30_000
    assert second.result["memory_mb"] == 512
    other_size = runtime.submit({}, memory_mb=1024, timeout_s=30).result()
    assert other_size.cold_start  # containers are per memory size, as per function config


def test_billing_is_lambdas_gb_seconds_per_started_ms_plus_the_request(
    runtime: LocalRuntime,
) -> None:
    cold = runtime.submit({}, memory_mb=1769, timeout_s=30).result()
    warm = runtime.submit({}, memory_mb=1769, timeout_s=30).result()
    prices = lambda_prices()
    # A cold start's initialisation is billed with its duration, as Lambda does.
    assert cold.cold_start and cold.init_duration_s > 0 and warm.init_duration_s == 0
    for record in (cold, warm):
        billed = math.ceil((record.duration_s + record.init_duration_s) * 1000)
        assert record.billed_ms == billed
        expected = billed / 1000 * 1769 / 1024 * prices.gb_second_usd + prices.request_usd
        assert record.cost_usd == pytest.approx(expected)
    assert runtime.records[-2:] == [cold, warm]


def test_provisioned_containers_start_warm(runtime: LocalRuntime) -> None:
    assert runtime.provision(512, 2) == 2
    first = runtime.submit({}, memory_mb=512, timeout_s=30)
    second = runtime.submit({}, memory_mb=512, timeout_s=30)
    records = [first.result(), second.result()]
    assert [r.cold_start for r in records] == [False, False]
    assert records[0].result["pid"] != records[1].result["pid"]  # two containers ran them
    assert runtime.submit({}, memory_mb=1024, timeout_s=30).result().cold_start
    with pytest.raises(ValueError, match="count"):
        runtime.provision(512, -1)


def test_a_container_that_cannot_start_fails_its_invocation_without_raising() -> None:
    with LocalRuntime(concurrency=1, handler="functions.no_such_module:handler") as local:
        record = local.submit({}, memory_mb=256, timeout_s=30).result()
    assert record.status == ERROR and "container failed to start" in record.error
    assert record.cost_usd == 0.0


def test_invocations_beyond_the_concurrency_cap_queue_unbilled() -> None:
    with LocalRuntime(concurrency=1, handler=f"{WORKERS}:sleep") as local:
        warm = local.submit({"seconds": 0.0}, memory_mb=256, timeout_s=30).result()
        assert warm.ok
        first = local.submit({"seconds": 0.5}, memory_mb=256, timeout_s=30)
        second = local.submit({"seconds": 0.5}, memory_mb=256, timeout_s=30)
        a, b = first.result(), second.result()
    assert a.ok and b.ok and not b.cold_start
    assert b.queued_s >= 0.4  # it waited for the only slot...
    assert b.duration_s < 1.0 and b.billed_ms < 1000  # ...and the wait was not billed


def test_the_time_limit_is_enforced_and_the_container_discarded() -> None:
    with LocalRuntime(concurrency=1, handler=f"{WORKERS}:sleep") as local:
        started = time.perf_counter()
        record = local.submit({"seconds": 30}, memory_mb=256, timeout_s=1).result()
        assert time.perf_counter() - started < 20
        assert record.status == TIMEOUT and record.billed_ms >= 1000
        after = local.submit({"seconds": 0}, memory_mb=256, timeout_s=10).result()
        assert after.ok and after.cold_start


def test_the_memory_limit_is_enforced() -> None:
    with LocalRuntime(concurrency=1, handler=f"{WORKERS}:hog") as local:
        small = local.submit({"mb": 1}, memory_mb=1024, timeout_s=30).result()
        assert small.ok and small.peak_rss_mb < 1024
        record = local.submit({"mb": 700}, memory_mb=512, timeout_s=30).result()
    assert record.status == OUT_OF_MEMORY
    assert "of 512 MB" in (record.error or "")


def test_a_failing_handler_fails_the_invocation_not_the_container() -> None:
    with LocalRuntime(concurrency=1, handler=f"{WORKERS}:fail") as local:
        first = local.submit({}, memory_mb=256, timeout_s=10).result()
        second = local.submit({}, memory_mb=256, timeout_s=10).result()
    assert first.status == ERROR and "ValueError: bad shard" in (first.error or "")
    assert not second.cold_start


def test_bad_configurations_are_refused_with_their_limits() -> None:
    with LocalRuntime(concurrency=1, handler=f"{WORKERS}:echo") as local:
        with pytest.raises(ValueError, match="128..10240"):
            local.submit({}, memory_mb=64, timeout_s=10)
        with pytest.raises(ValueError, match="timeout_s"):
            local.submit({}, memory_mb=256, timeout_s=901)
    with pytest.raises(ValueError, match="unknown runtime"):
        open_runtime("mainframe")


def test_injected_stragglers_run_and_bill_slower() -> None:
    factors = iter([1.0, 4.0])
    with LocalRuntime(
        concurrency=1, handler=f"{WORKERS}:sleep", slowdown=lambda: next(factors)
    ) as local:
        normal = local.submit({"seconds": 0.3}, memory_mb=256, timeout_s=30).result()
        slow = local.submit({"seconds": 0.3}, memory_mb=256, timeout_s=30).result()
    assert normal.labels["slowdown"] == 1.0 and slow.labels["slowdown"] == 4.0
    assert slow.duration_s >= 3 * normal.duration_s * 0.8
    assert slow.cost_usd > normal.cost_usd


@pytest.mark.skipif(not hasattr(os, "nice"), reason="os.nice is POSIX")
def test_containers_run_below_the_services_cpu_priority() -> None:
    """Retraining workers on the serving machine yield the cores to requests."""
    handler = f"{WORKERS}:niceness"
    niceness = {}
    for lowered in (7, 0):
        with LocalRuntime(concurrency=1, handler=handler, niceness=lowered) as local:
            niceness[lowered] = local.submit({}, memory_mb=256, timeout_s=30).result().result
    assert niceness[7] == {"niceness": min(os.nice(0) + 7, 19)}
    assert niceness[0] == {"niceness": os.nice(0)}
