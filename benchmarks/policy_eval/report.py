"""Fig. 7- and Fig. 8-style plots and a markdown report of ``bench policies``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

RUNTIME_LABELS = {"sim": "functions", "vm": "peak-sized VM", "vm-autoscaled": "autoscaled VMs"}


def _plots(result: dict[str, Any], folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(result["traces"])
    fig7, axes7 = plt.subplots(1, len(traces), figsize=(4 * len(traces), 3.4), squeeze=False)
    for ax, trace in zip(axes7[0], traces, strict=True):
        block = result["traces"][trace]
        policies = [p for p in block if p != "never"]
        ax.bar(policies, [block[p]["sim"]["retrain_s"] for p in policies], color="#4c72b0")
        ax.set_title(f"{trace}: retraining time (functions)")
        ax.set_ylabel("seconds per job, trigger to swap")
        ax.tick_params(axis="x", rotation=40)
    fig7.tight_layout()
    fig8, axes8 = plt.subplots(1, len(traces), figsize=(4 * len(traces), 3.6), squeeze=False)
    for ax, trace in zip(axes8[0], traces, strict=True):
        for policy, runtimes in result["curves"][trace].items():
            # never bills nothing on functions: no point on a log axis (its A is in the table)
            points = sorted(
                (p for p in runtimes["sim"] if p["cost_usd"] > 0), key=lambda p: p["cost_usd"]
            )
            if not points:
                continue
            ax.plot(
                [p["cost_usd"] for p in points],
                [p["mean_accuracy"] for p in points],
                marker="o",
                label=policy,
            )
        for runtime, style in (("vm", "--"), ("vm-autoscaled", ":")):
            cost = result["traces"][trace]["best-effort"][runtime]["cost_usd"]
            ax.axvline(cost, linestyle=style, color="black", label=RUNTIME_LABELS[runtime])
        for target in (0.90, 0.95):
            ax.axhline(target, color="grey", linewidth=0.5)
        ax.set_xscale("log")
        ax.set_title(f"{trace}: cost vs accuracy")
        ax.set_xlabel("US$ over the trace (functions; VM lines)")
        ax.set_ylabel("mean A = RMSE(best-effort)/RMSE")
    axes8[0][0].legend(fontsize=7)
    fig8.tight_layout()
    paths = [folder / "policies_fig7_retrain_time.png", folder / "policies_fig8_cost_accuracy.png"]
    fig7.savefig(paths[0], dpi=110)
    fig8.savefig(paths[1], dpi=110)
    plt.close(fig7)
    plt.close(fig8)
    return paths


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "not reached"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _ci(entry: dict[str, Any]) -> str:
    if entry.get("mean") is None and entry.get("note"):
        return str(entry["note"])
    ci = entry.get("ci95")
    mean = _fmt(entry.get("mean"))
    return mean if not ci else f"{mean} [{_fmt(ci[0])}, {_fmt(ci[1])}]"


def _trace_table(trace: str, block: dict[str, Any]) -> list[str]:
    lines = [
        f"### {trace}",
        "",
        "| policy | runtime | cost US$ | mean A | p10 A | retrain s | incorporation s "
        "| recovery s | reaction s | jobs | hit-rate@10 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for policy, runtimes in block.items():
        for runtime, f in runtimes.items():
            lines.append(
                f"| {policy} ({f['knob']}) | {runtime} | {f['cost_usd']:.4f} | "
                f"{f['mean_accuracy']:.3f} | {f['p10_accuracy']:.3f} | {f['retrain_s']:.1f} | "
                f"{f['incorporation_latency_s']:.0f} | {f['recovery_s']:.0f} | "
                f"{f['reaction_s']:.0f} | {f['jobs']:.0f} | "
                f"{f['hit_rate_at_10']:.3f} |"
            )
    return [*lines, ""]


def _setup(setup: dict[str, Any]) -> list[str]:
    """What was replayed: the stream, and per trace its events and what each stands for."""
    if "stream" not in setup:
        return []
    traces = "; ".join(
        f"{trace} {laid['events']:,} events, "
        + ("one arrival each" if laid["weight"] == 1 else f"{laid['weight']:.3g} arrivals each")
        for trace, laid in setup.get("traces", {}).items()
    )
    return [f"Stream: {setup['stream']}, {setup.get('seeds')} seeds; {traces}.", ""]


def markdown(result: dict[str, Any], plots: list[Path]) -> str:
    lines = ["# bench policies", ""]
    lines += _setup(result.get("setup", {}))
    lines += [f"![{p.stem}]({p.name})" for p in plots] + [""]
    lines += [
        "## Comparisons per trace (mean over seeds [95 % bootstrap CI]; recovery: seconds "
        "pooled over drifts and seeds)",
        "",
    ]
    names = list(next(iter(result["comparisons"].values())))
    lines.append("| trace | " + " | ".join(names) + " |")
    lines.append("| --- |" + " ---: |" * len(names))
    for trace, comparisons in result["comparisons"].items():
        lines.append(f"| {trace} | " + " | ".join(_ci(comparisons[n]) for n in names) + " |")
    lines += ["", "## Headline", ""]
    lines += [f"- {k}: {_fmt(v)}" for k, v in result["headline"].items()]
    lines += ["", "## Autoscaled fleet by boot delay (adwin)", ""]
    for trace, boots in result["autoscaled_boot"].items():
        parts = [
            f"{boot} s: US$ {b['cost_usd']:.4f}, A {b['mean_accuracy']:.3f}, "
            f"retrain {b['retrain_s']:.0f} s"
            for boot, b in boots.items()
        ]
        lines.append(f"- {trace}: " + "; ".join(parts))
    lines += ["", "## Every policy and runtime at its default knob", ""]
    for trace, block in result["traces"].items():
        lines += _trace_table(trace, block)
    return "\n".join(lines)


def write_report(result: dict[str, Any], folder: Path) -> Path:
    """Write the plots and ``policies.md`` into ``folder``; returns the markdown's path."""
    folder.mkdir(parents=True, exist_ok=True)
    plots = _plots(result, folder)
    path = folder / "policies.md"
    path.write_text(markdown(result, plots), encoding="utf-8")
    return path
