"""``driftline demo``: MovieLens (or a stream generated like it) through a live service.

The server runs as a real ``driftline serve`` process on loopback with a temporary data
directory; the ratings go through ``POST /ingest`` in timestamp order (or, with
``--kafka``, through an embedded Kafka-protocol broker the service consumes), while
river's ``BiasedMF`` learns the same stream in this process for comparison.

By default 30 % of the users invert their taste at 60 % of the stream (``--no-drift``
replays MovieLens as it is), so the loop the service is named for shows: the drift
alert, where it lies, the job it starts and what it costs, and the accuracy after it.

MovieLens does not ship with Driftline. Where ``--dataset``, ``DRIFTLINE_DATASETS`` and
the cache hold no copy (``benchmarks.datasets.registry``), the demo says so and replays
a stream generated from the parameters fitted to MovieLens (``benchmarks.streams``) of
the same length, its drift planted by the generator: the same loop either way.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from kafka import KafkaProducer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TimeElapsedColumn,
)
from rich.table import Table

from benchmarks.baselines import RiverTrack
from benchmarks.broker import EmbeddedBroker
from benchmarks.datasets import RatingStream, load_ratings, load_titles
from benchmarks.datasets.registry import resolve
from benchmarks.launcher import ServerProcess, free_port
from benchmarks.replay import pace
from benchmarks.scenarios import plant
from benchmarks.streams import GeneratorConfig, generate_stream, load_fit
from benchmarks.traces import make_trace
from drift.ranking import RankingSampler
from service.settings import Settings

#: Events per second both demos replay at unless ``--rate`` says otherwise, steadily and
#: without waiting for jobs, as a topic does not wait. The loop's latency in events is a
#: job's seconds times the rate: on two shared cores at 2,500 events/s (about 40 s for
#: MovieLens) the alert came 4,500-5,500 events after the onset and drift versions served
#: within the stream on both paths; at 5,000 the Kafka path's drift job (16 s beside the
#: consumer) published after the last event.
DEFAULT_RATE = 2_500.0
#: Longest an event may wait past its due time before the summary says the replay (or
#: the service behind it) fell behind the stated rate.
LAG_TOLERANCE_S = 1.0
#: Seconds between looks at how many events the service has stored (Kafka's progress).
_STORED_EVERY_S = 0.5


@dataclass(frozen=True)
class Replayed:
    """How a demo's replay went: ``rate`` asked, ``achieved`` over the sending, and how
    far the service was behind (events sent but not yet stored; for HTTP, 0: a POST is
    answered once its events are stored)."""

    events: int
    rate: float
    seconds: float
    max_delay_s: float
    max_behind_events: int
    drained_s: float

    @property
    def achieved(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else math.inf

    @property
    def kept_up(self) -> bool:
        return self.max_delay_s <= LAG_TOLERANCE_S

    def lines(self, through: str) -> list[str]:
        lines = [
            f"replayed {self.events:,} events {through} at {self.achieved:,.0f} events/s "
            f"(asked {self.rate:,.0f}) in {self.seconds:.1f} s, waiting for no job"
        ]
        if self.max_behind_events:
            lines.append(
                f"the service was at most {self.max_behind_events:,} events behind the topic "
                f"and had stored the last {self.drained_s:.1f} s after it was sent"
            )
        if not self.kept_up:
            lines.append(
                f"fell behind the stated rate: an event waited up to {self.max_delay_s:.1f} s "
                "past its due time (the service or this machine could not keep up)"
            )
        return lines


def replay(
    client: httpx.Client, stream: RatingStream, rate: float, batch_size: int = 500
) -> Replayed:
    """``POST /ingest`` the stream at ``rate`` events/s, in batches of at most
    ``batch_size``, with a progress bar. Nothing waits for jobs: the stream goes on
    while they run, as a real one does."""

    def send(start: int, stop: int) -> None:
        client.post("/ingest", json={"events": stream.events(start, stop)}).raise_for_status()

    with _bar("replaying ratings", len(stream)) as (progress, task):
        paced = pace(
            make_trace("constant", rate=rate),
            len(stream),
            batch_size,
            send,
            on_batch=lambda sent, _: progress.update(task, completed=sent),
        )
    return Replayed(len(stream), rate, paced.seconds, paced.max_delay_s, 0, 0.0)


def replay_kafka(
    client: httpx.Client, bootstrap: str, stream: RatingStream, rate: float, batch_size: int = 500
) -> Replayed:
    """Produce the stream to the topic the service consumes at ``rate`` events/s.

    The bar counts events the service has made durable, not messages sent; how far the
    consumer fell behind the topic is measured on the way.
    """
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    behind = {"most": 0, "looked": 0.0}

    def stored() -> int:
        return int(client.get("/healthz").json()["events_stored"])

    with _bar("replaying ratings through Kafka", len(stream)) as (progress, task):

        def send(start: int, stop: int) -> None:
            for event in stream.events(start, stop):
                producer.send(
                    "events", key=event["user_id"].encode(), value=json.dumps(event).encode()
                )

        def on_batch(sent: int, elapsed: float) -> None:
            if elapsed - behind["looked"] < _STORED_EVERY_S:
                return
            behind["looked"] = elapsed
            done = stored()
            behind["most"] = max(behind["most"], sent - done)
            progress.update(task, completed=done)

        paced = pace(
            make_trace("constant", rate=rate), len(stream), batch_size, send, on_batch=on_batch
        )
        producer.flush()
        producer.close()
        sent_at = time.monotonic()
        done = stored()
        while done < len(stream):
            behind["most"] = max(behind["most"], len(stream) - done)
            progress.update(task, completed=done)
            time.sleep(0.1)
            done = stored()
        progress.update(task, completed=done)
    drained = time.monotonic() - sent_at
    return Replayed(
        len(stream), rate, paced.seconds, paced.max_delay_s, int(behind["most"]), drained
    )


@contextlib.contextmanager
def _bar(label: str, total: int) -> Iterator[tuple[Progress, TaskID]]:
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn()) as progress:
        yield progress, progress.add_task(label, total=total)


def wait_for_jobs(client: httpx.Client, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/healthz").json().get("retrain_job_running") is None:
            return
        time.sleep(0.5)


def post_onset(
    client: httpx.Client,
    onset: int,
    stream: RatingStream,
    river_predictions: np.ndarray,
    river: RiverTrack,
) -> dict[str, dict[str, float | None]]:
    """RMSE and hit-rate@10 after the onset, for Driftline, the never-retrained model
    and river (``--json``'s ``post_onset``)."""
    beats = client.get("/drift/heartbeats", params={"since_events": onset}).json()["heartbeats"]
    errors = (stream.ratings[onset:] - river_predictions[onset:]) ** 2
    return {
        "rmse": {
            "driftline": _pooled_value(beats, "rmse"),
            "never_retrained": _pooled_value(beats, "static_rmse"),
            "river": float(np.sqrt(errors.mean())) if errors.size else None,
        },
        "hit_rate": {
            "driftline": _pooled_rate_value(beats, "hit_rate"),
            "never_retrained": _pooled_rate_value(beats, "static_hit_rate"),
            "river": river.hit_rate_since(onset),
        },
    }


def rollout_figures(client: httpx.Client) -> dict[str, object]:
    """What the rollout guard did: versions promoted, held and rolled back, each with
    its trigger and decision (``GET /models``, ``GET /jobs``)."""
    versions = client.get("/models").json()["versions"]
    jobs = {j["id"]: j for j in client.get("/jobs", params={"limit": 500}).json()["jobs"]}
    rows = []
    for v in sorted(versions, key=lambda row: row["created_at"]):
        guard = v.get("guard") or {}
        job = jobs.get(v["job_id"]) or {}
        watch = guard.get("watch") or {}
        rows.append(
            {
                "version": v["version"],
                "trigger": job.get("trigger"),
                "state": guard.get("state", "served at publication"),
                "compared_with": guard.get("compared_with"),
                "shadow_events": guard.get("events_compared"),
                "decision": guard.get("decision"),
                "reason": guard.get("reason"),
                "watch_events": watch.get("events_compared"),
                "watch_rmse_diff": (watch.get("rmse_diff") or {}).get("estimate"),
                "watch_hit_rate_diff": (watch.get("hit_rate_diff") or {}).get("estimate"),
            }
        )
    states = [row["state"] for row in rows]
    return {
        "held": states.count("held"),
        "rolled_back": states.count("rolled_back"),
        "promoted": sum(row["state"] in ("watch", "kept", "rolled_back") for row in rows),
        "versions": rows,
    }


def drift_table(
    client: httpx.Client,
    onset: int,
    stream: RatingStream,
    river_predictions: np.ndarray,
    river: RiverTrack,
) -> Table:
    """The planted drift: alerts with their delay and segments, accuracy after the
    onset for each model, and what the jobs it started cost."""
    table = Table(title=f"Planted drift: 30 % of users invert their taste at event {onset:,}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    listed = client.get("/drift/alerts").json()["alerts"]
    alerts = sorted(
        (a for a in listed if a.get("kind", "drift") == "drift"), key=lambda a: a["events_seen"]
    )
    if not alerts:
        table.add_row("drift alerts", "none")
    for alert in alerts:
        delay = alert["events_seen"] - onset
        when = (
            f"{delay:,} events after the onset"
            if delay >= 0
            else f"at event {alert['events_seen']:,}, before the planted onset"
        )
        table.add_row(
            f"alert {alert['id']}",
            f"RMSE {alert['before']:.3f} → {alert['after']:.3f}, {when}",
        )
        for line in _segment_lines(client, alert["id"]):
            table.add_row("", line)
    beats = client.get("/drift/heartbeats", params={"since_events": onset}).json()["heartbeats"]
    for label, key in (("Driftline", "rmse"), ("never retrained", "static_rmse")):
        table.add_row(f"RMSE after the onset, {label}", _pooled(beats, key))
    errors = (stream.ratings[onset:] - river_predictions[onset:]) ** 2
    table.add_row("RMSE after the onset, river BiasedMF", f"{np.sqrt(errors.mean()):.4f}")
    for label, key in (("Driftline", "hit_rate"), ("never retrained", "static_hit_rate")):
        table.add_row(f"hit-rate@10 after the onset, {label}", _pooled_rate(beats, key))
    river_rate = river.hit_rate_since(onset)
    river_cell = "n/a" if river_rate is None else f"{river_rate:.3f}"
    table.add_row("hit-rate@10 after the onset, river BiasedMF", river_cell)
    jobs = client.get("/jobs").json()["jobs"]
    drift_jobs = [j for j in jobs if j.get("trigger") == "drift"]
    cost = sum(j.get("cost_usd") or 0.0 for j in jobs)
    table.add_row("drift-triggered jobs", str(len(drift_jobs)))
    table.add_row("retraining cost, all jobs", f"${cost:.6f}")
    for label, value in _configurator_rows(client, jobs):
        table.add_row(label, value)
    return table


def _configurator_rows(client: httpx.Client, jobs: list[dict]) -> list[tuple[str, str]]:
    """What the configurator chose in the newest job: its most used config vector, and
    how its decisions' predicted latencies compared with what the epochs took."""
    if not jobs:
        return []
    newest = max(jobs, key=lambda j: j["id"])
    detail = client.get(f"/jobs/{newest['id']}").json()
    epochs = detail.get("epochs") or []
    if not epochs:
        return []
    picks: dict[str, int] = {}
    for epoch in epochs:
        c = epoch["config"]
        key = (
            f"λ {c['workers']}, κ/λ {c['sync_ratio']:g}, {c['memory_mb']} MB, "
            f"batch {c['batch_size']}, lr {c['learning_rate']:g}"
        )
        picks[key] = picks.get(key, 0) + 1
    chosen = max(picks, key=lambda k: picks[k])
    rows = [
        (f"configurator ({newest['params'].get('configurator', '?')}), job {newest['id']}", chosen),
        ("  epochs, distinct configs", f"{len(epochs)}, {len(picks)}"),
    ]
    decisions = [e["config"].get("decision") for e in epochs if e["config"].get("decision")]
    if decisions:
        ms = sorted(d["decision_ms"] for d in decisions)
        predicted = sum(d["latency_s"] for d in decisions)
        observed = sum(d["observed_latency_s"] or 0.0 for d in decisions)
        rows.append(("  decision time p50", f"{ms[len(ms) // 2]:.1f} ms"))
        rows.append(("  epoch seconds predicted / taken", f"{predicted:.2f} / {observed:.2f}"))
    rows.append(("  job cost", f"${newest.get('cost_usd') or 0.0:.6f}"))
    return rows


def _segment_lines(client: httpx.Client, alert_id: int) -> list[str]:
    """One line per segment of the alert's error rise, and the users whose error rose
    most, from ``GET /drift/alerts/{id}``."""
    response = client.get(f"/drift/alerts/{alert_id}")
    if response.status_code != 200:
        return []
    segments = response.json().get("segments") or {}
    lines = []
    for split, names in (("users", ("new", "returning")), ("items", ("head", "tail"))):
        for name in names:
            figures = (segments.get(split) or {}).get(name) or {}
            if figures.get("rmse_after") is None:
                continue
            before = figures.get("rmse_before")
            share = figures.get("share_of_rise")
            lines.append(
                f"{name} {split}: RMSE {'n/a' if before is None else f'{before:.3f}'} → "
                f"{figures['rmse_after']:.3f}, "
                f"{'n/a' if share is None else f'{share:.0%}'} of the rise"
            )
    top = [str(entry["id"]) for entry in segments.get("top_users") or []][:5]
    if top:
        lines.append("users whose error rose most: " + ", ".join(top))
    return lines


def _pooled(beats: list[dict], key: str) -> str:
    value = _pooled_value(beats, key)
    return "n/a" if value is None else f"{value:.4f}"


def _pooled_value(beats: list[dict], key: str) -> float | None:
    rows = [b for b in beats if b.get(key) is not None]
    if not rows:
        return None
    events = np.array([b["events"] for b in rows], dtype=np.float64)
    values = np.array([b[key] for b in rows], dtype=np.float64)
    return float(np.sqrt((values**2 * events).sum() / events.sum()))


def _pooled_rate(beats: list[dict], key: str) -> str:
    value = _pooled_rate_value(beats, key)
    return "n/a" if value is None else f"{value:.3f}"


def _pooled_rate_value(beats: list[dict], key: str) -> float | None:
    rows = [b for b in beats if b.get(key) is not None and b.get("ranked_events")]
    if not rows:
        return None
    weights = np.array([b["ranked_events"] for b in rows], dtype=np.float64)
    rates = np.array([b[key] for b in rows], dtype=np.float64)
    return float((rates * weights).sum() / weights.sum())


def summary_table(
    client: httpx.Client,
    events: int,
    river: RiverTrack,
    replayed: Replayed | None = None,
    name: str = "MovieLens",
) -> Table:
    health = client.get("/healthz").json()
    prequential = health["prequential"]
    jobs = client.get("/jobs").json()["jobs"]
    table = Table(title=f"Driftline on {name} (prequential: predict, then learn)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("events replayed", f"{events:,}")
    if replayed is not None:
        table.add_row(
            "replay rate (asked, achieved)",
            f"{replayed.rate:,.0f}, {replayed.achieved:,.0f} events/s",
        )
    for label, track in (("Driftline", "driftline"), ("never-retrained model", "static")):
        rmse = prequential.get(track, {}).get("rmse")
        table.add_row(f"RMSE {label}", "n/a" if rmse is None else f"{rmse:.4f}")
    table.add_row("RMSE river BiasedMF (every event)", f"{river.rmse:.4f}")
    alerts = client.get("/drift/alerts").json()["alerts"]
    kinds = [a.get("kind", "drift") for a in alerts]
    table.add_row("drift alerts", str(kinds.count("drift")))
    rollout = rollout_figures(client)
    table.add_row(
        "versions promoted, held, rolled back (guard)",
        f"{rollout['promoted']}, {rollout['held']}, {rollout['rolled_back']}",
    )
    succeeded = [j for j in jobs if j["status"] == "succeeded"]
    table.add_row("retraining jobs (succeeded)", f"{len(jobs)} ({len(succeeded)})")
    table.add_row("model versions", str(len(client.get("/models").json()["versions"])))
    table.add_row("serving model", serving_line(health["model_version"], rollout))
    return table


def serving_line(serving: str | None, rollout: dict[str, object]) -> str:
    """The serving version, and the newest one when the guard still compares it in
    shadow: a version published late in the stream has had few events to prove itself."""
    rows = rollout["versions"]
    assert isinstance(rows, list)
    newest = rows[-1] if rows else None
    if newest is None or newest["state"] != "shadow" or newest["version"] == serving:
        return str(serving)
    compared = newest["shadow_events"] or 0
    return f"{serving} ({newest['version']} in shadow, {compared:,} events compared)"


def top10_table(client: httpx.Client, user: str, titles: dict[str, str]) -> Table:
    answer = client.get("/recommend", params={"user_id": user, "k": 10}).json()
    table = Table(title=f"Top 10 for user {user} ({answer['source']}, {answer['model_version']})")
    table.add_column("#", justify="right")
    table.add_column("movie")
    table.add_column("score", justify="right")
    for rank, item in enumerate(answer["items"], start=1):
        title = titles.get(item["item_id"], item["item_id"])
        table.add_row(str(rank), title, f"{item['score']:.3f}")
    return table


def demo_key(data_dir: Path) -> str:
    """An admin key for the demo's own service, created before it starts.

    The demo runs the service as users do, with access control on: every request the
    demo makes carries this key.
    """
    from service.auth.keys import create_key
    from service.settings import Settings
    from service.store import Database

    db = Database(Settings(data_dir=data_dir).resolved_database_url)
    try:
        return create_key(db, "demo", ["admin"]).token
    finally:
        db.dispose()


def run_demo(
    limit: int | None = None,
    batch_size: int = 500,
    user: str | None = None,
    kafka: bool = False,
    drift: bool = True,
    rate: float = DEFAULT_RATE,
    dataset: Path | None = None,
    as_json: bool = False,
) -> None:
    """Replay the stream through a live service and print what happened; ``as_json``
    prints the figures as one JSON object last (``post_onset``, ``rollout``, ...)."""
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number of events per second, got {rate!r}")
    console = Console()
    found = resolve(dataset)
    console.print(found.describe())
    onset: int | None = None
    titles: dict[str, str] = {}
    if found.ratings is None:
        name = "a stream generated like MovieLens"
        config = GeneratorConfig(
            events=limit or load_fit().events, drift="sudden" if drift else None, drift_at=0.6
        )
        stream = generate_stream(config)
        planned = config.make_drift()
        onset = None if planned is None else planned.onset
    else:
        name = found.spec.title if found.origin != "--dataset" else found.ratings.name
        stream = load_ratings(found.ratings, limit=limit)
        titles = load_titles(found.titles) if found.titles is not None else {}
        if drift:
            planted = plant("sudden", stream, at=0.6)
            stream, onset = planted.stream, planted.onset
    # river ranks the events the service ranks: the same fixed sample of liked events.
    # It learns the stream here, before the replay, so the replay's pace is the topic's.
    settings = Settings()
    river = RiverTrack(ranking=RankingSampler(settings.ranking_sample, settings.ranking_min_rating))
    river_predictions = river.process(
        stream.user_ids, stream.item_ids, stream.ratings, stream.timestamps
    )
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="driftline-demo-")))
        env: dict[str, str] = {}
        if kafka:
            broker = stack.enter_context(EmbeddedBroker(port=free_port(), partitions=4))
            console.print(f"Kafka-protocol broker at {broker.bootstrap}, topic 'events'")
            env["DRIFTLINE_KAFKA_BOOTSTRAP"] = broker.bootstrap
        console.print(f"Starting driftline serve with data in {tmp} …")
        key = demo_key(tmp)
        server = stack.enter_context(ServerProcess(tmp, env=env))
        auth = {"Authorization": f"Bearer {key}"}
        client = stack.enter_context(httpx.Client(base_url=server.url, timeout=120, headers=auth))
        console.print(f"Service at {server.url} (dashboard: {server.url}/dashboard)")
        console.print(f"API key of this demo (admin; sign in to the dashboard with it): {key}")
        through = "through Kafka" if kafka else "through POST /ingest"
        console.print(
            f"Replaying {len(stream):,} ratings {through} at a steady {rate:,.0f} events/s "
            f"(about {len(stream) / rate:.0f} s); jobs run beside the stream, never waited for"
        )
        if kafka:
            replayed = replay_kafka(client, broker.bootstrap, stream, rate, batch_size)
        else:
            replayed = replay(client, stream, rate, batch_size)
        for line in replayed.lines(through):
            console.print(line)
        wait_for_jobs(client)
        console.print(summary_table(client, len(stream), river, replayed, name))
        if onset is not None:
            console.print(drift_table(client, onset, stream, river_predictions, river))
        chosen = user or Counter(stream.user_ids).most_common(1)[0][0]
        console.print(top10_table(client, chosen, titles))
        if as_json:
            figures = demo_figures(client, len(stream), river, replayed, name)
            if onset is not None:
                figures["onset"] = onset
                figures["post_onset"] = post_onset(client, onset, stream, river_predictions, river)
            print(json.dumps(figures, sort_keys=True))


def demo_figures(
    client: httpx.Client, events: int, river: RiverTrack, replayed: Replayed, name: str
) -> dict[str, object]:
    """The summary table's figures, JSON-ready."""
    health = client.get("/healthz").json()
    prequential = health["prequential"]
    jobs = client.get("/jobs", params={"limit": 500}).json()["jobs"]
    alerts = client.get("/drift/alerts").json()["alerts"]
    return {
        "stream": name,
        "events": events,
        "rate": {"asked": replayed.rate, "achieved": replayed.achieved},
        "rmse": {
            "driftline": prequential.get("driftline", {}).get("rmse"),
            "never_retrained": prequential.get("static", {}).get("rmse"),
            "river": river.rmse,
        },
        "hit_rate": {
            "driftline": prequential.get("driftline", {}).get("hit_rate"),
            "never_retrained": prequential.get("static", {}).get("hit_rate"),
            "river": river.hit_rate,
        },
        "drift_alerts": sum(a.get("kind", "drift") == "drift" for a in alerts),
        "jobs": len(jobs),
        "jobs_succeeded": sum(j["status"] == "succeeded" for j in jobs),
        "serving": health["model_version"],
        "rollout": rollout_figures(client),
    }
