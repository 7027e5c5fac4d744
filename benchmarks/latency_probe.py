"""A ``/recommend`` probe in a process of its own: latency at a fixed rate, under load.

``python -m benchmarks.latency_probe URL RPS USERS_FILE OUT`` asks ``GET /recommend``
``RPS`` times a second, each time for one of the 200 users before the newest one that
``USERS_FILE`` names (a user serial of ``benchmarks.streams``, which whoever drives the
stream rewrites as it goes), and appends one line per request to ``OUT``: wall time,
seconds, status (0: no answer). It runs until SIGTERM. A process apart from the one
that produces the load, so that no interpreter lock adds to the latencies it logs;
``bench soak`` runs it.
"""

from __future__ import annotations

import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

__all__ = ["p99_per_interval", "probe", "read_latencies"]

#: Users the probe picks from: the newest this many.
RECENT_USERS = 200


def _newest(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0


def probe(url: str, rps: float, users: Path, out: Path, stop: threading.Event) -> None:
    """Ask until ``stop`` is set; see the module docstring."""
    rng = random.Random(0)
    period, due, newest, looked = 1.0 / rps, time.monotonic(), 0, 0.0
    with out.open("a") as log, httpx.Client(base_url=url, timeout=10) as client:
        while not stop.is_set():
            due += period
            if time.monotonic() - looked > 1.0:
                newest, looked = _newest(users), time.monotonic()
            user = f"u{max(0, newest - rng.randrange(RECENT_USERS))}"
            began = time.perf_counter()
            try:
                status = client.get("/recommend", params={"user_id": user}).status_code
            except httpx.HTTPError:
                status = 0
            log.write(f"{time.time():.3f},{time.perf_counter() - began:.6f},{status}\n")
            log.flush()
            pause = due - time.monotonic()
            if pause > 0:
                stop.wait(pause)
            else:
                due = time.monotonic()


def read_latencies(path: Path) -> np.ndarray:
    """The probe's log as ``n x 3``: wall time, seconds, status."""
    if not path.exists() or path.stat().st_size == 0:
        return np.zeros((0, 3))
    return np.loadtxt(path, delimiter=",", ndmin=2)


def p99_per_interval(latencies: np.ndarray, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """p99 of ``/recommend`` (ms) within each sampling interval (``n x 3``: time, s, status)."""
    out = []
    for before, after in zip(samples, samples[1:], strict=False):
        inside = latencies[(latencies[:, 0] >= before["t"]) & (latencies[:, 0] < after["t"])]
        ok = inside[inside[:, 2] == 200][:, 1] * 1000
        out.append(
            {
                "t": after["t"],
                "requests": int(inside.shape[0]),
                "errors": int((inside[:, 2] != 200).sum()),
                "p99_ms": float(np.percentile(ok, 99)) if ok.size else None,
            }
        )
    return out


def main(argv: list[str]) -> None:
    url, rps, users, out = argv
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    probe(url, float(rps), Path(users), Path(out), stop)


if __name__ == "__main__":
    main(sys.argv[1:])
