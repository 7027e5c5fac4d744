"""The docker-compose topology, run natively: what CI can run without a Docker engine.

PostgreSQL (the machine's), the embedded Kafka-protocol broker in place of Apache
Kafka, moto's S3 server in place of MinIO, one ``driftline serve`` and two ``driftline
consume`` replicas with keys, as in ``docker-compose.yml``. A MovieLens slice is
replayed to Kafka on an arrival trace with ``driftline replay``; every event must be
stored once, the retraining job's version must land in S3 and be served by
``/recommend``, and every process's Prometheus text must parse.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import boto3
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.broker import EmbeddedBroker
from benchmarks.datasets import load_ratings
from benchmarks.launcher import ServerProcess, free_port
from benchmarks.replay import ReplayConfig, run_replay
from service.auth.keys import create_key
from service.store import Database
from service.store.events import count_events
from tests.functions.test_s3 import moto_s3_server
from tests.support.databases import external_url, isolated_schema, not_configured_reason
from tests.support.datasets import ratings_file

pytestmark = pytest.mark.slow

EVENTS = 3_000


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[dict]:
    base = external_url()
    if base is None:
        pytest.skip(not_configured_reason())
    with ExitStack() as stack:
        database_url = stack.enter_context(isolated_schema(base))
        endpoint = stack.enter_context(moto_s3_server())
        credentials = {
            "AWS_ACCESS_KEY_ID": "driftline",
            "AWS_SECRET_ACCESS_KEY": "driftline-minio",
            "AWS_REGION": "us-east-1",
        }
        s3 = boto3.client("s3", endpoint_url=endpoint, **_boto(credentials))
        s3.create_bucket(Bucket="driftline")  # what the compose stack's minio-bucket does
        broker = stack.enter_context(EmbeddedBroker(port=free_port(), partitions=4))
        env = {
            **credentials,
            "DRIFTLINE_DATABASE_URL": database_url,
            "DRIFTLINE_OBJECT_STORE_URL": "s3://driftline/models",
            "DRIFTLINE_S3_ENDPOINT_URL": endpoint,
            "DRIFTLINE_RETRAIN_RUNTIME": "inprocess",
            "DRIFTLINE_BOOTSTRAP_EVENTS": "1000",
            "DRIFTLINE_HEARTBEAT_EVENTS": "200",
            "DRIFTLINE_REGISTRY_POLL_SECONDS": "1",
            "DRIFTLINE_TRUSTED_HOSTS": "127.0.0.1,localhost,::1",
        }
        db = Database(database_url)
        admin = create_key(db, "admin", ["admin"]).token  # the image's first start
        consumers = []
        for replica in (0, 1):
            port = free_port()
            replica_env = {**env, "DRIFTLINE_KAFKA_BOOTSTRAP": broker.bootstrap}
            consume = _consume(tmp_path, replica, port, replica_env)
            consumers.append((port, stack.enter_context(consume)))
        server = stack.enter_context(
            ServerProcess(tmp_path / "serve", env={**env, "DRIFTLINE_KAFKA_TOPIC": "events"})
        )
        yield {
            "db": db,
            "s3": s3,
            "broker": broker,
            "server": server,
            "consumers": consumers,
            "admin": admin,
        }
        db.dispose()


def _boto(credentials: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": credentials["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": credentials["AWS_SECRET_ACCESS_KEY"],
        "region_name": credentials["AWS_REGION"],
    }


class _consume:
    """A ``driftline consume`` replica exporting metrics, as the compose stack runs it."""

    def __init__(self, tmp_path: Path, replica: int, port: int, env: dict[str, str]) -> None:
        self.log = tmp_path / f"consume-{replica}.log"
        self.command = [sys.executable, "-m", "service", "consume"]
        self.command += ["--data-dir", str(tmp_path / f"consume-{replica}")]
        self.env = {
            **os.environ,
            **env,
            "DRIFTLINE_KAFKA_REPLICA": str(replica),
            "DRIFTLINE_KAFKA_REPLICAS": "2",
            "DRIFTLINE_METRICS_PORT": str(port),
        }
        self.port = port

    def __enter__(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        return self.process

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _scrape(text: str) -> set[str]:
    names = {family.name for family in text_string_to_metric_families(text)}
    if shutil.which("promtool"):
        check = subprocess.run(
            ["promtool", "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert "error" not in (check.stdout + check.stderr).lower(), check.stdout + check.stderr
    return names


def test_the_compose_topology_replays_a_trace_end_to_end(stack: dict, tmp_path: Path) -> None:
    server, db, s3 = stack["server"], stack["db"], stack["s3"]
    dataset = ratings_file(tmp_path, limit=EVENTS)
    auth = {"Authorization": f"Bearer {stack['admin']}"}
    http = httpx.Client(base_url=server.url, timeout=30)
    assert http.get("/models").status_code == 401  # keys exist: access control is on

    for port, _ in stack["consumers"]:
        _wait_for(lambda p=port: _up(p), 60, f"consume metrics on {port}")
    summary = run_replay(
        ReplayConfig(
            to="kafka",
            dataset=dataset,
            trace="constant",
            rate=2_000,
            bootstrap=stack["broker"].bootstrap,
            limit=EVENTS,
        ),
        progress=False,
    )
    assert summary.events == EVENTS

    def stored() -> int:
        with db.connect() as conn:
            return count_events(conn)

    _wait_for(lambda: stored() >= EVENTS, 120, "the consumers to store every event")
    time.sleep(1.0)  # anything read twice would show up now
    assert stored() == EVENTS  # two replicas, each partition consumed once

    def served() -> str | None:
        return http.get("/models", headers=auth).json()["current"]

    _wait_for(lambda: served() is not None, 180, "serve to follow a published version")
    version = served()
    objects = s3.list_objects_v2(Bucket="driftline", Prefix="models/").get("Contents", [])
    assert any(f"/{version}/" in item["Key"] for item in objects), [o["Key"] for o in objects]
    replayed = load_ratings(dataset, limit=EVENTS)
    user = Counter(replayed.user_ids).most_common(1)[0][0]
    answer = http.get("/recommend", params={"user_id": user, "k": 10}, headers=auth).json()
    # A refresh job may publish a newer version between the two reads.
    assert answer["source"] == "model" and answer["model_version"] >= version

    serve_metrics = _scrape(http.get("/metrics").text)
    assert {"driftline_responses", "driftline_request_seconds"} <= serve_metrics
    for port, _ in stack["consumers"]:
        consumer_metrics = _scrape(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
        assert {"driftline_consumer_lag", "driftline_events_ingested"} <= consumer_metrics
    http.close()


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
