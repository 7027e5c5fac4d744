"""Where a generated stream goes: a file, a Kafka topic or ``POST /ingest``.

Files are written as fast as the stream is drawn, each event carrying its arrival time:
CSV in MovieLens' layout (``userId,movieId,rating,timestamp``, so ``--dataset`` reads it
back) with a fifth column ``drifted`` (1 for an event a planted drift changed), or
newline-delimited JSON events as ``/ingest`` and the Kafka consumer take them (no extra
field: they refuse unknown ones). Kafka and HTTP get the same JSON events through the
sinks of ``driftline replay``, in real time: a batch leaves when its last event has
arrived, or when its first has waited ``linger_s``, so the service sees the trace's
rate. The ground truth goes beside the stream as JSON.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from benchmarks.streams.generator import EventChunk, StreamGenerator
from benchmarks.streams.population import item_id, user_id

__all__ = [
    "FORMATS",
    "WriteSummary",
    "chunk_events",
    "format_chunk",
    "paced",
    "send_stream",
    "write_file",
    "write_truth",
]

CSV_HEADER = "userId,movieId,rating,timestamp,drifted\n"

Clock = Callable[[], float]
Sleep = Callable[[float], None]


def _millis(timestamps: np.ndarray) -> tuple[list[int], list[int]]:
    """Whole seconds and milliseconds: two integers print faster than one float."""
    seconds, millis = np.divmod(np.round(timestamps * 1000).astype(np.int64), 1000)
    return seconds.tolist(), millis.tolist()


def _csv(chunk: EventChunk, prefix: str) -> str:
    seconds, millis = _millis(chunk.timestamps)
    columns = (chunk.users.tolist(), chunk.items.tolist(), chunk.ratings.tolist())
    drifted = chunk.drifted.view(np.int8).tolist()
    return "".join(map("u{},i{},{},{}.{:03d},{}\n".format, *columns, seconds, millis, drifted))


def _ndjson(chunk: EventChunk, prefix: str) -> str:
    seconds, millis = _millis(chunk.timestamps)
    columns = (chunk.users.tolist(), chunk.items.tolist(), chunk.ratings.tolist())
    ids = range(chunk.start, chunk.start + len(chunk))
    line = (
        '{{"event_id":"' + prefix + '-{}","user_id":"u{}","item_id":"i{}",'
        '"rating":{},"timestamp":{}.{:03d}}}\n'
    )
    return "".join(map(line.format, ids, *columns, seconds, millis))


#: File formats: how a chunk becomes text, and the header the file starts with.
FORMATS: dict[str, tuple[Callable[[EventChunk, str], str], str]] = {
    "csv": (_csv, CSV_HEADER),
    "ndjson": (_ndjson, ""),
}


def format_chunk(chunk: EventChunk, fmt: str, prefix: str) -> str:
    """``chunk`` as lines of ``fmt``.

    >>> chunk = EventChunk(7, np.array([3]), np.array([5]), np.array([4.5]),
    ...                    np.array([1.6e9]), np.array([False]))
    >>> format_chunk(chunk, "csv", "g0")
    'u3,i5,4.5,1600000000.000,0\\n'
    >>> json.loads(format_chunk(chunk, "ndjson", "g0"))["event_id"]
    'g0-7'
    """
    return FORMATS[fmt][0](chunk, prefix)


def chunk_events(chunk: EventChunk, start: int, stop: int, prefix: str) -> list[dict[str, Any]]:
    """Events ``start`` to ``stop`` of ``chunk`` (positions within it) as API events."""
    users, items = chunk.users[start:stop].tolist(), chunk.items[start:stop].tolist()
    ratings = chunk.ratings[start:stop].tolist()
    stamps = np.round(chunk.timestamps[start:stop], 3).tolist()
    first = chunk.start + start
    return [
        {
            "event_id": f"{prefix}-{first + n}",
            "user_id": user_id(u),
            "item_id": item_id(i),
            "rating": r,
            "timestamp": t,
        }
        for n, (u, i, r, t) in enumerate(zip(users, items, ratings, stamps, strict=True))
    ]


@dataclass(frozen=True)
class WriteSummary:
    """How writing or sending a stream went. ``target_rate`` is the trace's over the
    span these events cover, ``achieved_rate`` what left (for files, the generator's own
    speed); ``max_delay_s`` is the most an event waited past its arrival time."""

    to: str
    events: int
    seconds: float
    achieved_rate: float
    target_rate: float
    max_delay_s: float = 0.0
    accepted: int | None = None
    duplicates: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        counts = ""
        if self.accepted is not None:
            counts = f" ({self.accepted:,} accepted, {self.duplicates or 0:,} duplicates)"
        lines = [
            f"{self.events:,} events to {self.to}{counts} in {self.seconds:.2f} s: "
            f"{self.achieved_rate:,.0f} events/s (the trace's rate over the stream: "
            f"{self.target_rate:,.1f} events/s)"
        ]
        if self.max_delay_s > 1.0:
            lines.append(
                f"fell behind the arrival times: an event waited up to {self.max_delay_s:.1f} s"
            )
        return lines


def _target_rate(generator: StreamGenerator, events: int, last: float) -> float:
    span = last - generator.config.start
    return events / span if span > 0 else math.inf


def _open(path: Path) -> AbstractContextManager[IO[str]]:
    if str(path) == "-":
        return nullcontext(sys.stdout)
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "wb"), encoding="utf-8")
    return path.open("w", encoding="utf-8")


def write_file(generator: StreamGenerator, path: Path, fmt: str, prefix: str) -> WriteSummary:
    """Write the whole stream to ``path`` (``-``: standard output) as ``fmt``."""
    render, header = FORMATS[fmt]
    began, events, last = time.perf_counter(), 0, generator.config.start
    with _open(path) as out:
        out.write(header)
        for chunk in generator:
            out.write(render(chunk, prefix))
            events += len(chunk)
            last = float(chunk.timestamps[-1])
    seconds = time.perf_counter() - began
    rate = events / seconds if seconds > 0 else math.inf
    return WriteSummary(str(path), events, seconds, rate, _target_rate(generator, events, last))


def paced(
    chunks: Iterable[EventChunk],
    start: float,
    batch_size: int,
    *,
    linger_s: float = 0.1,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> Iterator[tuple[EventChunk, int, int, float]]:
    """Batches ``(chunk, start, stop, delay_s)`` released as their events arrive.

    Event times are ``timestamps - start`` seconds after the first call; a batch of at
    most ``batch_size`` leaves when its last event has arrived or its first has waited
    ``linger_s``. ``delay_s`` is how late the batch's first event is when it leaves.

    >>> from benchmarks.replay import SimulatedClock
    >>> clock = SimulatedClock()
    >>> chunk = EventChunk(0, *(np.zeros(4),) * 2, np.ones(4), np.array([0.1, 0.2, 0.3, 5.0]),
    ...                    np.zeros(4, bool))
    >>> [(round(clock(), 2), a, b) for _, a, b, _ in paced(
    ...     [chunk], 0.0, 2, clock=clock, sleep=clock.sleep)]
    [(0.2, 0, 2), (0.4, 2, 3), (5.0, 3, 4)]
    """
    began = clock()
    for chunk in chunks:
        offsets = chunk.timestamps - start
        first, n = 0, len(chunk)
        while first < n:
            stop = min(first + batch_size, n)
            release = min(float(offsets[stop - 1]), float(offsets[first]) + linger_s)
            wait = began + release - clock()
            if wait > 0:
                sleep(wait)
            now = clock() - began
            if now < offsets[stop - 1]:
                arrived = int(np.searchsorted(offsets, now, side="right"))
                stop = max(first + 1, min(stop, arrived))
            yield chunk, first, stop, max(0.0, now - float(offsets[first]))
            first = stop


def send_stream(
    generator: StreamGenerator,
    sink: Any,
    prefix: str,
    batch_size: int = 500,
    pace: bool = True,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    on_batch: Callable[[int], None] | None = None,
) -> WriteSummary:
    """Send the stream to ``sink`` (``benchmarks.replay``'s ``HttpSink`` or
    ``KafkaSink``) at its arrival times, or back to back without ``pace``."""
    began, events, last, worst = clock(), 0, generator.config.start, 0.0
    if pace:
        batches: Iterable[tuple[EventChunk, int, int, float]] = paced(
            generator, generator.config.start, batch_size, clock=clock, sleep=sleep
        )
    else:
        batches = (
            (chunk, a, min(a + batch_size, len(chunk)), 0.0)
            for chunk in generator
            for a in range(0, len(chunk), batch_size)
        )
    try:
        for chunk, first, stop, delay in batches:
            sink.send(chunk_events(chunk, first, stop, prefix))
            events += stop - first
            last = float(chunk.timestamps[stop - 1])
            worst = max(worst, delay)
            if on_batch is not None:
                on_batch(events)
        sink.finish()
    finally:
        sink.close()
    seconds = clock() - began
    rate = events / seconds if seconds > 0 else math.inf
    return WriteSummary(
        type(sink).__name__,
        events,
        seconds,
        rate,
        _target_rate(generator, events, last),
        worst,
        sink.accepted,
        sink.duplicates,
    )


def write_truth(generator: StreamGenerator, path: Path, extra: dict[str, Any]) -> None:
    """The ground truth of the stream drawn so far, and how it was drawn, as JSON."""
    config = generator.config
    document = {
        "generator": {
            "seed": config.seed,
            "events": config.events,
            "fit": config.fit.source,
            "trace": config.trace,
            "rate": config.rate,
            "speed": config.speed,
            "poisson": config.poisson,
            "start": config.start,
            "active_users": len(generator.active),
            "items": len(generator.catalogue),
            **extra,
        },
        **generator.truth.to_dict(),
    }
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
