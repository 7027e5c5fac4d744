"""``driftline bench policies``: what each trigger policy's retraining costs and buys, on
functions and on VMs, over the four traces (SandPiper (Ali et al.), §V, Figs. 7 and 8).

MovieLens ml-latest-small is spread over each trace's two-hour shape in virtual time,
every event standing for the true arrivals it represents, with sudden drifts planted
at 40 and 80 minutes; every policy sees the same stream, and a model serves only from
the moment its job completes (see :mod:`benchmarks.policy_eval`). With ``stream``
"generated" the stream generator draws each trace's true arrivals instead, one event
each (Berkeley's 539,640 over two hours, WITS' 3,048,840), so the detector sees every
error the service would, with each event's user in its heartbeats as the service's
carry; ``limit`` caps the events of a trace above it (Twitter's 24 million), each
then standing for count / limit arrivals. For each trace ×
policy × runtime (``sim`` functions, the peak-sized ``vm``, the ``vm-autoscaled``
fleet) and seed:

* accuracy, prequential and paired per heartbeat window (120 over the horizon):
  A = RMSE(best-effort) / RMSE(policy) on the same runtime and seed; its mean, 10th
  percentile and the share of windows at A ≥ 0.90 and ≥ 0.95; hit-rate@10 on 2,000
  sampled liked events per scenario under the model serving then (an unknown user gets
  the items by damped bias, as the service's popular items);
* ``retrain_s``: mean job duration, trigger to swap (Fig. 7); the data-incorporation
  latency (arrival to the swap of a model trained on the event); drift recovery (onset
  to the first of 5 windows in a row at A ≥ 0.95), compared with ``cost-aware`` as a
  ratio of the seconds summed over drifts and seeds (``pooled_ratio``); the reaction
  (onset to the first job started after it: detection for ``adwin``);
* cost, total and per 1,000 true arrivals.

Each policy's knob is swept (detector sensitivity, batch interval, Continuum's w,
periodic N); the headline figures read the cost at A = 0.90 and 0.95 off those curves,
with 95 % bootstrap intervals over seeds. Figures are means over seeds.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.policy_eval.figures import RunFigures, bootstrap_ci, cost_at
from benchmarks.policy_eval.report import write_report
from benchmarks.policy_eval.run import Scenario
from benchmarks.policy_eval.runtimes import RUNTIMES, JobModel, PeakVmRuntime
from benchmarks.policy_eval.stream import STREAMS
from benchmarks.policy_eval.sweep import boot_variants, run_all, scenario
from functions.pricing import vm_prices

log = logging.getLogger(__name__)

PUBLISHED = (
    "cost_usd",
    "mean_accuracy",
    "p10_accuracy",
    "retrain_s",
    "incorporation_latency_s",
    "recovery_s",
)
TARGETS = (0.90, 0.95)

#: (policy, knob label, runtime) → figures of one trace and seed
Runs = dict[tuple[str, str, str], RunFigures]
#: (trace, seed) → its runs
Results = dict[tuple[str, int], Runs]


def _mean_figures(results: Results, trace: str, key: tuple[str, str, str]) -> dict[str, float]:
    rows = [asdict(runs[key]) for (name, _), runs in results.items() if name == trace]
    return {field: float(np.mean([r[field] for r in rows])) for field in rows[0]}


def _curve(runs: dict[tuple[str, str, str], RunFigures], policy: str, runtime: str) -> list:
    return [
        (f.cost_usd, f.mean_accuracy)
        for (p, _, r), f in runs.items()
        if p == policy and r == runtime
    ]


def _ratio_at(runs: Runs, baseline: str, target: float) -> float | None:
    """Baseline VM's bill over adwin-on-functions' cost at accuracy ``target``."""
    functions = cost_at(_curve(runs, "adwin", "sim"), target)
    vm = runs[("best-effort", "-", baseline)].cost_usd
    return None if functions is None or functions <= 0 else vm / functions


def _per_seed(results: Results, trace: str, value: Any) -> list[float | None]:
    return [value(runs) for (name, _), runs in results.items() if name == trace]


def _summary(values: list[float | None]) -> dict[str, Any]:
    finite = [v for v in values if v is not None]
    return {
        "mean": float(np.mean(finite)) if finite else None,
        "ci95": bootstrap_ci(finite),
        "seeds_reaching": len(finite),
    }


def _ratios(results: Results, trace: str) -> dict[str, dict[str, Any]]:
    """The per-trace comparisons the targets are stated in, each with its CI."""
    default = {
        "adwin": "drop 0.1",
        "cost-aware": "5 min",
        "best-effort": "-",
    }

    def retrain(runs: dict, policy: str) -> float:
        return runs[(policy, default[policy], "sim")].retrain_s

    def recovery(runs: dict, policy: str) -> float:
        return runs[(policy, default[policy], "sim")].recovery_s

    comparisons: dict[str, Callable[[Runs], float | None]] = {}
    for vm in ("vm", "vm-autoscaled"):
        for t in TARGETS:
            comparisons[f"cost_ratio_{vm}_at_{int(t * 100):03d}"] = partial(
                _ratio_at, baseline=vm, target=t
            )
    comparisons["platform_factor_vm"] = lambda r: (
        r[("best-effort", "-", "vm")].cost_usd / r[("best-effort", "-", "sim")].cost_usd
    )
    comparisons["policy_factor_at_090"] = lambda r: _policy_factor(r, 0.90)
    comparisons["retrain_speedup_vs_cost_aware"] = lambda r: (
        retrain(r, "cost-aware") / retrain(r, "adwin")
    )
    comparisons["retrain_vs_best_effort"] = lambda r: (
        retrain(r, "adwin") / retrain(r, "best-effort")
    )
    out = {name: _summary(_per_seed(results, trace, fn)) for name, fn in comparisons.items()}
    out["recovery_speedup_vs_cost_aware"] = pooled_ratio(
        _per_seed(results, trace, lambda r: recovery(r, "cost-aware")),
        _per_seed(results, trace, lambda r: recovery(r, "adwin")),
    )
    return out


def pooled_ratio(
    numerators: list[float | None], denominators: list[float | None], draws: int = 2_000
) -> dict[str, Any]:
    """Σ numerators / Σ denominators over seeds, with a 95 % bootstrap interval over
    seeds: how much longer ``cost-aware`` stayed behind best-effort after the drifts,
    in all, than ``adwin``.

    A mean of per-seed ratios fits recovery badly: a seed on which a policy never fell
    below A 0.95 has a recovery of 0, and its ratio is 0 or unbounded, so a seed on
    which ``adwin`` never fell behind dropped out and one on which neither did read as
    ``adwin`` losing. Pooled, each drift weighs by the seconds it cost. Where neither
    policy fell behind on any seed there is nothing to compare (``mean`` None, ``note``
    "tie"); where only ``adwin`` never did, it is faster by any factor (``mean`` None,
    ``note`` says so).

    >>> pooled_ratio([0.0, 120.0, 60.0], [60.0, 0.0, 30.0])["mean"]
    2.0
    >>> pooled_ratio([0.0, 0.0], [0.0, 0.0])["note"], pooled_ratio([5.0], [0.0])["note"]
    ('tie: neither fell behind', 'adwin never fell behind')
    """
    pairs = np.array(
        [
            (n, d)
            for n, d in zip(numerators, denominators, strict=True)
            if n is not None and d is not None
        ],
        dtype=float,
    ).reshape(-1, 2)
    reaching = int(np.count_nonzero(pairs.sum(axis=1) > 0))
    total_n, total_d = pairs.sum(axis=0) if pairs.size else (0.0, 0.0)
    if total_d <= 0:
        note = "tie: neither fell behind" if total_n <= 0 else "adwin never fell behind"
        return {"mean": None, "ci95": None, "seeds_reaching": reaching, "note": note}
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(pairs), size=(draws, len(pairs)))
    sums = pairs[picks].sum(axis=1)
    ratios = sums[:, 0][sums[:, 1] > 0] / sums[:, 1][sums[:, 1] > 0]
    ci = (float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5)))
    return {"mean": float(total_n / total_d), "ci95": ci, "seeds_reaching": reaching}


def _policy_factor(runs: dict, target: float) -> float | None:
    """Best-effort's function bill over adwin's cost at ``target``: retraining less."""
    functions = cost_at(_curve(runs, "adwin", "sim"), target)
    best = runs[("best-effort", "-", "sim")].cost_usd
    return None if not functions else best / functions


def _trace_block(results: Results, trace: str, defaults: dict[str, str]) -> dict[str, Any]:
    block: dict[str, Any] = {}
    for policy, label in defaults.items():
        block[policy] = {}
        for runtime in RUNTIMES:
            figures = _mean_figures(results, trace, (policy, label, runtime))
            block[policy][runtime] = {
                **{k: figures[k] for k in PUBLISHED},
                "share_090": figures["share_090"],
                "share_095": figures["share_095"],
                "cost_per_1k_events_usd": figures["cost_per_1k_events_usd"],
                "reaction_s": figures["reaction_s"],
                "hit_rate_at_10": figures["hit_rate_at_10"],
                "jobs": figures["jobs"],
                "knob": label,
            }
    return block


def _curves(results: Results, trace: str) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Mean (cost, A) of every knob value, per policy and runtime, for the plots."""
    keys = sorted({key for (name, _), runs in results.items() if name == trace for key in runs})
    out: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for policy, label, runtime in keys:
        figures = _mean_figures(results, trace, (policy, label, runtime))
        out[policy][runtime].append(
            {
                "knob": label,
                "cost_usd": figures["cost_usd"],
                "mean_accuracy": figures["mean_accuracy"],
                "retrain_s": figures["retrain_s"],
            }
        )
    return {p: dict(r) for p, r in out.items()}


