"""``driftline bench soak``: the cluster fed a long generated stream, watched over time.

A ``benchmarks.cluster.LocalCluster`` (PostgreSQL schema, moto's S3, the embedded
broker, ``replicas`` replicas, HAProxy) runs with retraining on and ``EVENT_RETENTION``
set. The replicas consume the broker's topic, as they do in production; the benchmark
produces a generated stream (``benchmarks.streams``) with two planted drifts to it in
a closed loop: a batch is sent as long as the events produced but not yet stored stay
under ``max_lag``, so the rate is the highest the replicas sustain (``rate`` caps it).
The first ``prime_events`` go in alone and the rest waits for the bootstrap version to
serve on every replica, as a long-running service would (under full load the first job
and its swap take a few hundred thousand events, and would swallow the first drift of a
shortened run); the rates count from there.

Jobs run on the ``inprocess`` runtime, what the cluster tests use: a job trains inside
the leader's serving process, so its memory and its pauses show in that replica's
resident memory and in ``/recommend``'s latency, and nothing outlives the cluster.

Every ``sample_s`` a thread records the resident memory of each process (each replica
with its children, HAProxy, the broker, and this process, which holds moto and the
producer), the schema's size in PostgreSQL and its ``events`` rows, the bucket's size
by kind of object, and the events stored. A child process asks ``GET /recommend``
through HAProxy ``probe_rps`` times a second for recent users and logs each latency;
the p99 of each sampling interval is the latency over time. Where the server runs
without autovacuum, the sampler vacuums the schema every ``vacuum_s`` instead
(``benchmarks.bench.soak_sampler``). At the end: each job's window, duration and cost,
and the alerts against the planted drifts' onsets.

Sizes that would take a long stream to matter are scaled to ``events`` (``SoakConfig``):
the retention's count, the online-state snapshots (retention keeps every event after the
oldest one), a job window's recent events and the serving caps on users and (user, item)
pairs, so that a shortened run reaches the same steady state a 10^7-event one would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, create_engine, text

from benchmarks.bench.cluster import ClusterUnavailable, database_url
from benchmarks.bench.soak_sampler import Sampler
from benchmarks.cluster import (
    ClusterConfig,
    LocalCluster,
    haproxy_available,
)
from benchmarks.latency_probe import p99_per_interval, read_latencies
from benchmarks.launcher import stop_process
from benchmarks.streams.drifts import ChunkEvents, Drift, DriftEffect, make_drift
from benchmarks.streams.generator import GeneratorConfig, StreamGenerator
from benchmarks.streams.writer import chunk_events
from functions.pricing import lambda_prices

__all__ = ["SoakConfig", "run_soak"]

#: The drifts planted, each at a fraction of the stream.
PLANTED = (("sudden", 1 / 3), ("item_shift", 2 / 3))
#: The share of the stream after which the run counts as warmed up.
WARMUP = 0.2
#: A process's memory is "flat" when its fitted growth after warm-up is under this
#: share of its resident memory at warm-up.
FLAT_SHARE = 0.05
WAIT_S = 300.0
#: An ``inprocess`` job bills nothing (it runs on the replica's cores); its figure "as
#: Lambda" prices its duration on one worker of this size (one vCPU).
LAMBDA_EQUIVALENT_MB = 1_769


@dataclass(frozen=True)
class SoakConfig:
    """One soak run; the sizes left ``None`` are scaled to ``events`` (module docstring)."""

    events: int = 10_000_000
    replicas: int = 2
    rate: float | None = None
    runtime: str = "inprocess"
    seed: int = 0
    batch_size: int = 500
    max_lag: int = 20_000
    sample_s: float = 5.0
    probe_rps: float = 20.0
    heartbeat_events: int = 500
    refresh_events: int | None = None
    retention_events: int | None = None
    retention_interval_s: float = 5.0
    snapshot_every_events: int | None = None
    max_users: int | None = None
    prime_events: int = 5_000
    vacuum_s: float = 30.0
    settle_s: float = 120.0
    planted: tuple[tuple[str, float], ...] = PLANTED
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.events < 1_000:
            raise ValueError(f"a soak needs at least 1,000 events, got {self.events}")
        if self.replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {self.replicas}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be positive, got {self.rate}")

    def sizes(self) -> dict[str, int]:
        """The scaled sizes: what each ``None`` becomes for this run."""
        n = self.events
        return {
            "refresh_events": self.refresh_events or max(10_000, n // 10),
            "retention_events": self.retention_events or max(5_000, n // 10),
            "snapshot_every_events": self.snapshot_every_events or max(5_000, n // 20),
            "max_users": self.max_users or 4_096,
            "history_pairs": max(4_096, n // 20),
            "max_window_events": max(10_000, n // 10),
        }

    def replica_env(self) -> dict[str, str]:
        sizes = self.sizes()
        return {
            "DRIFTLINE_RETRAIN_RUNTIME": self.runtime,
            "DRIFTLINE_HEARTBEAT_EVENTS": str(self.heartbeat_events),
            "DRIFTLINE_REFRESH_EVENTS": str(sizes["refresh_events"]),
            "DRIFTLINE_EVENT_RETENTION": f"{sizes['retention_events']} events",
            "DRIFTLINE_RETENTION_INTERVAL_S": str(self.retention_interval_s),
            "DRIFTLINE_RETENTION_DEDUP_HORIZON_S": "5",
            "DRIFTLINE_SNAPSHOT_EVERY_EVENTS": str(sizes["snapshot_every_events"]),
            "DRIFTLINE_SNAPSHOT_RETENTION": "2",
            "DRIFTLINE_SERVING_MAX_USERS": str(sizes["max_users"]),
            "DRIFTLINE_SERVING_HISTORY_PAIRS": str(sizes["history_pairs"]),
            "DRIFTLINE_MAX_WINDOW_EVENTS": str(sizes["max_window_events"]),
            **self.env,
        }


# -- the stream ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Planted(Drift):
    """Several drifts of ``benchmarks.streams.drifts`` in one stream, each from its own
    onset; ``onset`` is the first of them. ``changed`` counts the events each one
    changed among the stream's first ``length``.

    >>> from benchmarks.streams.generator import StreamGenerator
    >>> stream = _SoakStream(events=9_000, planted=(("sudden", 0.3), ("item_shift", 0.6)))
    >>> generator = StreamGenerator(stream)
    >>> sum(map(len, generator)), [d.onset for d in generator.drift.drifts]
    (9000, [2700, 5400])
    >>> sum(generator.drift.changed.values()) >= generator.truth.drifted_events > 0
    True
    """

    drifts: tuple[Drift, ...] = ()
    length: int | None = None
    changed: dict[str, int] = field(default_factory=dict, compare=False)
    name: str = field(default="planted", init=False)

    def effect(self, events: ChunkEvents, rng: np.random.Generator) -> DriftEffect:
        n = events.index.size
        shift, invert, drifted = None, np.zeros(n, bool), np.zeros(n, bool)
        for drift in self.drifts:
            one = drift.effect(events, rng)
            if one.latent_shift is not None:
                shift = one.latent_shift if shift is None else shift + one.latent_shift
            invert |= one.invert
            drifted |= one.drifted
            counted = (
                one.drifted if self.length is None else one.drifted[events.index < self.length]
            )
            self.changed[drift.name] = self.changed.get(drift.name, 0) + int(counted.sum())
        return DriftEffect(shift, invert, drifted)

    def describe(self) -> str:
        return "; ".join(drift.describe() for drift in self.drifts)


@dataclass(frozen=True)
class _SoakStream(GeneratorConfig):
    """The generator's configuration with several planted drifts instead of one."""

    planted: tuple[tuple[str, float], ...] = ()

    def make_drift(self) -> Drift | None:
        drifts = tuple(make_drift(name, int(at * self.events)) for name, at in self.planted)
        if not drifts:
            return None
        return Planted(onset=min(d.onset for d in drifts), drifts=drifts, length=self.events)


