"""A synthetic catalogue of a million items: ``/recommend`` with exact scoring and with
the ANN index, each on a real ``driftline serve``, and recall@10 of one against the other.

The version is made, not trained: item and user factors are drawn around a thousand
"taste" centres with a decaying spectrum (later factors carry less variance), as trained
factor matrices do, so the catalogue has the cluster structure an inverted-file index
relies on and real catalogues show; it is an assumption of this benchmark, stated here,
not a measured property of any real catalogue. Synthetic events (users rating items
drawn by a Zipf-like popularity) are stored before the servers start, so the fold-in
gives online item biases (the index's extra coordinate) and users rated items to leave
out. Both servers serve the same version and events; only ``SERVING_INDEX`` differs. Each
is measured at 32 connections (throughput, and latency with queueing) and at one
connection (``single``: a request's own latency). Last, in-process, the time of a
request on the ANN view once as many events again have moved item biases since the index
was built (``moved_items_cost``).
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.launcher import ServerProcess
from benchmarks.load import drive
from functions.mf import BiasedMF
from functions.objectstore import open_object_store
from service.serving.index import IndexOptions, build_index
from service.serving.model import ServingModel
from service.serving.registry import ModelRegistry
from service.settings import Settings
from service.store import Database
from service.store.events import NewEvent, store_events

CENTRES = 1_000
#: Users whose top-10 is fetched from both servers for recall@10.
RECALL_USERS = 200
#: Seconds of one connection at a time: a request's own latency, without queueing.
SINGLE_SECONDS = 5.0
_BUILT = re.compile(r"ann index of (\d+) items for \S+ built in ([0-9.]+) s")


def synthetic_version(items: int, users: int, factors: int, seed: int = 0) -> BiasedMF:
    """A ``BiasedMF`` of ``items`` and ``users`` clustered factor vectors (see above)."""
    rng = np.random.default_rng(seed)
    spectrum = 1.0 / np.sqrt(np.arange(1, factors + 1))
    centres = rng.normal(0.0, 0.5, (CENTRES, factors)) * spectrum

    def draw(count: int, spread: float) -> np.ndarray:
        around = centres[rng.integers(0, CENTRES, count)]
        return around + rng.normal(0.0, spread, (count, factors)) * spectrum

    arrays = BiasedMF(factors=factors, seed=seed).to_arrays()
    arrays.update(
        global_mean=np.array(3.5),
        user_ids=np.array([f"u{i}" for i in range(users)], dtype=str),
        item_ids=np.array([f"i{i}" for i in range(items)], dtype=str),
        user_bias=rng.normal(0.0, 0.3, users),
        item_bias=rng.normal(0.0, 0.3, items),
        user_factors=draw(users, 0.3),
        item_factors=draw(items, 0.15),
    )
    return BiasedMF.from_arrays(arrays)


def _synthetic_events(model: BiasedMF, count: int, seed: int = 0) -> list[NewEvent]:
    """Users rating items drawn by a Zipf-like popularity, rated by the model plus noise."""
    rng = np.random.default_rng(seed + 1)
    users = rng.integers(0, model.n_users, count)
    items = np.minimum(rng.zipf(1.3, count) - 1, model.n_items - 1)
    items = rng.permutation(model.n_items)[items]  # popular items anywhere in the rows
    user_ids = [model.user_ids[u] for u in users]
    item_ids = [model.item_ids[i] for i in items]
    ratings = model.predict(user_ids, item_ids) + rng.normal(0.0, 0.5, count)
    ratings = np.clip(np.round(ratings * 2) / 2, 0.5, 5.0)
    now = time.time()
    return [
        NewEvent(u, i, float(r), now - count + n, f"syn-{n}")
        for n, (u, i, r) in enumerate(zip(user_ids, item_ids, ratings, strict=True))
    ]


def _publish(data_dir: Path, items: int, users: int, factors: int, events: int) -> None:
    """A data directory holding the synthetic version and events, as ``serve`` reads it."""
    settings = Settings(data_dir=data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.resolved_database_url)
    model = synthetic_version(items, users, factors)
    with db.begin() as conn:
        store_events(conn, _synthetic_events(model, events))
    registry = ModelRegistry(db, open_object_store(settings.resolved_object_store_url))
    registry.publish(model, last_event_id=0, job_id=None, rmse=None)
    db.dispose()


def _serve(
    data_dir: Path, index: str, users: list[str], seconds: float
) -> tuple[dict[str, float], list[list[str]], float | None]:
    """One server with ``SERVING_INDEX=index``: its load figures, the top-10 of the
    recall sample, and the index's build time from its log."""
    env = {
        "DRIFTLINE_SERVING_INDEX": index,
        "DRIFTLINE_RETRAIN_ENABLED": "false",
        # Every request scored: repeated users would otherwise be answered from the
        # view's kept answers, and the figures would not be the index's.
        "DRIFTLINE_SERVING_CACHED_ANSWERS": "0",
    }
    log_path = data_dir / f"server-{index}.log"
    server = ServerProcess(data_dir, env=env, log_path=log_path)
    try:
        server.start(timeout=1800)  # an ANN index is built before the server answers
        drive(server.url, users, seconds=2)  # warm-up
        loaded = drive(server.url, users, seconds=seconds)
        alone = drive(server.url, users, seconds=SINGLE_SECONDS, connections=1, threads=1)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            tops = [
                [
                    entry["item_id"]
                    for entry in client.get(f"/recommend?user_id={user}&k=10").json()["items"]
                ]
                for user in users[:RECALL_USERS]
            ]
    finally:
        server.stop()
    built = _BUILT.search(log_path.read_text())
    figures = {
        "rps": loaded.rps,
        "p50_ms": loaded.p50_ms,
        "p99_ms": loaded.p99_ms,
        "non_2xx": float(loaded.non_2xx + loaded.socket_errors + alone.non_2xx),
        "single_p50_ms": alone.p50_ms,
        "single_p99_ms": alone.p99_ms,
    }
    return figures, tops, float(built.group(2)) if built else None


