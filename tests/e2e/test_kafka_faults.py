"""Kafka ingestion survives crashes of the consumer and of the broker (real processes),
and a group's survivor takes over a killed member's partitions."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from benchmarks.broker import EmbeddedBroker
from benchmarks.launcher import ServerProcess, free_port
from service.store import Database
from service.store.events import count_events
from service.store.offsets import load_offsets
from service.store.tables import events as events_table
from service.wiring import RETRAIN_SHUTDOWN_GRACE_S
from tests.support.kafka import events, produce, produce_slowly

pytestmark = pytest.mark.slow

TOTAL = 20_000
#: A killed member's partitions go to the others after this; short to keep tests quick.
SESSION_TIMEOUT_MS = 6_000


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _start_consumer(bootstrap: str, data_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "service", "consume", "--kafka-bootstrap", bootstrap]
    command += ["--data-dir", str(data_dir)]
    env = {
        **os.environ,
        "DRIFTLINE_KAFKA_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
        "DRIFTLINE_RETRAIN_ENABLED": "false",
    }
    return subprocess.Popen(command, stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env)


def _owned(log: Path) -> list[int] | None:
    """The partitions a consumer's log says it owns now (its last "now owns" line)."""
    lines = [line for line in log.read_text().splitlines() if " now owns " in line]
    if not lines:
        return None
    shown = lines[-1].split("partitions [", 1)[1].split("]", 1)[0]
    return sorted(int(p) for p in shown.split(",") if p.strip())


def test_kill_9_of_the_consumer_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    db = Database(f"sqlite:///{data_dir / 'driftline.db'}")

    def stored() -> int:
        with db.connect() as conn:
            return count_events(conn)

    with EmbeddedBroker(port=free_port(), partitions=3) as broker:
        producer = threading.Thread(
            target=lambda: [
                produce(broker.bootstrap, "events", events(i, i + 2_000), key=None)
                for i in range(0, TOTAL, 2_000)
            ]
        )
        producer.start()
        log = tmp_path / "consumer.log"
        consumer = _start_consumer(broker.bootstrap, data_dir, log)
        try:
            _wait_for(lambda: stored() > 3_000, 120, "the consumer to store events")
            consumer.kill()  # SIGKILL, mid-stream
            consumer.wait()
            killed_at = stored()
            assert killed_at < TOTAL
            producer.join()
            consumer = _start_consumer(broker.bootstrap, data_dir, log)
            _wait_for(lambda: stored() >= TOTAL, 120, "the restarted consumer to catch up")
            time.sleep(1.0)  # anything read twice would show up now
        finally:
            consumer.terminate()
            # A retraining job the caught-up consumer started may hold the stop for
            # its grace; the stop must come within that and a flush.
            consumer.wait(timeout=RETRAIN_SHUTDOWN_GRACE_S + 30)
        assert stored() == TOTAL
        with db.connect() as conn:
            assert sum(load_offsets(conn, "events").values()) == TOTAL


def test_a_killed_group_member_s_partitions_go_to_the_survivor_exactly_once(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    db = Database(f"sqlite:///{data_dir / 'driftline.db'}")
    total = 16_000

    def stored() -> int:
        with db.connect() as conn:
            return count_events(conn)

    with EmbeddedBroker(port=free_port(), partitions=4) as broker:
        logs = [tmp_path / "doomed.log", tmp_path / "survivor.log"]
        consumers = [_start_consumer(broker.bootstrap, data_dir, log) for log in logs]
        try:
            _wait_for(
                lambda: (
                    all(_owned(log) for log in logs)
                    and sorted(sum((_owned(log) or [] for log in logs), [])) == [0, 1, 2, 3]
                ),
                120,
                "the group to share out the partitions",
            )
            producer = threading.Thread(
                target=produce_slowly,
                args=(broker.bootstrap, "events", events(0, total), 1_000, 0.3),
            )
            producer.start()
            _wait_for(lambda: stored() > 3_000, 120, "both consumers to store events")
            consumers[0].kill()  # SIGKILL mid-stream: no goodbye to the group
            consumers[0].wait()
            assert stored() < total
            killed = time.monotonic()
            _wait_for(lambda: _owned(logs[1]) == [0, 1, 2, 3], 60, "the survivor's takeover")
            taken_over = time.monotonic() - killed
            producer.join()
            _wait_for(lambda: stored() >= total, 120, "the survivor to catch up")
            time.sleep(1.0)  # anything stored twice would show up now
        finally:
            for consumer in consumers:
                consumer.terminate()
                consumer.wait(timeout=RETRAIN_SHUTDOWN_GRACE_S + 30)
        assert taken_over < SESSION_TIMEOUT_MS / 1000 + 15
        with db.connect() as conn:
            ids = list(conn.scalars(select(events_table.c.event_id)))
            assert sum(load_offsets(conn, "events").values()) == total
        assert len(ids) == total and set(ids) == {e["event_id"] for e in events(0, total)}


def test_the_service_reconnects_after_a_broker_restart_and_catches_up(tmp_path: Path) -> None:
    port = free_port()
    broker = EmbeddedBroker(port=port, partitions=2).start()
    env = {"DRIFTLINE_KAFKA_BOOTSTRAP": broker.bootstrap, "DRIFTLINE_RETRAIN_ENABLED": "false"}
    server = ServerProcess(tmp_path / "data", env=env).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:

            def stored() -> int:
                return http.get("/healthz").json()["events_stored"]

            produce(broker.bootstrap, "events", events(0, 500), key=None)
            _wait_for(lambda: stored() == 500, 60, "the first 500 events")

            def caught_up() -> bool:  # the lag is refreshed after each poll
                kafka = http.get("/healthz").json()["kafka"]
                return bool(kafka["connected"]) and sum(kafka["lag"].values()) == 0

            _wait_for(caught_up, 10, "the consumer's lag to read 0")
            assert "driftline_consumer_lag" in http.get("/metrics").text

            broker.stop()
            _wait_for(
                lambda: "reconnecting" in server.log_path.read_text(), 60, "a reconnect log line"
            )
            broker = EmbeddedBroker(port=port, partitions=2).start()  # empty in-memory log
            produce(broker.bootstrap, "events", events(500, 800), key=None)
            _wait_for(lambda: stored() == 800, 90, "the events sent after the restart")
            assert "topic was recreated" in server.log_path.read_text()
    finally:
        server.stop()
        broker.stop()
