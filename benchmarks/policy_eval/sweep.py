"""Every policy's knob values, every runtime, over one trace and seed."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from benchmarks.policy_eval.figures import RunFigures, run_figures, serving_windows
from benchmarks.policy_eval.ladder import build_ladder
from benchmarks.policy_eval.run import Run, Scenario, replay
from benchmarks.policy_eval.runtimes import RUNTIMES, JobModel
from benchmarks.policy_eval.stream import DRIFT_FRACTIONS, StreamSource
from benchmarks.traces import make_trace
from drift import DriftDetector, make_detector
from functions.pricing import vm_prices
from retrain.policies import make_policy


@dataclass(frozen=True)
class Setting:
    """One point of a policy's knob sweep: its label, the knobs, the detector's
    sensitivity (``adwin`` only) and whether it is the policy's default."""

    policy: str
    label: str
    knobs: dict[str, Any]
    default: bool = False
    min_relative_drop: float | None = None


def sweep(mean_rate: float) -> list[Setting]:
    """The knob values swept per policy; periodic's N is in seconds of mean arrivals."""
    settings = [Setting("adwin", f"drop {d}", {}, d == 0.1, d) for d in (0.05, 0.1, 0.2, 0.4)]
    settings.append(Setting("best-effort", "-", {}, True))
    settings += [
        Setting("cost-aware", f"{s // 60} min", {"interval_s": float(s)}, s == 300)
        for s in (60, 120, 300, 600)
    ]
    settings += [
        Setting("continuum", f"w {w:g}", {"weight": float(w)}, w == 10) for w in (10, 1e4, 1e5, 1e6)
    ]
    settings += [
        Setting("periodic", f"{s // 60} min", {"every_events": int(mean_rate * s)}, s == 300)
        for s in (60, 300, 1200)
    ]
    settings.append(Setting("never", "-", {}, True))
    return settings


def scenario(
    source: StreamSource, trace_name: str, seed: int, horizon_s: int, rungs: int | None = None
) -> Scenario:
    """The ``source``'s stream over the trace's shape for ``horizon_s`` seconds, drifts
    planted at 40 and 80 minutes (a third and two thirds of the horizon), its ladder
    trained (``rungs``: by default one per 400 events, from 20 to 240)."""
    trace = make_trace(trace_name, seed=seed, period_s=horizon_s)
    onsets_s = tuple(f * horizon_s for f in DRIFT_FRACTIONS)
    laid = source(trace, seed, onsets_s)
    n = len(laid.stream)
    rungs = max(20, min(240, n // 400)) if rungs is None else rungs
    ladder = build_ladder(laid.stream, bootstrap=n // 20, rungs=rungs, seed=seed)
    rates = trace.rates[:horizon_s].astype(float)
    keys = None if laid.weight > 1 else (laid.stream.users & 0xFFFF).astype(np.uint16)
    return Scenario(laid.times, laid.weight, horizon_s, ladder, onsets_s, rates, keys)


def _detector(setting: Setting) -> DriftDetector | None:
    if setting.min_relative_drop is None:
        return None
    return make_detector(
        "page-hinkley", delta=0.002, min_relative_drop=setting.min_relative_drop, min_heartbeats=5
    )


def _replay(
    scene: Scenario, setting: Setting, runtime: str, jobs: JobModel, seed: int, boot_s: int
) -> Run:
    policy = make_policy(setting.policy, bootstrap_events=0, refresh_events=None, **setting.knobs)
    built = RUNTIMES[runtime](jobs, scene.rates, vm_prices("c5"), seed, boot_s)
    return replay(scene, policy, built, _detector(setting), jobs)


def run_all(
    scene: Scenario, jobs: JobModel, seed: int, boot_s: int = 60
) -> dict[tuple[str, str, str], RunFigures]:
    """Figures of every (policy, knob label, runtime) on this scenario."""
    mean_rate = float(scene.rates.mean())
    out: dict[tuple[str, str, str], RunFigures] = {}
    for runtime in RUNTIMES:
        best = _replay(scene, Setting("best-effort", "-", {}), runtime, jobs, seed, boot_s)
        yardstick = serving_windows(scene, best)
        for setting in sweep(mean_rate):
            run = _replay(scene, setting, runtime, jobs, seed, boot_s)
            out[(setting.policy, setting.label, runtime)] = run_figures(scene, run, yardstick)
    return out


def boot_variants(
    scene: Scenario, jobs: JobModel, seed: int, boots: tuple[int, ...] = (0, 60, 120)
) -> dict[int, dict[str, float]]:
    """The default ``adwin`` on the autoscaled fleet at each boot delay."""
    adwin = next(s for s in sweep(float(scene.rates.mean())) if s.policy == "adwin" and s.default)
    out = {}
    for boot in boots:
        best = _replay(scene, Setting("best-effort", "-", {}), "vm-autoscaled", jobs, seed, boot)
        run = _replay(scene, adwin, "vm-autoscaled", jobs, seed, boot)
        figures = asdict(run_figures(scene, run, best))
        out[boot] = {k: figures[k] for k in ("cost_usd", "mean_accuracy", "retrain_s")}
    return out
