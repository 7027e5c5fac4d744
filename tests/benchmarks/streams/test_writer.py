"""``driftline generate``: files that read back, events the API takes, the ground truth
beside them, and real HTTP and Kafka targets fed at the arrival times."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from benchmarks.datasets import load_ratings
from benchmarks.launcher import ServerProcess, free_port
from benchmarks.replay import SimulatedClock
from benchmarks.streams import GeneratorConfig, StreamGenerator, generate_stream
from benchmarks.streams.writer import send_stream, write_file
from service.cli import app
from service.ingest.validation import parse_event_json
from service.settings import Settings


def _generate(*args: str) -> Any:
    result = CliRunner().invoke(app, ["generate", *args])
    assert result.exit_code == 0, result.output
    return result


def test_a_csv_file_reads_back_as_the_stream_with_its_truth_beside_it(tmp_path: Path) -> None:
    out = tmp_path / "stream.csv"
    result = _generate("--events", "4000", "--seed", "3", "--output", str(out), "--drift", "sudden")
    stream = generate_stream(GeneratorConfig(events=4_000, seed=3, drift="sudden"))
    read = load_ratings(out)
    assert read.user_ids == stream.user_ids and read.item_ids == stream.item_ids
    assert np.array_equal(read.ratings, stream.ratings)
    assert np.allclose(read.timestamps, stream.timestamps, atol=1e-3)
    truth = json.loads((tmp_path / "stream.truth.json").read_text())
    assert truth["onset"] == 2_400 and truth["drift"] == "sudden"
    assert truth["generator"]["seed"] == 3 and truth["events"] == 4_000
    drifted = [line.endswith(",1") for line in out.read_text().splitlines()[1:]]
    assert sum(drifted) == truth["drifted_events"] > 0 and not any(drifted[:2_400])
    assert "planted: 30 % of users invert their taste at event 2,400" in result.output


def test_ndjson_events_are_what_post_ingest_and_the_consumer_accept(tmp_path: Path) -> None:
    out = tmp_path / "stream.ndjson.gz"
    _generate("--events", "3000", "--output", str(out), "--trace", "wits")
    with gzip.open(out, "rt") as handle:
        lines = handle.read().splitlines()
    limits = Settings().event_limits
    assert len(lines) == 3_000
    for line in lines:
        event, problems = parse_event_json(line, limits)
        assert event is not None, problems
    assert json.loads(lines[5])["event_id"] == "gen0-5"


class _Sink:
    """Records each batch with the simulated time it was sent at."""

    def __init__(self, clock: SimulatedClock) -> None:
        self.clock = clock
        self.batches: list[tuple[float, list[dict]]] = []
        self.accepted: int | None = 0
        self.duplicates: int | None = 0
        self.finished = self.closed = False

    def send(self, events: list[dict]) -> None:
        self.batches.append((self.clock(), events))
        self.accepted = (self.accepted or 0) + len(events)

    def finish(self) -> None:
        self.finished = True

    def close(self) -> None:
        self.closed = True


def test_sending_follows_the_arrival_times() -> None:
    clock = SimulatedClock()
    sink = _Sink(clock)
    config = GeneratorConfig(events=5_000, trace="constant", rate=1_000)
    generator = StreamGenerator(config)
    summary = send_stream(generator, sink, "g", 200, clock=clock, sleep=clock.sleep)
    events = [e for _, batch in sink.batches for e in batch]
    assert [e["event_id"] for e in events] == [f"g-{i}" for i in range(5_000)]
    for sent_at, batch in sink.batches:
        due = [e["timestamp"] - config.start for e in batch]
        assert max(due) <= sent_at + 1e-3  # never before an event has arrived
        assert sent_at - min(due) <= 0.1 + 1e-3  # nor later than the linger
    assert summary.achieved_rate == pytest.approx(1_000, rel=0.05)
    assert summary.accepted == 5_000 and sink.finished and sink.closed


def test_write_file_measures_its_own_speed(tmp_path: Path) -> None:
    summary = write_file(
        StreamGenerator(GeneratorConfig(events=50_000)), tmp_path / "s.csv", "csv", "g"
    )
    assert summary.events == 50_000 and summary.achieved_rate > 10_000
    assert summary.target_rate == pytest.approx(1_000, rel=0.05)  # the constant trace


def test_the_command_refuses_bad_arguments_in_one_line() -> None:
    result = CliRunner().invoke(app, ["generate", "--drift", "nope", "--output", "-"])
    assert result.exit_code == 2 and "unknown drift 'nope'" in result.output
    result = CliRunner().invoke(app, ["generate", "--events", "10"])
    assert result.exit_code == 2 and "--to file needs --output" in result.output


@pytest.mark.slow
def test_posting_stores_every_event_once(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data") as server:
        args = ["--to", "http", "--url", server.url, "--events", "1500", "--rate", "5000"]
        result = _generate(*args, "--truth", str(tmp_path / "t.json"), "--json")
        summary = json.loads(result.output.strip().splitlines()[-1])
        assert summary["events"] == summary["accepted"] == 1_500
        assert httpx.get(f"{server.url}/healthz").json()["events_stored"] == 1_500
        again = _generate(*args, "--no-pace", "--json")
        assert json.loads(again.output.strip().splitlines()[-1])["duplicates"] == 1_500


@pytest.mark.slow
def test_producing_to_kafka_sends_one_message_per_event() -> None:
    from kafka import KafkaConsumer, TopicPartition

    from benchmarks.broker import EmbeddedBroker

    with EmbeddedBroker(port=free_port(), topic="events", partitions=2) as broker:
        _generate("--to", "kafka", "--bootstrap", broker.bootstrap, "--events", "1200")
        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap, enable_auto_commit=False, group_id=None
        )
        try:
            assigned = [TopicPartition("events", p) for p in range(2)]
            consumer.assign(assigned)
            consumer.seek_to_beginning(*assigned)
            records: list[Any] = []
            deadline = time.monotonic() + 30
            while len(records) < 1_200 and time.monotonic() < deadline:
                for batch in consumer.poll(timeout_ms=500).values():
                    records.extend(batch)
        finally:
            consumer.close()
    ids = {json.loads(r.value)["event_id"] for r in records}
    assert ids == {f"gen0-{i}" for i in range(1_200)}
