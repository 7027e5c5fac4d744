"""A real ``driftline serve`` under concurrent HTTP clients across hot swaps.

Writers post batches full of new users and items, readers ask for recommendations, and
retraining jobs publish versions that the server swaps in meanwhile. Every answer must be
a 2xx, and every personalised answer's items must belong to the version it names: with
every item scored, and with an item index searched off the event loop.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.launcher import ServerProcess
from functions.artifacts import model_from_bytes
from functions.objectstore import open_object_store
from tests.support.synthetic import stationary_stream

pytestmark = pytest.mark.slow

SWAPS = 3


def _items_of(data_dir: Path, client: httpx.Client) -> dict[str, set[str]]:
    """Each published version's item ids, read from its artifact."""
    store = open_object_store(f"file://{(data_dir / 'objects').resolve()}")
    items = {}
    for key in store.list("models/"):
        model = model_from_bytes(store.get(key))
        version = key.split("/")[1]
        items[version] = set(model.item_ids)
    return items


def _in_shadow(models: dict) -> bool:
    """Whether a version runs in the rollout guard's shadow (``GET /models``)."""
    return any((v.get("guard") or {}).get("state") == "shadow" for v in models["versions"])


@pytest.mark.parametrize("index", ["exact", "ann"])
def test_concurrent_clients_across_hot_swaps_see_no_errors(tmp_path: Path, index: str) -> None:
    data_dir = tmp_path / "data"
    env = {
        "DRIFTLINE_SERVING_INDEX": index,
        "DRIFTLINE_RETRAIN_RUNTIME": "inprocess",
        "DRIFTLINE_BOOTSTRAP_EVENTS": "500",
        "DRIFTLINE_REFRESH_EVENTS": "none",
        "DRIFTLINE_MAX_EPOCHS": "3",
        "DRIFTLINE_REGISTRY_POLL_SECONDS": "1",
        "DRIFTLINE_RETENTION_VERSIONS": "50",
    }
    stream = stationary_stream(n_users=100, n_items=80, n_events=1000, seed=2)
    stop = threading.Event()
    counts = {"requests": 0, "errors": 0, "model": 0}
    problems: list[str] = []
    answers: list[tuple[str, list[str]]] = []
    lock = threading.Lock()

    def count(response: httpx.Response) -> None:
        with lock:
            counts["requests"] += 1
            if response.status_code >= 300:
                counts["errors"] += 1
                problems.append(f"{response.request.url} {response.status_code} {response.text}")

    def writer(server: ServerProcess, number: int) -> None:
        rng = random.Random(number)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            batch = 0
            while not stop.is_set():
                events = [
                    {
                        "user_id": rng.choice([f"w{number}-{batch}-{j % 40}", f"u{j % 100}"]),
                        "item_id": f"n{number}-{batch}-{j % 30}",
                        "rating": float(rng.randint(1, 5)),
                    }
                    for j in range(200)
                ]
                count(client.post("/ingest", json={"events": events}))
                batch += 1

    def reader(server: ServerProcess, number: int) -> None:
        rng = random.Random(100 + number)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            while not stop.is_set():
                user = rng.choice([f"u{rng.randint(0, 99)}", f"w0-{rng.randint(0, 20)}-3"])
                response = client.get("/recommend", params={"user_id": user, "k": 10})
                count(response)
                if response.status_code == 200 and response.json()["source"] == "model":
                    body = response.json()
                    with lock:
                        counts["model"] += 1
                        answers.append(
                            (body["model_version"], [i["item_id"] for i in body["items"]])
                        )

    with ServerProcess(data_dir, env=env) as server, httpx.Client(base_url=server.url) as client:
        count(client.post("/ingest", json={"events": [dict(e) for e in stream]}))
        threads = [threading.Thread(target=writer, args=(server, n)) for n in range(2)]
        threads += [threading.Thread(target=reader, args=(server, n)) for n in range(3)]
        for thread in threads:
            thread.start()
        swaps_seen: set[str] = set()
        started = time.monotonic()
        try:
            while time.monotonic() - started < 240 and (
                len(swaps_seen) < SWAPS + 1 or time.monotonic() - started < 15
            ):
                models = client.get("/models").json()
                if models["current"]:
                    swaps_seen.add(models["current"])
                # As a scheduled job does, wait while a version is in shadow: a newer
                # version would supersede it before the guard could promote it.
                if not _in_shadow(models) and (
                    client.get("/healthz").json()["retrain_job_running"] is None
                ):
                    client.post("/retrain")
                time.sleep(0.5)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        items_of = _items_of(data_dir, client)

    print(f"{counts['requests']} requests, {counts['errors']} errors, {len(swaps_seen)} versions")
    assert problems == []
    assert len(swaps_seen) >= SWAPS + 1  # the bootstrap version and three swaps after it
    assert counts["model"] > 50
    foreign = [(v, i) for v, items in answers for i in items if i not in items_of[v]]
    assert foreign == []
