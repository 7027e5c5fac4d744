"""Retraining jobs: list, inspect, start by hand."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.concurrency import run_in_threadpool

from retrain.lifecycle import JobAlreadyRunning, NothingToTrain
from service.api.deps import DatabaseDep, ReadsDep, TriggerDep
from service.api.schemas import (
    MAX_JOB_ID,
    ErrorPublic,
    JobPublic,
    JobsPublic,
    RetrainAccepted,
    answers,
)
from service.store import Database
from service.store.jobs import get_job, list_jobs
from service.store.leases import NotLeaseHolder
from service.stream.requests import (
    ANSWER_WAIT_S,
    STARTED,
    UNANSWERED,
    RequestAnswer,
    answer_to,
    ask,
    give_up,
)

router = APIRouter(tags=["jobs"])

#: Seconds between looks at a request the leader has not answered yet.
ANSWER_POLL_S = 0.05
#: ``Retry-After`` of a 503 when no leader answered, seconds.
RETRY_AFTER_S = 1

_RETRAIN_ANSWERS: dict[int | str, dict[str, Any]] = {
    **answers(409),
    503: {
        "model": ErrorPublic,
        "description": "The database is unreachable, or no leader answered the request "
        f"within {ANSWER_WAIT_S:g} s (see Retry-After).",
    },
}


@router.get("/jobs", response_model=JobsPublic, responses=answers(422, 503))
def jobs(db: DatabaseDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> JobsPublic:
    with db.connect() as conn:
        rows = list_jobs(conn, limit)
    return JobsPublic(jobs=[JobPublic.from_record(row) for row in rows])


@router.get("/jobs/{job_id}", response_model=JobPublic, responses=answers(404, 422, 503))
def job(db: DatabaseDep, job_id: Annotated[int, Path(ge=1, le=MAX_JOB_ID)]) -> JobPublic:
    with db.connect() as conn:
        row = get_job(conn, job_id)
    if row is None:
        raise HTTPException(404, f"no retraining job {job_id}")
    return JobPublic.from_record(row)


@router.post(
    "/retrain", response_model=RetrainAccepted, status_code=202, responses=_RETRAIN_ANSWERS
)
async def retrain(trigger: TriggerDep, reads: ReadsDep, db: DatabaseDep) -> RetrainAccepted:
    """Start a job now, on any replica. The leader starts it at once; another replica
    asks the leader through the database and answers with the leader's answer: the job
    it started, 409 when one runs or nothing is stored, 503 with ``Retry-After`` when
    no leader answered within ``ANSWER_WAIT_S``."""
    try:
        job_id = await run_in_threadpool(trigger.retrain_now)
    except NotLeaseHolder:
        replica = reads.cluster_status()["replica_id"]
        answer = await _ask_the_leader(db, replica)
        if answer.status == STARTED and answer.job_id is not None:
            return RetrainAccepted(job_id=answer.job_id, status="started")
        headers = {"Retry-After": str(RETRY_AFTER_S)} if answer.status == UNANSWERED else None
        raise HTTPException(answer.status, answer.refusal, headers=headers) from None
    except JobAlreadyRunning as exc:
        raise HTTPException(409, str(exc)) from exc
    except NothingToTrain as exc:
        raise HTTPException(409, str(exc)) from exc
    return RetrainAccepted(job_id=job_id, status="started")


async def _ask_the_leader(db: Database, replica: str) -> RequestAnswer:
    """Store a request and wait for the leader's answer, ``ANSWER_WAIT_S`` at most."""
    request_id = await run_in_threadpool(ask, db, replica)
    deadline = time.monotonic() + ANSWER_WAIT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(ANSWER_POLL_S)
        answer = await run_in_threadpool(answer_to, db, request_id)
        if answer is not None:
            return answer
    return await run_in_threadpool(give_up, db, request_id)