# -- the feed ------------------------------------------------------------------------------
class _Feed:
    """The stream to the topic in batches, keyed by user, never more than ``max_lag``
    events ahead of the store (nor faster than ``rate``); ``newest`` names the newest
    user produced, for the probe."""

    def __init__(
        self,
        cluster: LocalCluster,
        generator: StreamGenerator,
        config: SoakConfig,
        engine: Engine,
        newest: Path,
    ) -> None:
        from kafka import KafkaProducer

        self.cluster, self.config, self.engine, self.newest = cluster, config, engine, newest
        self.producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=5)
        self.batches = self._batches(generator)
        self.produced = 0
        self._consumed, self._checked = 0, 0.0

    def _batches(self, generator: StreamGenerator) -> Iterator[tuple[list[dict], int]]:
        size, prefix = self.config.batch_size, f"soak{self.config.seed}"
        for chunk in generator:
            for start in range(0, len(chunk), size):
                stop = min(start + size, len(chunk))
                newest = int(chunk.users[start:stop].max())
                yield chunk_events(chunk, start, stop, prefix), newest

    def _consumed_now(self) -> int:
        """Messages the replicas stored: their offsets, stored with the events."""
        query = "SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE topic = :t"
        with self.engine.connect() as conn:
            return int(conn.scalar(text(query), {"t": self.cluster.topic}) or 0)

    def run(self, until: int) -> None:
        """Produce until ``until`` events of the stream have been sent and acknowledged."""
        began, base, rate = time.monotonic(), self.produced, self.config.rate
        while self.produced < until:
            batch = next(self.batches, None)
            if batch is None:
                break
            while self.produced - self._consumed > self.config.max_lag:
                if time.monotonic() - self._checked < 0.05:
                    time.sleep(0.05)
                self._consumed, self._checked = self._consumed_now(), time.monotonic()
            if rate is not None:
                wait = began + (self.produced - base) / rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            events, newest = batch
            for event in events:
                value = json.dumps(event).encode()
                self.producer.send(self.cluster.topic, key=event["user_id"].encode(), value=value)
            self.produced += len(events)
            self.newest.write_text(str(newest))
        self.producer.flush(timeout=60)

    def close(self) -> None:
        self.producer.close(timeout=10)