def moved_items_cost(
    items: int, users: int, factors: int, events: int, requests: int = 500
) -> dict[str, float]:
    """In-process: a request's time on the ANN view once ``events`` events have moved
    item biases since the index was built (as between two swaps under ingestion).

    Every moved item is a candidate beside the index's; this measures what they cost
    a request, with the service's ranking shrinkage and forgetting.
    """
    settings = Settings()
    model = synthetic_version(items, users, factors)
    serving = ServingModel(
        model,
        "v1",
        forgetting=settings.fold_in_forgetting,
        ranking_item_bias_regularization=settings.ranking_item_bias_regularization,
    )
    serving.attach_index(
        build_index(model.item_factors, serving.view.item_bias, IndexOptions("ann"))
    )
    moved = _synthetic_events(model, events, seed=7)
    serving.learn(
        [e.user_id for e in moved],
        [e.item_id for e in moved],
        np.array([e.rating for e in moved]),
    )
    view = serving.view
    asked = [model.user_ids[u] for u in np.random.default_rng(3).integers(0, users, requests)]
    began = time.perf_counter()
    for user in asked:
        view.recommend(user, 10)
    return {
        "catalogue_ann_events_since_index": float(events),
        "catalogue_ann_moved_items": float(len(view.risen) + len(view.fallen)),
        "catalogue_ann_after_events_ms": 1000 * (time.perf_counter() - began) / requests,
    }


def run_catalogue(
    items: int = 1_000_000,
    *,
    seconds: float = 15.0,
    users: int = 20_000,
    factors: int = 64,
    events: int = 30_000,
) -> dict[str, Any]:
    """Exact against ANN on ``items`` synthetic items; figures prefixed ``catalogue_``."""
    rng = np.random.default_rng(2)
    sample = [f"u{i}" for i in rng.permutation(users)]
    with tempfile.TemporaryDirectory(prefix="driftline-bench-catalogue-") as tmp:
        data_dir = Path(tmp) / "data"
        _publish(data_dir, items, users, factors, events)
        exact, exact_tops, _ = _serve(data_dir, "exact", sample, seconds)
        ann, ann_tops, build_s = _serve(data_dir, "ann", sample, seconds)
    overlap = [
        len(set(a) & set(e)) / max(1, len(e)) for a, e in zip(ann_tops, exact_tops, strict=True)
    ]
    return {
        "catalogue_items": items,
        "catalogue_factors": factors,
        "catalogue_exact_rps": exact["rps"],
        "catalogue_exact_p50_ms": exact["p50_ms"],
        "catalogue_exact_p99_ms": exact["p99_ms"],
        "catalogue_exact_non_2xx": int(exact["non_2xx"]),
        "catalogue_exact_single_p50_ms": exact["single_p50_ms"],
        "catalogue_exact_single_p99_ms": exact["single_p99_ms"],
        "catalogue_ann_rps": ann["rps"],
        "catalogue_ann_p50_ms": ann["p50_ms"],
        "catalogue_ann_p99_ms": ann["p99_ms"],
        "catalogue_ann_non_2xx": int(ann["non_2xx"]),
        "catalogue_ann_single_p50_ms": ann["single_p50_ms"],
        "catalogue_ann_single_p99_ms": ann["single_p99_ms"],
        "catalogue_ann_build_s": build_s,
        "catalogue_recall_at_10": float(np.mean(overlap)),
        **moved_items_cost(items, users, factors, events),
    }
