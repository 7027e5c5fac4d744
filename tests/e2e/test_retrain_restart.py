"""``kill -9`` of ``driftline serve`` in the middle of a distributed retraining job.

The restarted server resumes the job from the coordinator's last checkpoint: the job
record keeps every epoch once, in order, and ends with a published version that serves.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.launcher import ServerProcess
from tests.support.synthetic import stationary_stream

pytestmark = pytest.mark.slow

SETTINGS = {
    "DRIFTLINE_RETRAIN_ENABLED": "false",  # only the job this test asks for
    "DRIFTLINE_RETRAIN_WORKERS": "2",
    # Worker processes, whose epochs are long enough to kill one mid-job (GP-OPT would
    # train this small window in the service's own process, in milliseconds an epoch).
    "DRIFTLINE_RETRAIN_WORKER_KINDS": "lambda",
    "DRIFTLINE_BATCH_SIZE": "32",  # many minibatches: epochs long enough to kill one
    "DRIFTLINE_MAX_EPOCHS": "12",
    "DRIFTLINE_TARGET_LOSS": "none",
    "DRIFTLINE_REGISTRY_POLL_SECONDS": "none",
}


def _job(http: httpx.Client, job_id: int) -> dict[str, Any]:
    response = http.get(f"/jobs/{job_id}")
    assert response.status_code == 200, response.text
    return response.json()


def _wait_for(http: httpx.Client, job_id: int, done: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = _job(http, job_id)
        if done(job):
            return job
        assert job["status"] != "failed", job
        assert time.monotonic() < deadline, f"job {job_id} stuck: {job}"
        time.sleep(0.05)


def test_a_job_cut_by_kill_9_resumes_from_its_checkpoint_after_a_restart(
    tmp_path: Path, database_url: str
) -> None:
    env = {**SETTINGS, "DRIFTLINE_DATABASE_URL": database_url}
    events = stationary_stream(n_users=120, n_items=90, n_events=6_000, seed=3)
    server = ServerProcess(tmp_path / "data", env=env).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for start in range(0, len(events), 2_000):
                accepted = http.post("/ingest", json={"events": events[start : start + 2_000]})
                assert accepted.status_code == 200, accepted.text
            job_id = http.post("/retrain").json()["job_id"]
            _wait_for(http, job_id, lambda job: len(job["epochs"]) >= 2, timeout=120)
        server.stop(kill=True)  # SIGKILL: the job dies with its coordinator
    finally:
        server.stop(kill=True)

    with (
        ServerProcess(tmp_path / "data", env=env) as restarted,
        httpx.Client(base_url=restarted.url, timeout=60) as http,
    ):
        job = _wait_for(http, job_id, lambda job: job["status"] == "succeeded", timeout=180)
        epochs = [e["epoch"] for e in job["epochs"]]
        assert epochs == list(range(len(epochs))) and len(epochs) >= 3
        # The job is recorded succeeded first; serving then follows the registry to it.
        deadline = time.monotonic() + 30
        while (models := http.get("/models").json())["current"] != job["model_version"]:
            assert time.monotonic() < deadline, f"{job['model_version']} never served: {models}"
            time.sleep(0.05)
        assert job["model_version"] in {v["version"] for v in models["versions"]}
        assert job["cost_usd"] > 0 and job["invocations"]
    log = (tmp_path / "data" / "server.log").read_text()
    assert f"retraining job {job_id}: resuming from its checkpoint" in log