# -- what the run found --------------------------------------------------------------------
def _rows(engine: Engine, query: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(text(query))]


def _jobs(engine: Engine) -> list[dict[str, Any]]:
    jobs = _rows(
        engine,
        "SELECT id, trigger, status, created_at, started_at, finished_at, window_events, "
        "last_event_id, cost_usd, model_version, stop_reason FROM retrain_jobs ORDER BY id",
    )
    prices = lambda_prices()
    for job in jobs:
        began, ended = job["started_at"], job["finished_at"]
        job["duration_s"] = None if began is None or ended is None else ended - began
        job["cost_usd_as_lambda"] = (
            None
            if job["duration_s"] is None
            else prices.invocation_cost(job["duration_s"] * 1000, LAMBDA_EQUIVALENT_MB)
        )
    return jobs


def _heartbeats(engine: Engine, most: int = 400) -> list[dict[str, Any]]:
    """The leader's heartbeats (prequential RMSE by events seen), at most ``most``."""
    rows = _rows(
        engine,
        "SELECT events_seen, rmse, static_rmse, model_version FROM heartbeats ORDER BY events_seen",
    )
    step = max(1, len(rows) // most)
    return rows[::step]


def _alerts(engine: Engine, drifts: list[dict[str, Any]], events: int) -> dict[str, Any]:
    """Each planted drift's first alert after its onset (and before the next one's),
    its delay in events, and the alerts before any drift."""
    keys = ("id", "detected_at", "metric", "events_seen", "change_events", "retrain_job_id")
    alerts = [
        {key: row[key] for key in keys}
        for row in _rows(engine, "SELECT * FROM drift_alerts ORDER BY events_seen")
        if row.get("kind", "drift") == "drift"  # other kinds, where a schema has them
    ]
    onsets = [d["onset"] for d in drifts] + [events + 1]
    matched = []
    for k, drift in enumerate(drifts):
        inside = [a for a in alerts if onsets[k] <= a["events_seen"] < onsets[k + 1]]
        first = inside[0] if inside else None
        matched.append(
            {
                **drift,
                "alerts": len(inside),
                "first_alert_events_seen": None if first is None else first["events_seen"],
                "delay_events": None if first is None else first["events_seen"] - drift["onset"],
            }
        )
    early = sum(1 for a in alerts if a["events_seen"] < onsets[0])
    return {"alerts": alerts, "drifts": matched, "alerts_before_any_drift": early}


def _fit(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ``ys`` over ``xs`` (0 with fewer than 3 points)."""
    if len(xs) < 3 or max(xs) == min(xs):
        return 0.0
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])


def _summary(
    samples: list[dict[str, Any]], events: int, began: float, primed: int
) -> dict[str, Any]:
    """Rates from ``began`` (``primed`` events stored by then), and each series' slope
    per million events stored from warm-up until the last event was stored (the samples
    after, while jobs finish, count for the maxima)."""
    end = samples[-1]
    done = next(s for s in samples if s["stored"] >= end["stored"])
    warm = next((s for s in samples if s["stored"] >= WARMUP * events), samples[0])
    after = [s for s in samples if warm["t"] <= s["t"] <= done["t"]]
    millions = [s["stored"] / 1e6 for s in after]
    span = (done["stored"] - warm["stored"]) / 1e6
    out: dict[str, Any] = {
        "events_per_s": (done["stored"] - primed) / max(done["t"] - began, 1e-9),
        "events_per_s_after_warmup": (done["stored"] - warm["stored"])
        / max(done["t"] - warm["t"], 1e-9),
        "warmup_events": warm["stored"],
        "flat_share": FLAT_SHARE,
    }
    for key in [k for k in end if k.startswith("rss_")]:
        name = key.removeprefix("rss_")
        slope = _fit(millions, [s[key] / 2**20 for s in after])
        start_mb = warm[key] / 2**20
        out[f"rss_{name}_mb_warmup"] = start_mb
        out[f"rss_{name}_mb_end"] = end[key] / 2**20
        out[f"rss_{name}_mb_max"] = max(s[key] for s in samples) / 2**20
        out[f"rss_{name}_mb_per_million_events"] = slope
        out[f"rss_{name}_flat"] = slope * span < FLAT_SHARE * start_mb
    for key in ("db_bytes", *[k for k in end if k.startswith("store_")]):
        name = key.removesuffix("_bytes")
        out[f"{name}_mb_warmup"] = warm[key] / 2**20
        out[f"{name}_mb_end"] = end[key] / 2**20
        out[f"{name}_mb_max"] = max(s[key] for s in samples) / 2**20
        out[f"{name}_mb_per_million_events"] = _fit(millions, [s[key] / 2**20 for s in after])
    rows = [s["db_event_rows"] for s in after]
    out["db_event_rows_per_million_events"] = _fit(millions, rows)
    out["db_event_rows_max_after_warmup"] = max(rows)
    out["db_event_rows_end"] = end["db_event_rows"]
    return out


# -- the run -------------------------------------------------------------------------------
def _requirements() -> str:
    if not haproxy_available():
        raise ClusterUnavailable("bench soak needs HAProxy (Debian package haproxy)")
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        raise ClusterUnavailable("bench soak needs moto's S3 server (test extra)") from exc
    return database_url()


def _wait_stored(sampler: Sampler, produced: int, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while sampler.sample()["stored"] < produced:
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench soak: {produced} events produced, not all stored")
        time.sleep(0.5)


def _settle(engine: Engine, config: SoakConfig) -> None:
    """Wait (at most ``settle_s``) for a version, no job queued or running, and one
    more archiving run with nothing left to delete."""
    jobs = text(
        "SELECT (SELECT count(*) FROM retrain_jobs WHERE status IN ('queued', 'running')), "
        "(SELECT count(*) FROM model_versions)"
    )
    purging = text("SELECT count(*) FROM event_archives WHERE purged_at IS NULL")
    deadline = time.monotonic() + config.settle_s
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            busy, versions = conn.execute(jobs).one()
        if busy == 0 and versions > 0:
            break
        time.sleep(1.0)
    time.sleep(config.retention_interval_s)
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if not conn.scalar(purging):
                return
        time.sleep(1.0)


def _start_probe(url: str, rps: float, users: Path, out: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "benchmarks.latency_probe", url, str(rps)]
    return subprocess.Popen([*command, str(users), str(out)])


def _wait_serving(cluster: LocalCluster, timeout: float) -> None:
    """Wait until every replica serves a version."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        versions = [
            (cluster.health(i) or {}).get("model_version") for i in range(len(cluster.replicas))
        ]
        if all(versions):
            return
        time.sleep(0.5)
    raise TimeoutError(f"bench soak: no version served on every replica after {timeout} s")


def _soak(cluster: LocalCluster, config: SoakConfig, work_dir: Path) -> dict[str, Any]:
    """Prime, then feed, sample and probe ``cluster``; the raw figures."""
    stream = _SoakStream(events=config.events, seed=config.seed, planted=config.planted)
    generator = StreamGenerator(stream)
    engine = create_engine(cluster.database_url, pool_size=3, max_overflow=2)
    newest, latency_log = work_dir / "newest-user", work_dir / "recommend.csv"
    newest.write_text("0")
    feed = _Feed(cluster, generator, config, engine, newest)
    sampler = Sampler(cluster, engine, config.sample_s, config.vacuum_s)
    sampler.produced = lambda: feed.produced
    probe = _start_probe(cluster.lb_url, config.probe_rps, newest, latency_log)
    try:
        sampler.start()
        t0 = time.time()
        feed.run(min(config.prime_events, config.events))
        _wait_serving(cluster, config.settle_s)
        primed, began = feed.produced, time.time()
        feed.run(config.events)
        fed = time.time()
        _wait_stored(sampler, feed.produced)
        stored = time.time()
        cluster.wait_drained(timeout=WAIT_S)
        _settle(engine, config)
        stop_process(probe)
        sampler.stop()
        drift: Any = generator.drift
        planted = [
            {"drift": d.name, "description": d.describe(), "onset": d.onset}
            for d in (drift.drifts if drift is not None else ())
        ]
        dead = int(_rows(engine, "SELECT count(*) AS n FROM dead_letters")[0]["n"])
        return {
            "t0": t0,
            "began": began,
            "primed": primed,
            "primed_s": began - t0,
            "fed_s": fed - began,
            "stored_s": stored - began,
            "produced": feed.produced,
            "samples": sampler.samples,
            "tables": sampler.tables,
            "latencies": read_latencies(latency_log),
            "jobs": _jobs(engine),
            "heartbeats": _heartbeats(engine),
            "planted": _alerts(engine, planted, config.events),
            "changed": dict(drift.changed) if drift is not None else {},
            "dead_letters": dead,
            "autovacuum": sampler.autovacuum,
            "vacuums": sampler.vacuums,
        }
    finally:
        stop_process(probe)
        feed.close()
        engine.dispose()


def _figures(raw: dict[str, Any], config: SoakConfig) -> dict[str, Any]:
    samples, t0 = raw["samples"], raw["t0"]
    latencies = raw["latencies"]
    ok = latencies[latencies[:, 2] == 200][:, 1] * 1000 if latencies.size else np.zeros(0)
    series = p99_per_interval(latencies, samples) if latencies.size else []
    figures: dict[str, Any] = {
        **{f"config_{k}": v for k, v in asdict(config).items() if k not in ("env", "planted")},
        **{f"config_{k}": v for k, v in config.sizes().items()},
        "cores": os.cpu_count() or 1,
        "t0": t0,
        "events_produced": raw["produced"],
        "events_stored": samples[-1]["stored"],
        "events_lost": raw["produced"] - samples[-1]["stored"],
        "dead_letters": raw["dead_letters"],
        "postgres_autovacuum": raw["autovacuum"],
        "soak_vacuums": raw["vacuums"],
        "feed_s": raw["fed_s"],
        "drained_s": raw["stored_s"],
        "primed_events": raw["primed"],
        "primed_s": raw["primed_s"],
        **_summary(samples, config.events, raw["began"], raw["primed"]),
        "recommend_requests": int(latencies.shape[0]),
        "recommend_errors": int((latencies[:, 2] != 200).sum()) if latencies.size else 0,
        "recommend_p50_ms": float(np.percentile(ok, 50)) if ok.size else None,
        "recommend_p99_ms": float(np.percentile(ok, 99)) if ok.size else None,
        "recommend_p99_ms_worst_interval": max(
            (row["p99_ms"] for row in series if row["p99_ms"] is not None), default=None
        ),
        "jobs": raw["jobs"],
        "jobs_run": sum(1 for job in raw["jobs"] if job["status"] == "succeeded"),
        "jobs_cost_usd": sum(job["cost_usd"] or 0.0 for job in raw["jobs"]),
        "jobs_cost_usd_as_lambda": sum(job["cost_usd_as_lambda"] or 0.0 for job in raw["jobs"]),
        "planted": raw["planted"]["drifts"],
        "planted_changed_events": raw["changed"],
        "alerts": raw["planted"]["alerts"],
        "heartbeats": raw["heartbeats"],
        "alerts_before_any_drift": raw["planted"]["alerts_before_any_drift"],
        "db_tables_mb_end": {k: v / 2**20 for k, v in sorted(raw["tables"].items())},
        "timeline": [
            {
                "s": round(row["t"] - t0, 1),
                "stored": row["stored"],
                "db_mb": row["db_bytes"] / 2**20,
                "db_event_rows": row["db_event_rows"],
                **{
                    f"{k.removesuffix('_bytes')}_mb": v / 2**20
                    for k, v in row.items()
                    if k.startswith(("rss_", "store_"))
                },
            }
            for row in samples
        ],
        "recommend_p99_timeline": [
            {"s": round(row["t"] - t0, 1), **{k: v for k, v in row.items() if k != "t"}}
            for row in series
        ],
    }
    return figures


def run_soak(
    dataset: Path | None = None,
    limit: int | None = None,
    batch_size: int = 500,
    *,
    events: int | None = None,
    replicas: int = 2,
    rate: float | None = None,
    plot: Path | None = None,
    work_dir: Path | None = None,
    config: SoakConfig | None = None,
) -> dict[str, Any]:
    """Run a soak (module docstring); ``config`` overrides the other options. Writes
    ``soak-memory.png``, ``soak-db.png`` and ``soak-p99.png`` into ``plot``."""
    if dataset is not None:
        raise ValueError("bench soak replays the generated stream; it takes no --dataset")
    if config is None:
        config = SoakConfig(
            events=events or limit or SoakConfig.events,
            replicas=replicas,
            rate=rate,
            batch_size=batch_size,
        )
    base_url = _requirements()
    with tempfile.TemporaryDirectory(prefix="driftline-bench-soak-") as tmp:
        root = work_dir or Path(tmp)
        cluster_config = ClusterConfig(
            database_url=base_url,
            work_dir=root / "cluster",
            replicas=config.replicas,
            env=config.replica_env(),
        )
        began = time.monotonic()
        with LocalCluster(cluster_config) as cluster:
            started = time.monotonic() - began
            raw = _soak(cluster, config, root)
    figures = {"start_s": started, **_figures(raw, config)}
    if plot is not None:
        from benchmarks.bench.soak_plots import plot_soak

        figures["plots"] = [str(p) for p in plot_soak(figures, plot)]
    return figures
