"""The soak's plots over time, drawn from its figures alone (``bench soak --json``'s
object), so a saved run can be drawn again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["plot_soak"]

PROCESS_COLOURS = {"haproxy": "tab:grey", "broker": "tab:brown", "bench": "tab:olive"}


def _minutes(rows: list[dict[str, Any]]) -> list[float]:
    return [row["s"] / 60 for row in rows]


def _onset_minutes(figures: dict[str, Any]) -> list[tuple[str, float]]:
    """Each planted drift and the minute its onset was stored."""
    out = []
    for drift in figures["planted"]:
        row = next((r for r in figures["timeline"] if r["stored"] >= drift["onset"]), None)
        if row is not None:
            out.append((drift["drift"], row["s"] / 60))
    return out


def _mark_drifts(ax: Any, figures: dict[str, Any]) -> None:
    for name, minute in _onset_minutes(figures):
        ax.axvline(minute, color="tab:red", lw=0.8, ls="--")
        ax.annotate(
            name,
            (minute, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            color="tab:red",
            ha="left",
            va="top",
            rotation=90,
        )


def _memory(figures: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    timeline = figures["timeline"]
    minutes = _minutes(timeline)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [1, 2]}
    )
    top.plot(minutes, [r["stored"] / 1e6 for r in timeline], color="black")
    top.set_ylabel("events stored (M)")
    for key in [k for k in timeline[-1] if k.startswith("rss_")]:
        name = key.removeprefix("rss_").removesuffix("_mb")
        bottom.plot(
            minutes, [r[key] for r in timeline], label=name, color=PROCESS_COLOURS.get(name)
        )
    bottom.set_ylabel("resident memory (MB)")
    bottom.set_xlabel("minutes")
    bottom.set_ylim(bottom=0)
    bottom.legend(fontsize=7, ncol=3)
    for ax in (top, bottom):
        _mark_drifts(ax, figures)
    top.set_title(
        f"soak: {figures['events_stored']:,} events, {figures['config_replicas']} replicas",
        fontsize=9,
    )
    return _save(fig, path)


def _db(figures: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    timeline = figures["timeline"]
    millions = [r["stored"] / 1e6 for r in timeline]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(millions, [r["db_mb"] for r in timeline], color="tab:blue", label="schema, MB")
    rows = top.twinx()
    rows.plot(
        millions,
        [r["db_event_rows"] / 1e3 for r in timeline],
        color="tab:orange",
        label="events rows (k)",
    )
    top.set_ylabel("PostgreSQL schema (MB)", color="tab:blue")
    rows.set_ylabel("rows of events (thousands)", color="tab:orange")
    top.set_ylim(bottom=0)
    rows.set_ylim(bottom=0)
    for kind, colour in (
        ("archive", "tab:green"),
        ("snapshots", "tab:purple"),
        ("models", "tab:cyan"),
    ):
        bottom.plot(millions, [r[f"store_{kind}_mb"] for r in timeline], label=kind, color=colour)
    bottom.set_ylabel("object store (MB)")
    bottom.set_xlabel("events stored (millions)")
    bottom.set_ylim(bottom=0)
    bottom.legend(fontsize=7)
    top.set_title(
        f"retention: EVENT_RETENTION={figures['config_retention_events']:,} events", fontsize=9
    )
    return _save(fig, path)


def _p99(figures: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    series = [r for r in figures["recommend_p99_timeline"] if r["p99_ms"] is not None]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.plot(
        _minutes(series),
        [r["p99_ms"] for r in series],
        color="tab:blue",
        label=f"p99 per {figures['config_sample_s']:g} s",
    )
    t0 = figures["t0"]
    for n, job in enumerate(j for j in figures["jobs"] if j["started_at"] and j["finished_at"]):
        ax.axvspan(
            (job["started_at"] - t0) / 60,
            (job["finished_at"] - t0) / 60,
            color="tab:green",
            alpha=0.2,
            lw=0,
            label="retraining job" if n == 0 else None,
        )
    for n, alert in enumerate(figures["alerts"]):
        ax.axvline(
            (alert["detected_at"] - t0) / 60,
            color="tab:orange",
            lw=0.8,
            label="drift alert" if n == 0 else None,
        )
    _mark_drifts(ax, figures)
    ax.set_xlabel("minutes")
    ax.set_ylabel("/recommend p99 (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_soak(figures: dict[str, Any], folder: Path) -> list[Path]:
    """``soak-memory.png``, ``soak-db.png`` and ``soak-p99.png`` in ``folder``."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    return [
        _memory(figures, folder / "soak-memory.png"),
        _db(figures, folder / "soak-db.png"),
        _p99(figures, folder / "soak-p99.png"),
    ]
