"""``driftline replay``: the pacing loop, the summary, and real HTTP and Kafka targets."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from benchmarks import replay as replay_module
from benchmarks.datasets import load_ratings
from benchmarks.launcher import ServerProcess, free_port
from benchmarks.replay import (
    ReplayConfig,
    ReplayError,
    SimulatedClock,
    pace,
    run_replay,
)
from benchmarks.traces import make_trace
from service.cli import app
from tests.support.synthetic import stationary_stream


def _write_ratings(path: Path, n_events: int, seed: int = 11) -> Path:
    rows = stationary_stream(n_events=n_events, seed=seed)
    lines = [f"{e['user_id']}\t{e['item_id']}\t{e['rating']}\t{e['timestamp']!r}" for e in rows]
    path.write_text("\n".join(reversed(lines)) + "\n")  # out of order: replay must sort
    return path


class _Recorded:
    """Sends recorded with the simulated time they happened at."""

    def __init__(self, clock: SimulatedClock, cost_s: float = 0.0) -> None:
        self.clock = clock
        self.cost_s = cost_s
        self.batches: list[tuple[float, int, int]] = []

    def __call__(self, start: int, stop: int) -> None:
        self.batches.append((self.clock(), start, stop))
        self.clock.now += self.cost_s


@pytest.mark.parametrize(
    ("name", "speed", "total"),
    [("wits", 1.0, 6_000), ("berkeley", 4.0, 3_000), ("twitter", 0.5, 20_000), ("wiki", 1.0, 700)],
)
def test_pace_releases_every_event_on_time_and_never_ahead_of_the_trace(
    name: str, speed: float, total: int
) -> None:
    trace = make_trace(name, speed=speed)
    clock = SimulatedClock(now=1_000.0)
    send = _Recorded(clock)
    result = pace(trace, total, 200, send, linger_s=0.1, clock=clock, sleep=clock.sleep)

    assert result.events == total
    assert send.batches[0][1] == 0
    for (_, _, stop), (_, start, _) in zip(send.batches, send.batches[1:], strict=False):
        assert start == stop  # contiguous, in order, each event once
    assert send.batches[-1][2] == total
    for at, start, stop in send.batches:
        elapsed = at - 1_000.0
        assert stop - start <= 200
        # never ahead: everything sent by now was due by now ...
        assert stop <= trace.cumulative(elapsed) + 1e-6
        # ... and never late: each event leaves within linger of its due time
        for i in (start, stop - 1):
            due = trace.time_until(i + 1)
            assert due - 1e-9 <= elapsed <= due + 0.1 + 1e-9
    assert result.seconds == pytest.approx(trace.time_until(total))
    assert result.max_delay_s <= 0.1 + 1e-9
    assert all(s > 0 for s in clock.sleeps)  # sleeps, never spins
    assert len(clock.sleeps) <= len(send.batches)


def test_pace_releases_full_batches_at_high_rates_and_lingering_ones_at_low_rates() -> None:
    clock = SimulatedClock()
    send = _Recorded(clock)
    pace(make_trace("constant", rate=10_000), 2_000, 500, send, clock=clock, sleep=clock.sleep)
    assert [stop - start for _, start, stop in send.batches] == [500] * 4
    clock = SimulatedClock()
    send = _Recorded(clock)
    pace(make_trace("constant", rate=100), 30, 500, send, clock=clock, sleep=clock.sleep)
    # the first event of each batch is due, then 0.1 s of events join it; the last is short
    assert [stop - start for _, start, stop in send.batches] == [11, 11, 8]


def test_pace_behind_a_slow_target_sends_back_to_back_and_reports_the_delay() -> None:
    clock = SimulatedClock()
    send = _Recorded(clock, cost_s=0.5)  # 100 events per 0.5 s, where 1000/s are asked
    result = pace(
        make_trace("constant", rate=1000), 1_000, 100, send, clock=clock, sleep=clock.sleep
    )
    assert len(clock.sleeps) == 1  # only before the first batch
    assert result.seconds == pytest.approx(0.1 + 10 * 0.5)
    # the last batch's first event was due at 0.901 s and left at 5.1 s
    assert result.max_delay_s == pytest.approx(5.1 - 0.901)


class _MemorySink:
    """An in-memory target with a simulated cost per batch."""

    instances: list[_MemorySink] = []
    clock: SimulatedClock
    cost_s = 0.0

    def __init__(self, config: ReplayConfig) -> None:
        self.events: list[dict[str, Any]] = []
        self.accepted, self.duplicates, self.finished = 0, 0, False
        _MemorySink.instances.append(self)

    def send(self, events: list[dict[str, Any]]) -> None:
        self.events.extend(events)
        self.accepted = len(self.events)
        self.clock.now += self.cost_s

    def finish(self) -> None:
        self.finished = True

    def close(self) -> None:
        pass


@pytest.fixture
def memory_sink(monkeypatch: pytest.MonkeyPatch) -> type[_MemorySink]:
    _MemorySink.instances = []
    _MemorySink.clock = SimulatedClock(now=50.0)
    _MemorySink.cost_s = 0.0
    monkeypatch.setitem(replay_module.SINKS, "memory", _MemorySink)
    return _MemorySink


def test_replay_sends_the_file_in_timestamp_order_at_the_trace_rate(
    tmp_path: Path, memory_sink: type[_MemorySink]
) -> None:
    dataset = _write_ratings(tmp_path / "ratings.tsv", 3_000)
    config = ReplayConfig(to="memory", dataset=dataset, trace="twitter", speed=2.0)
    clock = memory_sink.clock
    summary = run_replay(config, clock=clock, sleep=clock.sleep, progress=False)
    sink = memory_sink.instances[0]
    assert sink.finished
    assert sink.events == load_ratings(dataset).events()
    assert [e["timestamp"] for e in sink.events] == sorted(e["timestamp"] for e in sink.events)
    assert summary.events == 3_000 and summary.kept_up
    assert summary.achieved_rate == pytest.approx(summary.target_rate)
    assert summary.trace_mean_rate == pytest.approx(2 * 3346.76, rel=1e-4)
    assert summary.shortfall == pytest.approx(0.0, abs=1e-9)


def test_replay_reports_the_shortfall_of_a_target_that_cannot_keep_up(
    tmp_path: Path, memory_sink: type[_MemorySink]
) -> None:
    dataset = _write_ratings(tmp_path / "ratings.tsv", 2_000)
    memory_sink.cost_s = 0.5  # 500 events per 0.5 s: 1,000/s at most
    config = ReplayConfig(to="memory", dataset=dataset, trace="constant", rate=10_000)
    clock = memory_sink.clock
    summary = run_replay(config, clock=clock, sleep=clock.sleep, progress=False)
    assert not summary.kept_up
    assert summary.achieved_rate == pytest.approx(2_000 / (0.05 + 4 * 0.5))
    assert summary.shortfall > 0.85
    assert summary.behind_s == pytest.approx(0.05 + 4 * 0.5 - 0.2)
    assert summary.max_delay_s > config.lag_tolerance_s
    assert "fell behind the trace" in "\n".join(summary.lines())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"trace": "nope"}, "unknown trace 'nope'; choose from"),
        ({"to": "ftp"}, "unknown target 'ftp'"),
        ({"trace": "wiki", "rate": 10.0}, "--rate sets the constant trace's rate"),
        ({"speed": 0.0}, "speed must be a positive number"),
        ({"batch_size": 0}, "batch-size must be at least 1"),
    ],
)
def test_config_rejects_bad_arguments(overrides: dict[str, Any], message: str) -> None:
    arguments = {"to": "http", "dataset": Path("x.tsv"), "trace": "constant", **overrides}
    with pytest.raises(ReplayError, match=message):
        ReplayConfig(**arguments)


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, ["replay", *args])


def test_cli_rejects_an_unknown_trace_with_one_clear_line(tmp_path: Path) -> None:
    dataset = _write_ratings(tmp_path / "ratings.tsv", 10)
    result = _cli("--to", "http", "--dataset", str(dataset), "--trace", "nope")
    assert result.exit_code != 0
    assert result.stderr.strip().splitlines() == [
        "driftline replay: unknown trace 'nope'; choose from constant, wiki, berkeley, "
        "twitter, wits"
    ]
    assert "Traceback" not in result.output


def test_cli_reports_an_unreadable_dataset_and_an_unreachable_target(tmp_path: Path) -> None:
    missing = _cli("--to", "http", "--dataset", str(tmp_path / "none.tsv"), "--trace", "wiki")
    assert missing.exit_code == 1
    assert "cannot read dataset" in missing.stderr and "Traceback" not in missing.output
    dataset = _write_ratings(tmp_path / "ratings.tsv", 10)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    unreachable = _cli("--to", "http", "--dataset", str(dataset), "--trace", "wiki", "--url", url)
    assert unreachable.exit_code == 1
    assert f"cannot reach {url}" in unreachable.stderr


@pytest.mark.slow
def test_replay_to_http_stores_every_event_once_and_a_rerun_counts_duplicates(
    tmp_path: Path,
) -> None:
    n_events = 1_500
    dataset = _write_ratings(tmp_path / "ratings.tsv", n_events)
    with ServerProcess(tmp_path / "data") as server:
        first = subprocess.run(
            [sys.executable, "-m", "benchmarks", "replay", "--to", "http", "--url", server.url]
            + ["--dataset", str(dataset), "--trace", "twitter", "--speed", "5", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert first.returncode == 0, first.stderr
        summary = json.loads(first.stdout.strip().splitlines()[-1])
        assert summary["events"] == summary["accepted"] == n_events
        assert summary["duplicates"] == 0
        assert httpx.get(f"{server.url}/healthz").json()["events_stored"] == n_events

        config = ReplayConfig(
            to="http", dataset=dataset, trace="constant", rate=20_000, url=server.url
        )
        again = run_replay(config, progress=False)
        assert (again.accepted, again.duplicates) == (0, n_events)
        assert httpx.get(f"{server.url}/healthz").json()["events_stored"] == n_events


@pytest.mark.slow
def test_replay_to_kafka_produces_one_message_per_event(tmp_path: Path) -> None:
    from kafka import KafkaConsumer, TopicPartition

    from benchmarks.broker import EmbeddedBroker

    n_events, partitions = 1_200, 3
    dataset = _write_ratings(tmp_path / "ratings.tsv", n_events)
    with EmbeddedBroker(port=free_port(), topic="events", partitions=partitions) as broker:
        config = ReplayConfig(
            to="kafka", dataset=dataset, trace="wits", speed=20, bootstrap=broker.bootstrap
        )
        summary = run_replay(config, progress=False)
        assert summary.events == n_events

        consumer = KafkaConsumer(
            bootstrap_servers=broker.bootstrap, enable_auto_commit=False, group_id=None
        )
        try:
            assigned = [TopicPartition("events", p) for p in range(partitions)]
            consumer.assign(assigned)
            consumer.seek_to_beginning(*assigned)
            records: list[Any] = []
            deadline = time.monotonic() + 30
            while len(records) < n_events and time.monotonic() < deadline:
                for batch in consumer.poll(timeout_ms=500).values():
                    records.extend(batch)
            records.extend(r for b in consumer.poll(timeout_ms=500).values() for r in b)
        finally:
            consumer.close()

    assert len(records) == n_events
    expected = {e["event_id"]: e for e in load_ratings(dataset).events()}
    received = {}
    for record in records:
        event = json.loads(record.value)
        assert record.key == event["user_id"].encode()
        received[event["event_id"]] = event
    assert received == expected
