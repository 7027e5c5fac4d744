"""``driftline bench serve``: ``/recommend`` against a naive endpoint, same run, same machine.

1. **Side by side.** A model is trained on the first ``TRAIN_SHARE`` of MovieLens
   (ml-latest-small, timestamp order) and served by a real ``driftline serve`` with an
   API key. Beside it, the naive baseline (``benchmarks/naive_serving.py``: FastAPI,
   numpy scoring of the same factors, rated items excluded from a Python set, default
   JSON) serves the same version's factors and the same rated items. wrk drives each in
   turn with the same closed loop (``CONNECTIONS`` connections, random users) for
   ``seconds``, twice, alternating, so a burst of load from elsewhere hits both alike.
   The naive server runs as ``pip install fastapi uvicorn`` gives it (asyncio, h11);
   ``naive_fast_stack_rps`` is the same code on uvloop and httptools, which says how much
   of the ratio the server stack accounts for and how much Driftline's path does.
   Then Driftline again without each piece of its hot path that a setting can switch
   off (``ABLATIONS``: the kept answers, uvloop and httptools), one server each.
2. **Under ingestion.** The rest of MovieLens is posted to the same Driftline server at
   ``INGEST_RATE`` events/s while wrk runs, and a retrain is forced early in the window,
   which lasts until its version has been hot-swapped in (``swaps_in_window``). Then the
   same again with the stream role in a process of its own (``split_*``: ``serve
   --stream-process``, the serving process only folds the log in).
3. **A million items** (``benchmarks/bench/catalogue.py``): exact scoring against the
   ANN index on a synthetic catalogue, over HTTP, with recall@10.

Figures are ratios and percentiles from one run; absolute numbers on a shared 2-core
machine are noise (BENCHMARKS.md).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.bench.catalogue import run_catalogue
from benchmarks.bench.stages import steady_pipeline
from benchmarks.datasets import RatingStream
from benchmarks.datasets.registry import open_ratings
from benchmarks.launcher import ServerProcess, free_port
from benchmarks.load import LoadResult, drive, require_wrk
from benchmarks.naive_serving import save_arrays
from service.auth.keys import create_key
from service.store.events import recent_pairs

CONNECTIONS = 32
TRAIN_SHARE = 0.6
INGEST_RATE = 2_000.0
INGEST_CLIENTS = 4
ROUNDS = 2
#: The ingestion window is measured in slices of this many seconds, and lasts until a
#: hot swap has happened in it (at least ``seconds``, at most ``MAX_WINDOW_SECONDS``);
#: the retrain is forced after the first slice.
SLICE_SECONDS = 5.0
MAX_WINDOW_SECONDS = 120.0
#: The serving process beside a stream process of its own (``driftline serve
#: --stream-process``): learning, the drift monitor and jobs off its interpreter.
SPLIT_ENV = {"DRIFTLINE_STREAM_PROCESS": "true"}


@dataclass(frozen=True)
class Prepared:
    """A data directory with a served version, its keys, and what the baseline needs."""

    data_dir: Path
    arrays: Path
    users: list[str]
    read_key: str
    admin_key: str
    rest: list[dict]


def _prepare(stream: RatingStream, workdir: Path) -> Prepared:
    """Ingest the training share in-process, train a version inline, write the keys
    and the baseline's arrays."""
    data_dir = workdir / "driftline"
    split = int(len(stream) * TRAIN_SHARE)
    pipeline = steady_pipeline(stream, data_dir, split, 5_000, prefix="ml")
    model = pipeline.registry.newest_loadable()
    if model is None:
        raise RuntimeError("the training job published no version")
    with pipeline.db.connect() as conn:
        owners, items = recent_pairs(conn, None)
    rated: dict[str, list[str]] = {}
    for user, item in zip(owners, items, strict=True):
        rated.setdefault(user, []).append(item)
    arrays = workdir / "naive.npz"
    mf = model.model
    save_arrays(
        arrays,
        user_ids=mf.user_ids,
        item_ids=mf.item_ids,
        user_factors=mf.user_factors,
        item_factors=mf.item_factors,
        item_bias=mf.item_bias,
        global_mean=mf.global_mean,
        rated=rated,
    )
    read = create_key(pipeline.db, "bench-read", ["read"]).token
    admin = create_key(pipeline.db, "bench-admin", ["admin", "ingest", "read"]).token
    pipeline.db.dispose()
    rest = list(stream.events(split, len(stream)))
    return Prepared(data_dir, arrays, sorted(rated), read, admin, rest)


