"""``serve --stream-process``: the stream role in a child process beside the server.

The serving process only folds the log in; the child evaluates, leads the cluster and
runs the jobs, whose versions the server swaps in; the child dies with the server, even
by ``kill -9``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.launcher import ServerProcess, free_port
from tests.e2e.test_loop import SERVER_ENV, _wait_idle
from tests.support.synthetic import planted_drift_stream

pytestmark = pytest.mark.slow

METRICS_PORT = free_port()
ENV = {
    **SERVER_ENV,
    "DRIFTLINE_METRICS_PORT": str(METRICS_PORT),
    "DRIFTLINE_STREAM_PROCESS": "true",
    "DRIFTLINE_REPLICA_ID": "solo",
    "DRIFTLINE_RETRAIN_RUNTIME": "inprocess",
}


def _stream_children(pid: int) -> list[int]:
    """Children of ``pid`` running ``python -m service stream``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(fields[1]) == pid and command[-3:-1] == [b"service", b"stream"]:
                found.append(int(entry.name))
    return found


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table in /proc")
def test_the_stream_process_leads_trains_and_dies_with_the_server(tmp_path: Path) -> None:
    events = planted_drift_stream(n_events=2_000, drift_at=2_000, seed=2)
    server = ServerProcess(tmp_path / "data", env=ENV).start()
    try:
        assert server.process is not None
        [child] = _stream_children(server.process.pid)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for start in range(0, len(events), 250):
                answer = client.post("/ingest", json={"events": events[start : start + 250]})
                assert answer.status_code == 200, answer.text
            _wait_idle(client)
            # The stream process learns what the server stored once it is up: on a
            # loaded machine its start alone (imports, migrations) can take half a minute.
            deadline = time.monotonic() + 120
            while client.get("/healthz").json()["model_version"] is None:
                assert time.monotonic() < deadline, "the bootstrap version never served"
                time.sleep(0.2)
            cluster = client.get("/healthz").json()["cluster"]
            assert cluster["leader_id"] == "solo-stream" and cluster["leader"] is True
            assert cluster["applied_position"] == len(events)
            jobs = client.get("/jobs").json()["jobs"]
            assert [job["trigger"] for job in jobs] == ["bootstrap"]
            # Each process counts itself: the lease is the stream process's.
            assert "driftline_leader 0.0" in client.get("/metrics").text
            child_metrics = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics").text
            assert "driftline_leader 1.0" in child_metrics
        os.kill(server.process.pid, signal.SIGKILL)
        assert _gone(child), "the stream process outlived a killed server"
    finally:
        server.stop(kill=True)
