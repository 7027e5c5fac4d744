"""``driftline replay``: a ratings file sent to HTTP or Kafka at the pace of a trace.

Events go out in timestamp order (``load_ratings``) with the stable ids of
``RatingStream.events()``, so replaying a file twice stores it once. The pacing loop
keeps the number of events released by time ``t`` at ``floor(∫₀ᵗ rate)``: it sleeps until
the next batch is due and never runs ahead of the trace. A batch goes out when
``batch_size`` events are due or when its first event has waited ``linger_s`` (like
Kafka's ``linger.ms``), so every event leaves within ``linger_s`` of its due time unless
the target is too slow. A slow target is not hidden: the loop then sends back to back
to catch up, and the summary reports how far behind the trace it fell.

Examples
--------
The pacing loop on its own, with a simulated clock (1,000 events per second, batches of
100, so one batch every 0.1 s):

>>> from benchmarks.traces import make_trace
>>> clock = SimulatedClock()
>>> batches = []
>>> result = pace(make_trace("constant", rate=1000), 300, 100,
...               lambda start, stop: batches.append((round(clock(), 3), start, stop)),
...               clock=clock, sleep=clock.sleep)
>>> batches
[(0.1, 0, 100), (0.2, 100, 200), (0.3, 200, 300)]
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from benchmarks.datasets import RatingStream, load_ratings
from benchmarks.traces import TRACES, Trace, make_trace

__all__ = [
    "SINKS",
    "HttpSink",
    "KafkaSink",
    "PaceResult",
    "ReplayConfig",
    "ReplayError",
    "ReplaySummary",
    "SimulatedClock",
    "pace",
    "run_replay",
]

Clock = Callable[[], float]
Sleep = Callable[[float], None]


class ReplayError(Exception):
    """A replay that cannot start or finish; the message is one line meant for a person."""


@dataclass(frozen=True)
class ReplayConfig:
    """What ``driftline replay`` was asked to do; validates itself.

    ``lag_tolerance_s`` is how late an event may be delivered (after its due time) before
    the summary says the target did not keep up; ``connect_timeout_s`` bounds reaching the
    target (and Kafka's metadata waits), ``timeout_s`` each request and the final flush.
    ``api_key`` is sent as ``Authorization: Bearer`` with every HTTP request (a key with
    the ``ingest`` scope; none for a service without keys).
    """

    to: str
    dataset: Path
    trace: str
    speed: float = 1.0
    url: str = "http://127.0.0.1:8000"
    api_key: str | None = None
    bootstrap: str = "127.0.0.1:9092"
    topic: str = "events"
    limit: int | None = None
    batch_size: int = 500
    rate: float | None = None
    linger_s: float = 0.1
    lag_tolerance_s: float = 1.0
    connect_timeout_s: float = 10.0
    timeout_s: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.to not in SINKS:
            raise ReplayError(f"unknown target {self.to!r}; choose from {', '.join(SINKS)}")
        if self.trace not in TRACES:
            raise ReplayError(f"unknown trace {self.trace!r}; choose from {', '.join(TRACES)}")
        if self.rate is not None and self.trace != "constant":
            raise ReplayError("--rate sets the constant trace's rate; use --speed to scale others")
        for name in ("speed", "linger_s", "lag_tolerance_s", "connect_timeout_s", "timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ReplayError(f"{name.replace('_', '-')} must be a positive number")
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise ReplayError("rate must be a positive number of events per second")
        if self.batch_size < 1:
            raise ReplayError("batch-size must be at least 1")
        if self.limit is not None and self.limit < 1:
            raise ReplayError("limit must be at least 1")

    def make_trace(self) -> Trace:
        return make_trace(self.trace, speed=self.speed, seed=self.seed, rate=self.rate)


class SimulatedClock:
    """A clock whose ``sleep`` advances it exactly; for tests and doctests."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass(frozen=True)
class PaceResult:
    """How a paced send went, in seconds since the loop started."""

    events: int
    started_at: float
    seconds: float
    max_delay_s: float


def pace(
    trace: Trace,
    total: int,
    batch_size: int,
    send: Callable[[int, int], None],
    *,
    linger_s: float = 0.1,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    on_batch: Callable[[int, float], None] | None = None,
) -> PaceResult:
    """Call ``send(start, stop)`` for events ``[start, stop)`` as the trace makes them due.

    Event ``i`` (0-based) is due at ``trace.time_until(i + 1)``. A batch is released when
    its last event is due (``batch_size`` events) or when its first has waited
    ``linger_s``, whichever is sooner; between batches the loop sleeps. ``max_delay_s``
    is the longest any event waited past its due time until ``send`` returned.
    ``on_batch(sent, elapsed)`` is called after each batch.
    """
    started_at = clock()
    sent, max_delay = 0, 0.0
    while sent < total:
        target = min(sent + batch_size, total)
        first_due = trace.time_until(sent + 1)
        full_at = trace.time_until(target)
        release_at = min(full_at, first_due + linger_s)
        wait = started_at + release_at - clock()
        if wait > 0:
            sleep(wait)
        now = max(clock() - started_at, release_at)
        stop = target if now >= full_at else max(sent + 1, min(target, trace.due_by(now)))
        send(sent, stop)
        sent = stop
        elapsed = clock() - started_at
        max_delay = max(max_delay, elapsed - first_due)
        if on_batch is not None:
            on_batch(sent, elapsed)
    return PaceResult(sent, started_at, clock() - started_at, max_delay)


class Sink(Protocol):
    """Where replayed events go. ``finish`` makes every sent event durable or raises."""

    accepted: int | None
    duplicates: int | None

    def send(self, events: list[dict[str, Any]]) -> None: ...

    def finish(self) -> None: ...

    def close(self) -> None: ...


class HttpSink:
    """``POST /ingest`` with ``{"events": [...]}``; counts accepted events and duplicates."""

    def __init__(self, config: ReplayConfig) -> None:
        self.url = config.url.rstrip("/")
        self.accepted: int | None = 0
        self.duplicates: int | None = 0
        auth = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._client = httpx.Client(base_url=self.url, timeout=config.timeout_s, headers=auth)
        try:
            self._client.get("/healthz", timeout=config.connect_timeout_s)
        except httpx.HTTPError as exc:
            self._client.close()
            raise ReplayError(f"cannot reach {self.url}: {_reason(exc)}") from exc

    def send(self, events: list[dict[str, Any]]) -> None:
        try:
            response = self._client.post("/ingest", json={"events": events})
        except httpx.HTTPError as exc:
            raise ReplayError(
                f"POST {self.url}/ingest failed after {self.accepted} accepted: {_reason(exc)}"
            ) from exc
        if response.status_code != 200:
            detail = " ".join(response.text.split())[:300]
            raise ReplayError(f"POST {self.url}/ingest answered {response.status_code}: {detail}")
        answer = response.json()
        self.accepted = (self.accepted or 0) + int(answer.get("accepted", 0))
        self.duplicates = (self.duplicates or 0) + int(answer.get("duplicates", 0))

    def finish(self) -> None:
        """Nothing to flush: every answered POST is already durable."""

    def close(self) -> None:
        self._client.close()


class KafkaSink:
    """One JSON event per message, keyed by user id, ``acks="all"``; flushed by ``finish``."""

    def __init__(self, config: ReplayConfig) -> None:
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        self.topic = config.topic
        self.bootstrap = config.bootstrap
        self.accepted: int | None = None
        self.duplicates: int | None = None
        self._timeout_s = config.timeout_s
        self._failures: list[BaseException] = []
        try:
            self._producer = KafkaProducer(
                bootstrap_servers=config.bootstrap,
                acks="all",
                linger_ms=5,
                bootstrap_timeout_ms=int(config.connect_timeout_s * 1000),
                max_block_ms=int(config.connect_timeout_s * 1000),
            )
        except (KafkaError, ValueError, OSError) as exc:
            raise ReplayError(f"cannot reach Kafka at {self.bootstrap}: {_reason(exc)}") from exc
        try:
            partitions = self._producer.partitions_for(self.topic)
        except KafkaError as exc:
            self.close()
            raise ReplayError(
                f"no metadata for topic {self.topic!r} on {self.bootstrap}: {_reason(exc)}"
            ) from exc
        if not partitions:
            self.close()
            raise ReplayError(f"topic {self.topic!r} does not exist on {self.bootstrap}")

    def send(self, events: list[dict[str, Any]]) -> None:
        from kafka.errors import KafkaError

        try:
            for event in events:
                key, value = event["user_id"].encode(), json.dumps(event).encode()
                future = self._producer.send(self.topic, key=key, value=value)
                future.add_errback(self._failures.append)
        except KafkaError as exc:
            raise ReplayError(f"sending to {self.bootstrap} failed: {_reason(exc)}") from exc

    def finish(self) -> None:
        from kafka.errors import KafkaError

        try:
            self._producer.flush(timeout=self._timeout_s)
        except KafkaError as exc:
            raise ReplayError(f"flushing to {self.bootstrap} failed: {_reason(exc)}") from exc
        if self._failures:
            raise ReplayError(
                f"{len(self._failures)} messages were not acknowledged by {self.bootstrap}: "
                f"{_reason(self._failures[0])}"
            )

    def close(self) -> None:
        self._producer.close(timeout=5)


SINKS: dict[str, Callable[[ReplayConfig], Sink]] = {"http": HttpSink, "kafka": KafkaSink}


def _reason(exc: BaseException) -> str:
    name, text = type(exc).__name__, " ".join(str(exc).split())
    if not text:
        return name
    return text if text.startswith(name) else f"{name}: {text}"


@dataclass(frozen=True)
class ReplaySummary:
    """What a replay achieved, next to what the trace asked for.

    ``target_rate`` is the trace's average over the span these events cover (what
    ``achieved_rate`` should match); ``trace_mean_rate`` is its average over a whole
    period at this speed (Table II's figure times the speed). ``behind_s`` is how long
    after its due time the last event was delivered; ``max_delay_s`` the most any event
    waited past its due time.
    """

    to: str
    trace: str
    speed: float
    events: int
    seconds: float
    achieved_rate: float
    target_rate: float
    trace_mean_rate: float
    behind_s: float
    max_delay_s: float
    kept_up: bool
    accepted: int | None = None
    duplicates: int | None = None

    @property
    def shortfall(self) -> float:
        """Fraction of the target rate not achieved (0 when on or above target)."""
        return max(0.0, 1.0 - self.achieved_rate / self.target_rate)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "shortfall": round(self.shortfall, 4)}

    def lines(self) -> list[str]:
        counts = ""
        if self.accepted is not None:
            counts = f" ({self.accepted:,} accepted, {self.duplicates:,} duplicates)"
        short = f" ({self.shortfall:.1%} short)" if self.shortfall >= 0.005 else ""
        lines = [
            f"sent {self.events:,} events to {self.to}{counts} in {self.seconds:.2f} s",
            f"achieved {self.achieved_rate:,.1f} events/s{short}; trace {self.trace} "
            f"x{self.speed:g} targets {self.target_rate:,.1f} events/s over this span "
            f"({self.trace_mean_rate:,.1f} events/s over a whole period)",
        ]
        if not self.kept_up:
            lines.append(
                f"fell behind the trace (the {self.to} target or this sender could not keep "
                f"up): {self.shortfall:.1%} short of the target rate, worst delay "
                f"{self.max_delay_s:.2f} s, finished {self.behind_s:.2f} s behind"
            )
        return lines