class NaiveServer:
    """The baseline as a child process (``python -m benchmarks.naive_serving``)."""

    def __init__(self, arrays: Path, loop: str, http: str, log_path: Path) -> None:
        self.port = free_port()
        self.command = [sys.executable, "-m", "benchmarks.naive_serving", "--arrays", str(arrays)]
        self.command += ["--port", str(self.port), "--loop", loop, "--http", http]
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> NaiveServer:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the naive server exited; see {self.log_path}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.2)
        raise TimeoutError(f"the naive server did not start; see {self.log_path}")

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)


def _merge(results: list[LoadResult]) -> dict[str, float]:
    """Rounds of one server together: requests over seconds, the median p50 and the
    worst p99 of the rounds."""
    seconds = sum(r.seconds for r in results)
    return {
        "rps": sum(r.requests for r in results) / seconds,
        "p50_ms": float(np.median([r.p50_ms for r in results])),
        "p99_ms": max(r.p99_ms for r in results),
        "non_2xx": sum(r.non_2xx + r.socket_errors for r in results),
    }


def _side_by_side(prepared: Prepared, server: ServerProcess, seconds: float) -> dict[str, Any]:
    workdir = prepared.arrays.parent
    plain = NaiveServer(prepared.arrays, "asyncio", "h11", workdir / "naive.log")
    fast = NaiveServer(prepared.arrays, "uvloop", "httptools", workdir / "naive-fast.log")
    users, key = prepared.users, prepared.read_key
    ours: list[LoadResult] = []
    theirs: list[LoadResult] = []
    with plain, fast:
        for url, api_key in ((server.url, key), (plain.url, None), (fast.url, None)):
            drive(url, users, seconds=2, api_key=api_key)  # warm-up: imports, caches
        for round_ in range(ROUNDS):
            ours.append(drive(server.url, users, seconds=seconds, api_key=key, seed=round_))
            theirs.append(drive(plain.url, users, seconds=seconds, seed=round_))
        tuned = drive(fast.url, users, seconds=seconds)
    driftline, naive = _merge(ours), _merge(theirs)
    return {
        "driftline_rps": driftline["rps"],
        "driftline_p50_ms": driftline["p50_ms"],
        "driftline_p99_ms": driftline["p99_ms"],
        "driftline_non_2xx": driftline["non_2xx"],
        "naive_rps": naive["rps"],
        "naive_p50_ms": naive["p50_ms"],
        "naive_p99_ms": naive["p99_ms"],
        "naive_non_2xx": naive["non_2xx"],
        "ratio": driftline["rps"] / naive["rps"],
        "naive_fast_stack_rps": tuned.rps,
        "naive_fast_stack_p99_ms": tuned.p99_ms,
    }


#: What each piece of the hot path is worth: Driftline served without it.
ABLATIONS = {
    "driftline_no_answer_cache": {"DRIFTLINE_SERVING_CACHED_ANSWERS": "0"},
    "driftline_asyncio_h11": {"DRIFTLINE_SERVER_LOOP": "asyncio", "DRIFTLINE_SERVER_HTTP": "h11"},
}


def _without(prepared: Prepared, seconds: float) -> dict[str, float]:
    """One round of Driftline per entry of ``ABLATIONS``, each its own server."""
    figures = {}
    for name, env in ABLATIONS.items():
        with ServerProcess(prepared.data_dir, env=env) as server:
            drive(server.url, prepared.users, seconds=2, api_key=prepared.read_key)
            result = drive(server.url, prepared.users, seconds=seconds, api_key=prepared.read_key)
        figures[f"{name}_rps"] = result.rps
        figures[f"{name}_p99_ms"] = result.p99_ms
    return figures


class Ingestor(threading.Thread):
    """Posts events at a steady rate in batches, open loop: each batch leaves at its due
    time on one of ``INGEST_CLIENTS`` connections, whether or not earlier ones have been
    answered, as independent producers would; stops when told or out of events."""

    def __init__(self, url: str, api_key: str, events: list[dict], rate: float, batch: int) -> None:
        super().__init__(name="bench-ingest", daemon=True)
        self.url, self.events, self.rate, self.batch = url, events, rate, batch
        self.headers = {"Authorization": f"Bearer {api_key}"}
        self.stop_event = threading.Event()
        self.accepted = 0
        self.failed = 0
        self.latencies: list[float] = []
        self.seconds = 0.0
        self._lock = threading.Lock()

    def run(self) -> None:
        began = time.perf_counter()
        with (
            httpx.Client(base_url=self.url, headers=self.headers, timeout=60) as client,
            ThreadPoolExecutor(INGEST_CLIENTS) as pool,
        ):
            for start in range(0, len(self.events), self.batch):
                if self.stop_event.is_set():
                    break
                due = began + start / self.rate
                time.sleep(max(0.0, due - time.perf_counter()))
                pool.submit(self._post, client, self.events[start : start + self.batch])
        self.seconds = time.perf_counter() - began

    def _post(self, client: httpx.Client, batch: list[dict]) -> None:
        sent = time.perf_counter()
        answer = client.post("/ingest", json={"events": batch})
        with self._lock:
            self.latencies.append(time.perf_counter() - sent)
            if answer.status_code == 200:
                self.accepted += len(batch)
            else:
                self.failed += 1


