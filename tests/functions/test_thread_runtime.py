"""The ``thread`` runtime: the real worker on threads, billed, with deadlines."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from functions.runtimes import ERROR, OK, TIMEOUT, ThreadRuntime, open_runtime
from tests.functions.test_handler import Problem, problem  # noqa: F401 - fixture


def test_it_runs_the_worker_and_bills_like_lambda(problem: Problem) -> None:  # noqa: F811
    event = problem.event(problem.shard(0, 1, np.ones(len(problem.ratings), dtype=bool)))
    with open_runtime("thread", concurrency=2) as runtime:
        record = runtime.submit(event, memory_mb=1769, timeout_s=60, worker=0).result()
    assert record.status == OK, record.error
    assert record.result is not None and record.result["loss_after"] < record.result["loss_before"]
    assert problem.store.exists(event["delta_key"])
    assert record.billed_ms == int(np.ceil(record.duration_s * 1000))
    expected = record.billed_ms / 1000 * 1769 / 1024 * 0.0000166667 + 0.0000002
    assert record.cost_usd == pytest.approx(expected, rel=1e-6)
    assert record.labels == {"worker": 0, "slowdown": 1.0}


def test_a_failing_handler_is_an_error_record_not_an_exception() -> None:
    def broken(event: dict[str, Any], context: Any) -> dict[str, Any]:
        raise RuntimeError("no shard")

    with ThreadRuntime(handler=broken) as runtime:
        record = runtime.submit({}, memory_mb=512, timeout_s=10).result()
    assert record.status == ERROR and "RuntimeError: no shard" in (record.error or "")


def test_a_handler_past_its_deadline_is_a_timeout() -> None:
    def slow(event: dict[str, Any], context: Any) -> dict[str, Any]:
        assert context.get_remaining_time_in_millis() <= 50
        time.sleep(0.1)
        return {"done": True}

    with ThreadRuntime(handler=slow) as runtime:
        record = runtime.submit({}, memory_mb=512, timeout_s=0.05).result()
    assert record.status == TIMEOUT and record.result is None
    assert record.billed_ms >= 100
