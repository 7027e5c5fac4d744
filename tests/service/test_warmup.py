"""The start-up warm-up loads every kernel the learning path calls, off the start-up path.

In a fresh interpreter (the test process has long compiled everything), the warm-up
runs, then a pipeline learns a real stream through a served version, the ranking sample
and closed heartbeats: no compiled function of the product may gain a signature after
the warm-up, or its first call would still land on a request.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = r"""
import importlib, json, pkgutil, sys, tempfile
from pathlib import Path

def kernels():
    found = {}
    for package in ("drift", "service"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            if info.name.endswith("__main__") or info.name.startswith(
                ("service.api", "service.dashboard", "service.app", "service.cli")
            ):
                continue
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if hasattr(value, "signatures") and hasattr(value, "py_func"):
                    if value.py_func.__module__ == info.name:
                        found[f"{info.name}.{name}"] = value
    return found

from service.stream.warmup import warm_up_learning_path
warm_up_learning_path(8)
before = {name: len(k.signatures) for name, k in kernels().items()}

from service.settings import Settings
from service.wiring import build_driftline
from service.store.events import NewEvent
from tests.support.synthetic import stationary_stream

stream = stationary_stream(n_users=60, n_items=80, n_events=2400, seed=3)
with tempfile.TemporaryDirectory() as tmp:
    settings = Settings(data_dir=Path(tmp), retrain_runtime="inprocess", bootstrap_events=600,
                        heartbeat_events=100, refresh_events=None, factors=8, max_epochs=3)
    pipeline = build_driftline(settings, background_retrain=False)
    events = [NewEvent(e["user_id"], e["item_id"], e["rating"], e["timestamp"], e["event_id"])
              for e in stream]
    for start in range(0, len(events), 200):
        pipeline.ingest(events[start:start + 200])
    served = pipeline.learner.current is not None
    ranked = pipeline.learner.ranking.tracker.count("driftline")
    pipeline.retrainer.close()
    pipeline.db.dispose()
after = {name: len(k.signatures) for name, k in kernels().items()}
print(json.dumps({"before": before, "after": after, "served": served, "ranked": ranked}))
"""


@pytest.mark.slow
def test_no_kernel_is_first_called_after_the_warm_up() -> None:
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["served"] and figures["ranked"] > 0  # the whole path ran
    assert figures["before"], "no compiled functions found"
    gained = {
        name: (figures["before"].get(name, 0), count)
        for name, count in figures["after"].items()
        if count > figures["before"].get(name, 0)
    }
    assert not gained, f"compiled after the warm-up: {gained}"


def test_a_pipeline_loads_its_kernels_on_a_thread_of_its_own(tmp_path: Path) -> None:
    """``build_driftline`` returns without waiting for the warm-up (a server binds its
    port at once); the warm-up signals when it is done."""
    from service.settings import Settings
    from service.wiring import build_driftline

    pipeline = build_driftline(
        Settings(data_dir=tmp_path, retrain_runtime="inprocess"), background_retrain=False
    )
    try:
        assert pipeline.kernels_ready.wait(timeout=120)
    finally:
        pipeline.retrainer.close()
        pipeline.db.dispose()
