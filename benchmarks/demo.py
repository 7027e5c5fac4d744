"""``driftline demo``: MovieLens through a live service, then a summary.

The server runs as a real ``driftline serve`` process on loopback with a temporary data
directory; the ratings go through ``POST /ingest`` in timestamp order (or, with
``--kafka``, through an embedded Kafka-protocol broker the service consumes), while
river's ``BiasedMF`` learns the same stream in this process for comparison.

By default 30 % of the users invert their taste at 60 % of the stream (``--no-drift``
replays MovieLens as it is), so the loop the service is named for shows: the drift
alert, where it lies, the job it starts and what it costs, and the accuracy after it.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
from kafka import KafkaProducer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from benchmarks.baselines import RiverTrack
from benchmarks.broker import EmbeddedBroker
from benchmarks.datasets import MOVIELENS_SMALL, RatingStream, load_ratings, load_titles
from benchmarks.launcher import ServerProcess, free_port
from benchmarks.scenarios import plant
from drift.ranking import RankingSampler
from service.settings import Settings

#: Longest wait for a running job before the next batch: the service retrains off the
#: ingest path, but a replay hundreds of times faster than the real stream would
#: otherwise outrun every job and the demo would show versions that arrive too late.
PACE_TIMEOUT_S = 10.0


def replay(
    client: httpx.Client, stream: RatingStream, batch_size: int, river: RiverTrack
) -> np.ndarray:
    """Send ``stream`` in batches with a progress bar; river learns the same events.

    Returns river's predictions (made before it learnt each event).
    """
    predictions = []
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn()) as progress:
        task = progress.add_task("replaying ratings", total=len(stream))
        for start in range(0, len(stream), batch_size):
            events = stream.events(start, start + batch_size)
            response = client.post("/ingest", json={"events": events})
            response.raise_for_status()
            stop = start + len(events)
            predictions.append(
                river.process(
                    stream.user_ids[start:stop],
                    stream.item_ids[start:stop],
                    stream.ratings[start:stop],
                    stream.timestamps[start:stop],
                )
            )
            progress.update(task, advance=len(events))
            wait_for_jobs(client, timeout=PACE_TIMEOUT_S)
    return np.concatenate(predictions) if predictions else np.empty(0)


def replay_kafka(
    client: httpx.Client, bootstrap: str, stream: RatingStream, batch_size: int, river: RiverTrack
) -> np.ndarray:
    """Produce ``stream`` to the topic the service consumes; river learns it meanwhile.

    The bar counts events the service has made durable, not messages sent. Returns
    river's predictions.
    """
    predictions = []
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10)
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn()) as progress:
        task = progress.add_task("replaying ratings through Kafka", total=len(stream))
        for start in range(0, len(stream), batch_size):
            stop = min(start + batch_size, len(stream))
            for event in stream.events(start, stop):
                producer.send(
                    "events", key=event["user_id"].encode(), value=json.dumps(event).encode()
                )
            predictions.append(
                river.process(
                    stream.user_ids[start:stop],
                    stream.item_ids[start:stop],
                    stream.ratings[start:stop],
                    stream.timestamps[start:stop],
                )
            )
            progress.update(task, completed=client.get("/healthz").json()["events_stored"])
        producer.flush()
        producer.close()
        stored = 0
        while stored < len(stream):
            stored = client.get("/healthz").json()["events_stored"]
            progress.update(task, completed=stored)
            time.sleep(0.2)
    return np.concatenate(predictions) if predictions else np.empty(0)


def wait_for_jobs(client: httpx.Client, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/healthz").json().get("retrain_job_running") is None:
            return
        time.sleep(0.5)


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
    alerts = sorted(client.get("/drift/alerts").json()["alerts"], key=lambda a: a["events_seen"])
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
    rows = [b for b in beats if b.get(key) is not None]
    if not rows:
        return "n/a"
    events = np.array([b["events"] for b in rows], dtype=np.float64)
    values = np.array([b[key] for b in rows], dtype=np.float64)
    return f"{np.sqrt((values**2 * events).sum() / events.sum()):.4f}"


def _pooled_rate(beats: list[dict], key: str) -> str:
    rows = [b for b in beats if b.get(key) is not None and b.get("ranked_events")]
    if not rows:
        return "n/a"
    weights = np.array([b["ranked_events"] for b in rows], dtype=np.float64)
    rates = np.array([b[key] for b in rows], dtype=np.float64)
    return f"{(rates * weights).sum() / weights.sum():.3f}"


def summary_table(client: httpx.Client, events: int, river: RiverTrack) -> Table:
    health = client.get("/healthz").json()
    prequential = health["prequential"]
    jobs = client.get("/jobs").json()["jobs"]
    table = Table(title="Driftline on MovieLens (prequential: predict, then learn)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("events replayed", f"{events:,}")
    for label, track in (("Driftline", "driftline"), ("never-retrained model", "static")):
        rmse = prequential.get(track, {}).get("rmse")
        table.add_row(f"RMSE {label}", "n/a" if rmse is None else f"{rmse:.4f}")
    table.add_row("RMSE river BiasedMF (every event)", f"{river.rmse:.4f}")
    table.add_row("drift alerts", str(len(client.get("/drift/alerts").json()["alerts"])))
    succeeded = [j for j in jobs if j["status"] == "succeeded"]
    table.add_row("retraining jobs (succeeded)", f"{len(jobs)} ({len(succeeded)})")
    table.add_row("model versions", str(len(client.get("/models").json()["versions"])))
    table.add_row("serving model", str(health["model_version"]))
    return table


def top10_table(client: httpx.Client, user: str) -> Table:
    titles = load_titles()
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
) -> None:
    console = Console()
    stream = load_ratings(MOVIELENS_SMALL, limit=limit)
    onset = None
    if drift:
        planted = plant("sudden", stream, at=0.6)
        stream, onset = planted.stream, planted.onset
    # river ranks the events the service ranks: the same fixed sample of liked events.
    settings = Settings()
    river = RiverTrack(ranking=RankingSampler(settings.ranking_sample, settings.ranking_min_rating))
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
        if kafka:
            river_predictions = replay_kafka(client, broker.bootstrap, stream, batch_size, river)
        else:
            river_predictions = replay(client, stream, batch_size, river)
        wait_for_jobs(client)
        console.print(summary_table(client, len(stream), river))
        if onset is not None:
            console.print(drift_table(client, onset, stream, river_predictions, river))
        chosen = user or Counter(stream.user_ids).most_common(1)[0][0]
        console.print(top10_table(client, chosen))
