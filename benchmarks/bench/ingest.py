"""``driftline bench ingest``: how fast events become durable, from Kafka and over HTTP.

* Kafka: a real embedded broker holds ``events`` messages; the service's consumer reads
  them into the store through the full pipeline (validation, the durable write with its
  offsets, prequential evaluation). ``kafka_events_per_s`` is messages / seconds from the
  consumer's start until the last one is durable, with one consumer;
  ``kafka_2_replicas_events_per_s`` the same with two ``driftline consume`` processes
  in one consumer group splitting the partitions (one per core), timed from the moment
  the group has shared out the partitions of an empty topic, which is then filled while
  they consume. Beside them,
  in the same run: a bare loop of the service's client (aiokafka) that only reads the
  same messages (the client's ceiling).
* HTTP: a real ``driftline serve`` process; ``clients`` threads post batches of 500 at
  once, their bodies encoded before the clock starts (the client's JSON encoding is not
  the service's work). ``http_events_per_s`` is events / wall seconds, ``http_p99_ms`` the 99th
  percentile request latency. Beside it: the same batches written straight to the store
  in-process (the storage ceiling).

* river: ``river_learn_events_per_s`` is river's ``BiasedMF`` predicting then learning
  the same events, in this process, in the same run: the yardstick a learning path is
  held to. ``kafka_ratio_to_river`` and ``http_ratio_to_river`` divide the Kafka (one
  consumer) and HTTP figures by it: events that arrive, become durable and are learnt,
  per second, against events river only learns.

Retraining is switched off so the figures are about ingestion alone.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from kafka import KafkaProducer

from benchmarks.baselines import RiverTrack
from benchmarks.broker import EmbeddedBroker, create_topic
from benchmarks.datasets import RatingStream
from benchmarks.datasets.registry import open_ratings
from benchmarks.launcher import ServerProcess, free_port
from service.ingest.kafka import EventConsumer
from service.settings import Settings
from service.store import Database
from service.store.events import NewEvent, count_events, store_events
from service.wiring import build_driftline

HTTP_BATCH = 500


def _fill_topic(bootstrap: str, stream: RatingStream, topic: str = "events") -> None:
    import json

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=256 * 1024
    )
    for event in stream.events():
        producer.send(topic, key=event["user_id"].encode(), value=json.dumps(event).encode())
    producer.flush(timeout=120)
    producer.close()


def _read_only(bootstrap: str, total: int) -> float:
    """Seconds the service's client, aiokafka, needs to read ``total`` messages in polls
    of the consumer's size, doing nothing with them: the client's ceiling."""
    return asyncio.run(_read_only_async(bootstrap, total))


async def _read_only_async(bootstrap: str, total: int) -> float:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=16 * 1024 * 1024,
    )
    await consumer.start()
    try:
        parts = [TopicPartition("events", p) for p in consumer.partitions_for_topic("events")]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        started, seen = time.perf_counter(), 0
        while seen < total:
            polled = await consumer.getmany(timeout_ms=1000, max_records=5000)
            seen += sum(len(records) for records in polled.values())
        return time.perf_counter() - started
    finally:
        await consumer.stop()


def _stored(db: Database) -> int:
    with db.connect() as conn:
        return count_events(conn)


def _group_settled(logs: list[Path], partitions: int) -> bool:
    """Whether each replica's latest assignment (its log's last "now owns" line) is
    non-empty and together they cover the topic's partitions once."""
    owned: list[str] = []
    for log in logs:
        lines = [
            line
            for line in (log.read_text() if log.exists() else "").splitlines()
            if " now owns " in line
        ]
        if not lines or lines[-1].rstrip().endswith("[]"):
            return False
        shown = lines[-1].split("partitions [", 1)[1].split("]", 1)[0]
        owned += [p.strip() for p in shown.split(",")]
    return sorted(owned) == sorted(str(p) for p in range(partitions))


def _kafka_replicas(bootstrap: str, stream: RatingStream, workdir: Path, replicas: int) -> float:
    """Events/s of ``replicas`` ``driftline consume`` processes sharing one store.

    The replicas join one consumer group on an empty topic of their own; the clock
    starts once the group has settled (every replica owns partitions, all of them
    shared out), and only then is the topic filled, so process start-up and the
    rebalances are not part of the figure and every event is timed.
    """
    topic, total = "events-replicas", len(stream)
    create_topic(bootstrap, topic, partitions=4)
    data_dir = workdir / f"replicas-{replicas}"
    data_dir.mkdir(parents=True)
    env = {**os.environ, "DRIFTLINE_RETRAIN_ENABLED": "false"}
    logs = [data_dir / f"consumer-{i}.log" for i in range(replicas)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "service", "consume", "--kafka-bootstrap", bootstrap]
            + ["--kafka-topic", topic, "--kafka-group", f"bench-{replicas}"]
            + ["--data-dir", str(data_dir)],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        for i, log in enumerate(logs)
    ]
    try:
        while not _group_settled(logs, partitions=4):
            if any(p.poll() is not None for p in processes):
                raise RuntimeError(f"a consumer replica exited; see {data_dir}")
            time.sleep(0.01)
        db = Database(f"sqlite:///{data_dir / 'driftline.db'}")
        started = time.perf_counter()
        _fill_topic(bootstrap, stream, topic)
        while _stored(db) < total:
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
        db.dispose()
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
    return total / elapsed