def run_policies(
    dataset: Path | None = None,
    limit: int | None = None,
    batch_size: int = 500,
    seeds: int | None = None,
    minutes: float | None = None,
    report: Path | None = None,
    traces: tuple[str, ...] = ("wiki", "berkeley", "twitter", "wits"),
    compute_scale: float | None = None,
    stream: str = "movielens",
) -> dict[str, Any]:
    """Run the evaluation; see the module docstring. ``batch_size`` is unused (every
    event is replayed in virtual time). ``compute_scale`` is the work of one sample as
    a multiple of the calibrated 8-factor worker's (default 32): it sets how large the
    VMs must be, and so how much of a VM idles. ``stream`` is a source of
    :data:`~benchmarks.policy_eval.stream.STREAMS`; ``limit`` caps its events (per
    trace for ``generated``)."""
    seeds = 3 if seeds is None else seeds
    horizon = int(round(60 * (120 if minutes is None else minutes)))
    if stream not in STREAMS:
        raise ValueError(f"unknown stream {stream!r}; choose from {', '.join(STREAMS)}")
    source = STREAMS[stream](dataset, limit)
    jobs = JobModel() if compute_scale is None else JobModel(compute_scale=compute_scale)
    results: Results = {}
    boots: dict[str, list[dict[int, dict[str, float]]]] = defaultdict(list)
    sandpiper_vm: dict[str, float] = {}
    laid: dict[str, dict[str, Any]] = {}
    for trace in traces:
        for seed in range(seeds):
            started = time.perf_counter()
            scene = scenario(source, trace, seed, horizon)
            built = time.perf_counter()
            results[(trace, seed)] = run_all(scene, jobs, seed)
            boots[trace].append(boot_variants(scene, jobs, seed))
            laid.setdefault(trace, _laid(scene)).setdefault("seconds", []).append(
                {"scenario": built - started, "replays": time.perf_counter() - built}
            )
            log.info("bench policies: %s seed %d done", trace, seed)
        sandpiper_vm[trace] = PeakVmRuntime(
            jobs, scene.rates, vm_prices("sandpiper")
        ).standing_cost()
    defaults = {"adwin": "drop 0.1", "best-effort": "-", "cost-aware": "5 min"}
    defaults |= {"continuum": "w 10", "periodic": "5 min", "never": "-"}
    out: dict[str, Any] = {
        "traces": {t: _trace_block(results, t, defaults) for t in traces},
        "comparisons": {t: _ratios(results, t) for t in traces},
        "curves": {t: _curves(results, t) for t in traces},
        "autoscaled_boot": {
            t: {
                str(boot): {
                    k: float(np.mean([b[boot][k] for b in boots[t]]))
                    for k in ("cost_usd", "mean_accuracy", "retrain_s")
                }
                for boot in boots[t][0]
            }
            for t in traces
        },
        "vm_cost_sandpiper_prices_usd": sandpiper_vm,
        "setup": {
            "seeds": seeds,
            "horizon_s": horizon,
            "stream": stream,
            "traces": laid,
            "job_model": asdict(jobs),
            "vm_prices": asdict(vm_prices("c5")),
        },
    }
    out["headline"] = _headline(out["comparisons"])
    if report is not None:
        out["report"] = str(write_report(out, report))
    return out


def _headline(comparisons: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    def mean(trace: str, name: str) -> float | None:
        return comparisons.get(trace, {}).get(name, {}).get("mean")

    return {
        "wits_cost_ratio_vm_at_090": mean("wits", "cost_ratio_vm_at_090"),
        "wits_cost_ratio_vm_at_095": mean("wits", "cost_ratio_vm_at_095"),
        "wits_cost_ratio_autoscaled_at_090": mean("wits", "cost_ratio_vm-autoscaled_at_090"),
        "berkeley_retrain_speedup_vs_cost_aware": mean("berkeley", "retrain_speedup_vs_cost_aware"),
    }


def _laid(scene: Scenario) -> dict[str, Any]:
    """What a trace's stream was: events, the true arrivals each stands for, rungs."""
    return {
        "events": int(scene.times.size),
        "weight": scene.weight,
        "ladder_rungs": len(scene.ladder.hits),
        "ladder_step": scene.ladder.step,
    }


__all__ = ["run_policies"]