def _load(config: ReplayConfig) -> RatingStream:
    try:
        stream = load_ratings(config.dataset, limit=config.limit)
    except (OSError, ValueError, UnicodeDecodeError, EOFError) as exc:
        raise ReplayError(f"cannot read dataset {config.dataset}: {_reason(exc)}") from exc
    if len(stream) == 0:
        raise ReplayError(f"dataset {config.dataset} holds no ratings")
    return stream


def _progress(console: Console | None, enabled: bool) -> Progress:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TextColumn("{task.fields[achieved]:>10,.0f} events/s (target {task.fields[target]:,.0f})"),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console or Console(stderr=True), disable=not enabled)


def run_replay(
    config: ReplayConfig,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    progress: bool = True,
    console: Console | None = None,
) -> ReplaySummary:
    """Send ``config.dataset`` to ``config.to`` at the pace of ``config.trace``.

    Raises ``ReplayError`` (one line) when the dataset cannot be read, the target cannot
    be reached, or it rejects or fails to acknowledge events.
    """
    trace = config.make_trace()
    stream = _load(config)
    total = len(stream)
    target_rate = total / trace.time_until(total)
    sink = SINKS[config.to](config)
    try:
        with _progress(console, progress) as bar:
            task = bar.add_task(
                f"{config.trace} → {config.to}", total=total, achieved=0.0, target=0.0
            )

            def send(start: int, stop: int) -> None:
                sink.send(stream.events(start, stop))

            def on_batch(sent: int, elapsed: float) -> None:
                achieved = sent / elapsed if elapsed > 0 else 0.0
                due = sent / trace.time_until(sent)
                bar.update(task, completed=sent, achieved=achieved, target=due)

            paced = pace(
                trace,
                total,
                config.batch_size,
                send,
                linger_s=config.linger_s,
                clock=clock,
                sleep=sleep,
                on_batch=on_batch,
            )
            sink.finish()
    finally:
        sink.close()
    seconds = clock() - paced.started_at
    behind = max(0.0, seconds - trace.time_until(total))
    max_delay = max(paced.max_delay_s, behind)
    return ReplaySummary(
        to=config.to,
        trace=config.trace,
        speed=config.speed,
        events=paced.events,
        seconds=seconds,
        achieved_rate=paced.events / seconds if seconds > 0 else math.inf,
        target_rate=target_rate,
        trace_mean_rate=trace.mean_rate,
        behind_s=behind,
        max_delay_s=max_delay,
        kept_up=max_delay <= config.lag_tolerance_s,
        accepted=sink.accepted,
        duplicates=sink.duplicates,
    )
