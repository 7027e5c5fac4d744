"""``driftline bench memory``: server memory while a stream brings new ids, bounded or not.

A real ``driftline serve`` gets a first version trained on MovieLens, then ``ids`` events
each with a user and an item it has never seen (the worst case for per-id online state).
Its resident memory is read from ``/proc`` after every ``ids / 5`` events. The same run
is made twice: with the default bounds (``SERVING_MAX_USERS``, ``SERVING_MAX_ITEMS``)
and with both unbounded, the behaviour before the bounds existed.

Beside it, in-process, the online state one user and one item cost: ``2**17`` new users
(one rating each, of items the version knows) and then ``2**17`` new items (rated by
users the version knows) are folded into a ``ServingModel`` and the rated-items history
under ``tracemalloc``; the growth divided by the count is the bytes per user and per
item. ``2**17`` keys fill the row arrays exactly (they grow by doubling), so no spare
capacity is counted. The items' integer codes (``functions.ids.IdCodes``) are measured
the same way: the new items again, in batches of 500 as the learner hands them over,
with codes, into a second ``ServingModel``; the growth beyond the first is what the
codes and the two tables that keep rows by them there (the online rows and the
version's) cost per item. Other tables on the path keep one such array each.
"""

from __future__ import annotations

import random
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.datasets.registry import open_ratings
from benchmarks.launcher import ServerProcess
from functions.ids import IdCodes, Ids
from functions.mf import BiasedMF
from service.serving.history import RatedItems
from service.serving.model import ServingModel
from service.settings import Settings

#: New users, then new items, whose online state is measured: a power of two fills the
#: doubling row arrays exactly.
PER_KEY_SAMPLE = 2**17

_ENV = {
    "DRIFTLINE_RETRAIN_RUNTIME": "inprocess",
    "DRIFTLINE_BOOTSTRAP_EVENTS": "20000",
    "DRIFTLINE_REFRESH_EVENTS": "none",
    "DRIFTLINE_MIN_RELATIVE_DROP": "1000",  # no drift retrain: the figure is serving state
    "DRIFTLINE_REGISTRY_POLL_SECONDS": "1",
}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _bootstrap(client: httpx.Client, dataset: Path | None) -> None:
    stream = open_ratings(dataset, limit=20_000)[0]
    events = list(stream.events())
    for start in range(0, len(events), 5_000):
        client.post("/ingest", json={"events": events[start : start + 5_000]}).raise_for_status()
    deadline = time.monotonic() + 300
    while client.get("/models").json()["current"] is None:
        if time.monotonic() > deadline:
            raise TimeoutError("the bootstrap version was not served within 300 s")
        time.sleep(0.2)


