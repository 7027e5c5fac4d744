"""``driftline demo``: MovieLens through a live service, then a summary.

The server runs as a real ``driftline serve`` process on loopback with a temporary data
directory; the ratings go through ``POST /ingest`` in timestamp order (or, with
``--kafka``, through an embedded Kafka-protocol broker the service consumes), while
river's ``BiasedMF`` learns the same stream in this process for comparison.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from kafka import KafkaProducer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from benchmarks.baselines import RiverTrack
from benchmarks.broker import EmbeddedBroker
from benchmarks.datasets import MOVIELENS_SMALL, RatingStream, load_ratings, load_titles
from benchmarks.launcher import ServerProcess, free_port


def replay(client: httpx.Client, stream: RatingStream, batch_size: int, river: RiverTrack) -> None:
    """Send ``stream`` in batches with a progress bar; river learns the same events."""
    columns = (*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn()) as progress:
        task = progress.add_task("replaying ratings", total=len(stream))
        for start in range(0, len(stream), batch_size):
            events = stream.events(start, start + batch_size)
            response = client.post("/ingest", json={"events": events})
            response.raise_for_status()
            stop = start + len(events)
            river.process(
                stream.user_ids[start:stop], stream.item_ids[start:stop], stream.ratings[start:stop]
            )
            progress.update(task, advance=len(events))


def replay_kafka(
    client: httpx.Client, bootstrap: str, stream: RatingStream, batch_size: int, river: RiverTrack
) -> None:
    """Produce ``stream`` to the topic the service consumes; river learns it meanwhile.

    The bar counts events the service has made durable, not messages sent.
    """
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
            river.process(
                stream.user_ids[start:stop], stream.item_ids[start:stop], stream.ratings[start:stop]
            )
            progress.update(task, completed=client.get("/healthz").json()["events_stored"])
        producer.flush()
        producer.close()
        stored = 0
        while stored < len(stream):
            stored = client.get("/healthz").json()["events_stored"]
            progress.update(task, completed=stored)
            time.sleep(0.2)


def wait_for_jobs(client: httpx.Client, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/healthz").json().get("retrain_job_running") is None:
            return
        time.sleep(0.5)


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
    limit: int | None = None, batch_size: int = 500, user: str | None = None, kafka: bool = False
) -> None:
    console = Console()
    stream = load_ratings(MOVIELENS_SMALL, limit=limit)
    river = RiverTrack()
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
            replay_kafka(client, broker.bootstrap, stream, batch_size, river)
        else:
            replay(client, stream, batch_size, river)
        wait_for_jobs(client)
        console.print(summary_table(client, len(stream), river))
        chosen = user or Counter(stream.user_ids).most_common(1)[0][0]
        console.print(top10_table(client, chosen))
