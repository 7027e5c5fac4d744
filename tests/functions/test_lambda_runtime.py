"""The ``lambda`` runtime against botocore's Stubber, on the worker's real events.

AWS Lambda itself cannot run here; the Stubber checks that the runtime sends exactly
the event the ``local`` runtime hands to the same handler, and answers with what the
real handler returns for it, wrapped the way Lambda wraps it.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import boto3
import numpy as np
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from functions.handler import handler
from functions.runtimes import OK, OUT_OF_MEMORY, TIMEOUT, LambdaRuntime, LocalRuntime
from tests.functions.test_handler import Problem, problem  # noqa: F401 - fixture

FUNCTION = "driftline-worker"


def _report(request_id: str, duration_ms: float, billed_ms: int, memory: int, cold: bool) -> str:
    line = (
        f"REPORT RequestId: {request_id}\tDuration: {duration_ms} ms\t"
        f"Billed Duration: {billed_ms} ms\tMemory Size: {memory} MB\tMax Memory Used: 91 MB"
    )
    return line + ("\tInit Duration: 250.5 ms" if cold else "") + "\n"


def _invoke_response(body: dict, log: str, function_error: str | None = None) -> dict:
    data = json.dumps(body).encode()
    response = {
        "StatusCode": 200,
        "Payload": StreamingBody(io.BytesIO(data), len(data)),
        "LogResult": base64.b64encode(log.encode()).decode(),
        "ExecutedVersion": "$LATEST",
    }
    if function_error:
        response["FunctionError"] = function_error
    return response


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[object, Stubber]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    lam = boto3.client("lambda", region_name="us-east-1")
    with Stubber(lam) as stubber:
        stubber.add_response(
            "get_function_configuration", {"MemorySize": 1024}, {"FunctionName": FUNCTION}
        )
        yield lam, stubber
        stubber.assert_no_pending_responses()


def _expect_invoke(stubber: Stubber, event: dict, response: dict) -> None:
    stubber.add_response(
        "invoke",
        response,
        {
            "FunctionName": FUNCTION,
            "InvocationType": "RequestResponse",
            "LogType": "Tail",
            "Payload": json.dumps(event).encode(),
        },
    )


def test_sends_the_workers_event_and_bills_from_lambdas_report(
    client: tuple[object, Stubber],
    problem: Problem,  # noqa: F811
) -> None:
    lam, stubber = client
    event = problem.event(problem.shard(0, 1, np.ones(len(problem.ratings), dtype=bool)))
    answer = handler(dict(event), None)  # what the deployed worker returns for it
    _expect_invoke(stubber, event, _invoke_response(answer, _report("r-1", 812.3, 813, 1024, True)))
    with LambdaRuntime(FUNCTION, client=lam) as runtime:
        record = runtime.submit(event, memory_mb=1024, timeout_s=900).result()
    assert record.status == OK and record.result == answer
    assert record.request_id == "r-1" and record.cold_start
    assert record.init_duration_s > 0  # from the REPORT line's Init Duration
    assert record.billed_ms == 813 and record.peak_rss_mb == 91
    expected = 0.813 * 1024 / 1024 * 0.0000166667 + 0.0000002
    assert record.cost_usd == pytest.approx(expected)


@pytest.mark.slow
def test_the_local_runtime_hands_the_handler_the_same_event(
    problem: Problem,  # noqa: F811
) -> None:
    event = problem.event(problem.shard(0, 1, np.ones(len(problem.ratings), dtype=bool)))
    with LocalRuntime(concurrency=1, handler="tests.functions.runtime_workers:echo") as local:
        echoed = local.submit(event, memory_mb=512, timeout_s=60).result()
    assert echoed.result["echo"] == event  # the payload arrives unchanged, as JSON would


def test_a_new_memory_size_updates_the_function_first(client: tuple[object, Stubber]) -> None:
    lam, stubber = client
    stubber.add_response(
        "update_function_configuration",
        {"MemorySize": 2048},
        {"FunctionName": FUNCTION, "MemorySize": 2048},
    )
    stubber.add_response(
        "get_function_configuration",
        {"State": "Active", "LastUpdateStatus": "Successful", "MemorySize": 2048},
        {"FunctionName": FUNCTION},
    )
    _expect_invoke(stubber, {"n": 1}, _invoke_response({}, _report("r", 5.0, 5, 2048, False)))
    with LambdaRuntime(FUNCTION, client=lam) as runtime:
        record = runtime.submit({"n": 1}, memory_mb=2048).result()
    assert record.ok and not record.cold_start and record.memory_mb == 2048


@pytest.mark.parametrize(
    ("error", "status"),
    [
        ({"errorMessage": "2026-11-21 Task timed out after 900.00 seconds"}, TIMEOUT),
        ({"errorType": "Runtime.OutOfMemory", "errorMessage": "out of memory"}, OUT_OF_MEMORY),
        ({"errorType": "EventError", "errorMessage": "event field 'epoch': bad"}, "error"),
    ],
)
def test_function_errors_map_to_lambdas_outcomes(
    client: tuple[object, Stubber], error: dict, status: str
) -> None:
    lam, stubber = client
    response = _invoke_response(error, _report("r", 9.0, 9, 1024, False), "Unhandled")
    _expect_invoke(stubber, {"n": 2}, response)
    with LambdaRuntime(FUNCTION, client=lam) as runtime:
        record = runtime.submit({"n": 2}, memory_mb=1024).result()
    assert record.status == status and record.error == error["errorMessage"]
    assert record.result is None and record.cost_usd > 0


def test_api_failures_fail_the_invocation_not_the_caller(
    client: tuple[object, Stubber],
) -> None:
    lam, stubber = client
    stubber.add_client_error("invoke", "TooManyRequestsException", "Rate exceeded", 429)
    with LambdaRuntime(FUNCTION, client=lam) as runtime:
        record = runtime.submit({"n": 3}, memory_mb=1024).result()
    assert record.status == "error" and "TooManyRequests" in (record.error or "")
