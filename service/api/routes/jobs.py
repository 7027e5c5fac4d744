"""Retraining jobs: list, inspect, start by hand."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.concurrency import run_in_threadpool

from retrain.lifecycle import JobAlreadyRunning, NothingToTrain
from service.api.deps import DatabaseDep, ReadsDep, TriggerDep
from service.api.schemas import MAX_JOB_ID, JobPublic, JobsPublic, RetrainAccepted, answers
from service.store.jobs import get_job, list_jobs
from service.store.leases import NotLeaseHolder

router = APIRouter(tags=["jobs"])


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
    "/retrain", response_model=RetrainAccepted, status_code=202, responses=answers(409, 503)
)
async def retrain(trigger: TriggerDep, reads: ReadsDep) -> RetrainAccepted:
    """Start a job now. Only the cluster's leader starts jobs: another replica answers
    503 with ``Retry-After``, which a load balancer that retries 503s elsewhere
    (docs/operations.md) turns into the leader's answer."""
    try:
        job_id = await run_in_threadpool(trigger.retrain_now)
    except NotLeaseHolder as exc:
        leader = reads.cluster_status()["leader_id"]
        raise HTTPException(
            503,
            f"this replica does not lead the cluster (the leader is {leader}); "
            "only the leader starts jobs: retry, or send it to the leader",
            headers={"Retry-After": "1"},
        ) from exc
    except JobAlreadyRunning as exc:
        raise HTTPException(409, str(exc)) from exc
    except NothingToTrain as exc:
        raise HTTPException(409, str(exc)) from exc
    return RetrainAccepted(job_id=job_id, status="started")