def _swaps(client: httpx.Client) -> int:
    text = client.get("/metrics").text
    found = re.search(r"^driftline_model_swaps_total ([0-9.e+]+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def _replayed(events: list[dict], count: int) -> list[dict]:
    """``count`` events cycling through ``events``, each pass under fresh event ids, so
    a window longer than the data still ingests new events throughout."""
    return [
        {**events[i % len(events)], "event_id": f"{events[i % len(events)]['event_id']}-{i}"}
        for i in range(count)
    ]


def _under_ingest(
    prepared: Prepared, server: ServerProcess, seconds: float, batch: int
) -> dict[str, Any]:
    """wrk in ``SLICE_SECONDS`` slices while events stream in, from ``seconds`` on until
    the forced retrain's version has been swapped in (or ``MAX_WINDOW_SECONDS``)."""
    headers = {"Authorization": f"Bearer {prepared.admin_key}"}
    window = _replayed(prepared.rest, int(INGEST_RATE * MAX_WINDOW_SECONDS))
    slices: list[LoadResult] = []
    with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
        swaps_before = _swaps(client)
        ingestor = Ingestor(server.url, prepared.admin_key, window, INGEST_RATE, batch)
        ingestor.start()
        began = time.monotonic()
        retrain = None
        while True:
            slices.append(
                drive(server.url, prepared.users, seconds=SLICE_SECONDS, api_key=prepared.read_key)
            )
            if retrain is None:
                retrain = client.post("/retrain")
            swaps = _swaps(client) - swaps_before
            elapsed = time.monotonic() - began
            if elapsed >= MAX_WINDOW_SECONDS or (elapsed >= seconds and swaps > 0):
                break
        ingestor.stop_event.set()
        ingestor.join()
    loaded = _merge(slices)
    return {
        "under_ingest_seconds": sum(r.seconds for r in slices),
        "under_ingest_rps": loaded["rps"],
        "under_ingest_p50_ms": loaded["p50_ms"],
        "under_ingest_p99_ms": loaded["p99_ms"],
        "under_ingest_non_2xx": loaded["non_2xx"],
        "under_ingest_slices_p99_ms": [r.p99_ms for r in slices],
        "ingest_events_per_s": ingestor.accepted / ingestor.seconds,
        "ingest_target_events_per_s": INGEST_RATE,
        "ingest_failed_requests": ingestor.failed,
        "ingest_p99_ms": float(np.percentile(ingestor.latencies, 99) * 1000),
        "retrain_status": retrain.status_code,
        "swaps_in_window": swaps,
    }


def run_serve(
    dataset: Path | None = None,
    limit: int | None = None,
    batch_size: int = 500,
    seconds: float = 15.0,
    catalogue_items: int = 1_000_000,
) -> dict[str, Any]:
    """Every phase in one run; see the module docstring. The ingestion phase posts
    ``batch_size`` events a request, as ``driftline replay`` does by default."""
    require_wrk()
    stream = open_ratings(dataset, limit=limit)[0]
    figures: dict[str, Any] = {"connections": CONNECTIONS, "seconds": seconds}
    with tempfile.TemporaryDirectory(prefix="driftline-bench-serve-") as tmp:
        prepared = _prepare(stream, Path(tmp))
        figures["users"], figures["events"] = len(prepared.users), len(stream)
        figures["train_events"] = len(stream) - len(prepared.rest)
        with ServerProcess(prepared.data_dir) as server:
            figures.update(_side_by_side(prepared, server, seconds))
        figures.update(_without(prepared, seconds))
        with ServerProcess(prepared.data_dir) as server:
            figures.update(_under_ingest(prepared, server, seconds, batch_size))
        # The same window with the stream role in a process of its own (STREAM_PROCESS).
        with ServerProcess(prepared.data_dir, env=SPLIT_ENV) as server:
            split = _under_ingest(prepared, server, seconds, batch_size)
        figures.update({f"split_{name}": value for name, value in split.items()})
        figures["ingest_batch"] = batch_size
    if catalogue_items:
        figures.update(run_catalogue(catalogue_items, seconds=seconds))
    return figures