def _kafka(stream: RatingStream, workdir: Path) -> dict[str, float | None]:
    with EmbeddedBroker(port=free_port(), partitions=4) as broker:
        _fill_topic(broker.bootstrap, stream)
        bare = _read_only(broker.bootstrap, len(stream))
        two = _kafka_replicas(broker.bootstrap, stream, workdir, replicas=2)
        settings = Settings(data_dir=workdir / "kafka", retrain_enabled=False)
        pipeline = build_driftline(settings, background_retrain=False)
        pipeline.kernels_ready.wait()  # loaded at start, as a server does
        consumer = EventConsumer(pipeline, broker.bootstrap, "events")
        thread = threading.Thread(target=consumer.run, daemon=True)
        started = time.perf_counter()
        thread.start()
        # The clock starts once the group gave the consumer its partitions: joining
        # (the broker's first rebalance) is a start-up cost, reported on its own.
        while not consumer.state.partitions and consumer.state.consumed == 0:
            time.sleep(0.002)
        joined = time.perf_counter()
        while consumer.state.consumed < len(stream):
            time.sleep(0.02)
        elapsed = time.perf_counter() - joined
        consumer.stop()
        thread.join(timeout=30)
        with pipeline.db.connect() as conn:
            stored = count_events(conn)
        pipeline.db.dispose()
    if stored != len(stream):
        raise RuntimeError(f"kafka run stored {stored} of {len(stream)} events")
    return {
        "kafka_events_per_s": len(stream) / elapsed,
        "kafka_join_s": joined - started,
        "kafka_2_replicas_events_per_s": two,
        "kafka_read_only_events_per_s": len(stream) / bare,
    }


def _http(stream: RatingStream, workdir: Path, clients: int) -> dict[str, float]:
    batches = [
        stream.events(start, start + HTTP_BATCH) for start in range(0, len(stream), HTTP_BATCH)
    ]
    # Bodies are encoded before the clock starts: a client's JSON encoding is not the
    # service's work, and on a small machine it would take the server's cores.
    bodies = [orjson.dumps({"events": batch}) for batch in batches]
    headers = {"content-type": "application/json"}
    env = {"DRIFTLINE_RETRAIN_ENABLED": "false"}
    latencies: list[float] = []
    with (
        ServerProcess(workdir / "http", env=env) as server,
        httpx.Client(base_url=server.url, timeout=120) as http,
    ):

        def post(body: bytes) -> None:
            began = time.perf_counter()
            http.post("/ingest", content=body, headers=headers).raise_for_status()
            latencies.append(time.perf_counter() - began)

        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(post, bodies))
        elapsed = time.perf_counter() - started
        stored = http.get("/healthz").json()["events_stored"]
    if stored != len(stream):
        raise RuntimeError(f"http run stored {stored} of {len(stream)} events")
    return {
        "http_events_per_s": len(stream) / elapsed,
        "http_p50_ms": float(np.percentile(latencies, 50) * 1000),
        "http_p99_ms": float(np.percentile(latencies, 99) * 1000),
        "store_only_events_per_s": _store_only(batches, workdir),
    }


def _store_only(batches: list[list[dict]], workdir: Path) -> float:
    """Events/s of the same batches written straight to a fresh store, no HTTP, no model."""
    db = Database(f"sqlite:///{workdir / 'store-only.db'}")
    parsed = [[NewEvent(**event) for event in batch] for batch in batches]
    started = time.perf_counter()
    for batch in parsed:
        with db.begin() as conn:
            store_events(conn, batch)
    elapsed = time.perf_counter() - started
    db.dispose()
    return sum(len(b) for b in parsed) / elapsed


def _river(stream: RatingStream, batch_size: int) -> float:
    """Events/s of river's ``BiasedMF`` predicting then learning ``stream``, in batches."""
    river = RiverTrack()
    for start in range(0, len(stream), batch_size):
        stop = min(len(stream), start + batch_size)
        ratings = stream.ratings[start:stop].tolist()
        river.process(stream.user_ids[start:stop], stream.item_ids[start:stop], ratings)
    return river.count / river.seconds


def run_ingest(
    dataset: Path | None = None,
    limit: int | None = None,
    batch_size: int = HTTP_BATCH,
    clients: int = 4,
) -> dict[str, Any]:
    stream = open_ratings(dataset, limit=limit)[0]
    with tempfile.TemporaryDirectory(prefix="driftline-bench-") as tmp:
        workdir = Path(tmp)
        figures: dict[str, Any] = {"events": len(stream), "http_clients": clients}
        figures.update(_kafka(stream, workdir))
        river = _river(stream, batch_size)
        figures.update(_http(stream, workdir, clients))
    figures["http_batch"] = HTTP_BATCH
    figures["river_learn_events_per_s"] = river
    figures["kafka_ratio_to_river"] = figures["kafka_events_per_s"] / river
    figures["http_ratio_to_river"] = figures["http_events_per_s"] / river
    return figures