def _run(ids: int, batch: int, dataset: Path | None, env: dict[str, str]) -> dict[str, Any]:
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="driftline-bench-memory-") as tmp:
        server = ServerProcess(Path(tmp) / "data", env={**_ENV, **env})
        with server, httpx.Client(base_url=server.url, timeout=120) as client:
            assert server.process is not None
            _bootstrap(client, dataset)
            rss = {0: _rss_mb(server.process.pid)}
            every = max(batch, ids // 5)
            for start in range(0, ids, batch):
                events = [
                    {"user_id": f"new-user-{i}", "item_id": f"new-item-{i}", "rating": rating}
                    for i in range(start, min(ids, start + batch))
                    for rating in [1 + rng.random() * 4]
                ]
                client.post("/ingest", json={"events": events}).raise_for_status()
                done = start + len(events)
                if done % every == 0 or done == ids:
                    rss[done] = _rss_mb(server.process.pid)
            health = client.get("/healthz").json()
    return {"rss_mb": rss, "events_seen": health["labelled_events_seen"]}


def _traced_growth(learn: Any, keys: int) -> int:
    """Bytes ``learn()`` left allocated, as ``tracemalloc`` counts them."""
    before = tracemalloc.take_snapshot()
    learn()
    after = tracemalloc.take_snapshot()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename"))


def online_state_bytes(dataset: Path | None = None, keys: int = PER_KEY_SAMPLE) -> dict[str, Any]:
    """Bytes of online state per new user and per new item, at the default settings."""
    settings = Settings()
    stream = open_ratings(dataset, limit=20_000)[0]
    model = BiasedMF(factors=settings.factors, seed=0)
    model.fit(stream.user_ids, stream.item_ids, stream.ratings, epochs=2)
    serving = ServingModel(model, "v", max_users=None, max_items=None)
    history = RatedItems(max_pairs=None)
    rng = np.random.default_rng(0)
    known_items = [model.item_ids[k] for k in rng.integers(0, model.n_items, keys)]
    known_users = [model.user_ids[k] for k in rng.integers(0, model.n_users, keys)]
    ratings = rng.uniform(0.5, 5.0, keys)
    new_users = [f"new-user-{k}" for k in range(keys)]
    new_items = [f"new-item-{k}" for k in range(keys)]
    serving.learn(known_users[:10], known_items[:10], ratings[:10])  # compiles the kernel
    tracemalloc.start()
    try:
        per_user = _traced_growth(lambda: serving.learn(new_users, known_items, ratings), keys)
        history_per_user = _traced_growth(lambda: history.add(new_users, known_items), keys)
        per_item = _traced_growth(lambda: serving.learn(known_users, new_items, ratings), keys)
        coded = ServingModel(model, "v", max_users=None, max_items=None)
        coded.learn(known_users[:10], known_items[:10], ratings[:10])
        codes = IdCodes()
        per_coded_item = _traced_growth(
            lambda: _learn_coded(coded, codes, known_users, new_items, ratings), keys
        )
    finally:
        tracemalloc.stop()
    return {
        "factors": settings.factors,
        "keys_measured": keys,
        "foldin_bytes_per_user": round(per_user / keys),
        "foldin_bytes_per_item": round(per_item / keys),
        "history_bytes_per_user": round(history_per_user / keys),
        "item_codes_bytes_per_item": round((per_coded_item - per_item) / keys),
    }


def _learn_coded(
    serving: ServingModel,
    codes: IdCodes,
    users: list[str],
    items: list[str],
    ratings: np.ndarray,
    batch: int = 500,
) -> None:
    """``serving.learn`` in batches, the items as the learner passes them: with codes."""
    for start in range(0, len(users), batch):
        part = slice(start, start + batch)
        coded = Ids.of(items[part], repeated=False, codes=codes)
        serving.learn(users[part], coded, ratings[part])


def run_memory(
    dataset: Path | None = None, limit: int | None = None, batch_size: int = 5_000
) -> dict[str, Any]:
    """Resident memory of a server taking ``limit`` (default 10⁶) new ids, and the
    online state's bytes per user and per item."""
    ids = limit or 1_000_000
    bounded = _run(ids, batch_size, dataset, {})
    unbounded = _run(
        ids,
        batch_size,
        dataset,
        {"DRIFTLINE_SERVING_MAX_USERS": "none", "DRIFTLINE_SERVING_MAX_ITEMS": "none"},
    )
    figures: dict[str, Any] = {"new_ids": ids, **online_state_bytes(dataset)}
    for name, run in (("bounded", bounded), ("unbounded", unbounded)):
        rss = run["rss_mb"]
        figures[f"{name}_rss_mb_before"] = round(rss[0], 1)
        figures[f"{name}_rss_mb_after"] = round(rss[ids], 1)
        figures[f"{name}_rss_mb_by_ids"] = {str(k): round(v, 1) for k, v in sorted(rss.items())}
    figures["bounded_growth_mb"] = round(rss_growth(bounded), 1)
    figures["unbounded_growth_mb"] = round(rss_growth(unbounded), 1)
    return figures


def rss_growth(run: dict[str, Any]) -> float:
    """Resident memory after the last new id minus before the first, in MB."""
    rss = run["rss_mb"]
    return rss[max(rss)] - rss[0]
