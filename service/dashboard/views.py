"""What each dashboard page shows, gathered from the read models and the store.

The functions here return plain dicts (JSON-ready), built from the same calls as the
JSON endpoints, so a page never says something the API would not. ``accuracy_series``
is both embedded in the overview (the table fallback) and served as
``/dashboard/data/accuracy`` for the chart.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import numpy as np

from service.reads import StreamReads
from service.store.alerts import get_alert, list_alerts
from service.store.jobs import get_job, list_jobs

__all__ = [
    "accuracy_series",
    "alert_page",
    "alerts_page",
    "job_page",
    "jobs_page",
    "overview",
    "versions_page",
]

#: Heartbeats the events/s figure is measured over.
RATE_HEARTBEATS = 5
#: Rows in the overview's tables.
RECENT = 10


def accuracy_series(reads: StreamReads) -> dict[str, Any]:
    """Heartbeats, alerts, swaps, job spans and the alert threshold, on one axis of
    labelled events seen: what the accuracy chart draws."""
    beats = reads.heartbeats()
    with reads.db.connect() as conn:
        alerts = list_alerts(conn, 1000)
        jobs = list_jobs(conn, 200)
    return {
        "heartbeats": [_heartbeat(b) for b in beats],
        "alerts": [
            {"id": a["id"], "events_seen": a["events_seen"], "after": a["after"]}
            for a in reversed(alerts)
        ],
        "swaps": _swaps(reads, beats),
        "jobs": _job_spans(jobs, beats),
        "threshold": reads.alert_band(),
    }


def _heartbeat(row: dict[str, Any]) -> dict[str, Any]:
    keys = ("events_seen", "rmse", "static_rmse", "hit_rate", "static_hit_rate", "model_version")
    return {"at": row.get("at"), **{key: row.get(key) for key in keys}}


def _events_at(beats: list[dict[str, Any]]) -> Callable[[float], float]:
    """A wall-clock time placed on the chart's axis of events seen, interpolated between
    the heartbeats' times (callers need two heartbeats or more)."""
    times = np.array([b["at"] for b in beats], dtype=np.float64)
    seen = np.array([b["events_seen"] for b in beats], dtype=np.float64)
    return lambda at: float(np.interp(at, times, seen))


def _swaps(reads: StreamReads, beats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each time a version started serving (a publish or a rollback), on the chart's axis."""
    if len(beats) < 2:
        return []
    events_at = _events_at(beats)
    intervals = sorted(reads.registry.serving_intervals(), key=lambda i: i.started_at)
    return [
        {"events_seen": events_at(i.started_at), "version": i.version, "trigger": i.trigger}
        for i in intervals
    ]


def _job_spans(jobs: list[dict[str, Any]], beats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each job's run as a span of events seen, from its start to its end (or now)."""
    if len(beats) < 2:
        return []
    events_at = _events_at(beats)
    return [
        {
            "id": job["id"],
            "trigger": job["trigger"],
            "status": job["status"],
            "start_events": events_at(start),
            "end_events": events_at(job.get("finished_at") or time.time()),
        }
        for job in reversed(jobs)
        if (start := job.get("started_at") or job.get("created_at")) is not None
    ]


def events_per_second(beats: list[dict[str, Any]]) -> float | None:
    """Labelled events per second over the last few heartbeats; None with too few."""
    recent = beats[-RATE_HEARTBEATS:]
    if len(recent) < 2 or recent[-1]["at"] <= recent[0]["at"]:
        return None
    return (recent[-1]["events_seen"] - recent[0]["events_seen"]) / (
        recent[-1]["at"] - recent[0]["at"]
    )


def _spend_today(jobs: list[dict[str, Any]]) -> float:
    """What jobs created since midnight UTC cost."""
    midnight = time.time() // 86_400 * 86_400
    return sum(j.get("cost_usd") or 0.0 for j in jobs if j["created_at"] >= midnight)


def overview(
    reads: StreamReads, consumer: Any | None, *, consumed_elsewhere: bool = False
) -> dict[str, Any]:
    """The overview's figures: what serves, how well, what runs, what it costs.
    ``consumed_elsewhere``: the replica's stream process consumes Kafka."""
    beats = reads.heartbeats()
    with reads.db.connect() as conn:
        alerts = list_alerts(conn, RECENT)
        jobs = list_jobs(conn, 200)
    current = reads.current
    running = reads.running_job_id
    return {
        "version": reads.serving_version,
        "version_created_at": None if current is None else current.row.get("created_at"),
        "labelled_seen": reads.labelled_seen,
        "events_per_second": events_per_second(beats),
        "kafka": None if consumer is None else asdict(consumer.state),
        "kafka_elsewhere": consumed_elsewhere,
        "cluster": reads.cluster_status(),
        "tracks": reads.accuracy_summary(),
        "policy": reads.policy_status(),
        "running_job": next((j for j in jobs if j["id"] == running), None),
        "spend_today_usd": _spend_today(jobs),
        "budget_usd": reads.budget_usd,
        "alerts": alerts,
        "jobs": jobs[:RECENT],
        "heartbeats": [_heartbeat(b) for b in beats[-RECENT:]][::-1],
        "rollout": reads.in_rollout(),
    }


def alerts_page(reads: StreamReads) -> dict[str, Any]:
    with reads.db.connect() as conn:
        return {"alerts": list_alerts(conn, 500)}


def alert_page(reads: StreamReads, alert_id: int) -> dict[str, Any] | None:
    """One alert, its segments, its detection delay and the job it started."""
    with reads.db.connect() as conn:
        alert = get_alert(conn, alert_id)
        job = None
        if alert is not None and alert.get("retrain_job_id") is not None:
            job = get_job(conn, alert["retrain_job_id"])
    if alert is None:
        return None
    change = alert.get("change_events")
    delay = None if change is None else alert["events_seen"] - change
    rise = (alert["after"] - alert["before"]) / alert["before"] if alert["before"] else None
    return {"alert": alert, "job": job, "delay_events": delay, "rise": rise}


def jobs_page(reads: StreamReads) -> dict[str, Any]:
    with reads.db.connect() as conn:
        return {"jobs": list_jobs(conn, 500)}


def job_page(reads: StreamReads, job_id: int) -> dict[str, Any] | None:
    """One job: its epochs with the configurator's predictions beside what happened, and
    its worker invocations."""
    with reads.db.connect() as conn:
        job = get_job(conn, job_id)
    if job is None:
        return None
    invocations = job.get("invocations") or []
    return {
        "job": job,
        "epochs": [_epoch_row(e) for e in job["epochs"]],
        "invocations": invocations,
        "cold_starts": sum(1 for i in invocations if i.get("cold_start")),
        "stragglers": sum(1 for i in invocations if _is_straggler(i)),
    }


def _is_straggler(invocation: dict[str, Any]) -> bool:
    """An update folded in after its epoch closed (selective synchronisation's late one)."""
    applied, epoch = invocation.get("applied_in"), invocation.get("epoch")
    return applied is not None and epoch is not None and applied != epoch


def _epoch_row(epoch: dict[str, Any]) -> dict[str, Any]:
    """An epoch's config vector beside what the configurator predicted and what came of
    it (the decision rides in the stored config; static configurators leave it out)."""
    config = epoch.get("config") or {}
    decision = config.get("decision") or {}
    return {
        "epoch": epoch["epoch"],
        "loss": epoch["loss"],
        "duration_s": epoch["duration_s"],
        "workers": config.get("workers"),
        "sync_ratio": config.get("sync_ratio"),
        "memory_mb": config.get("memory_mb"),
        "batch_size": config.get("batch_size"),
        "learning_rate": config.get("learning_rate"),
        "predicted_latency_s": decision.get("latency_s"),
        "observed_latency_s": decision.get("observed_latency_s"),
        "predicted_cost_usd": decision.get("cost_usd"),
        "observed_cost_usd": decision.get("observed_cost_usd"),
    }


def versions_page(reads: StreamReads) -> dict[str, Any]:
    """Every kept version with its lineage, accuracy, when it served and its rollout
    (the registry ``/models`` reads, with each version's job)."""
    registry = reads.registry
    served: dict[str, list[dict[str, Any]]] = {}
    for interval in registry.serving_intervals():
        served.setdefault(interval.version, []).append(
            {
                "started_at": interval.started_at,
                "ended_at": interval.ended_at,
                "trigger": interval.trigger,
            }
        )
    with reads.db.connect() as conn:
        jobs = {j["id"]: j for j in list_jobs(conn, 1000)}
    live = _live_rmse(reads.heartbeats())
    current = reads.serving_version
    guarded = reads.rollouts()
    rows = []
    for version in registry.versions():
        job = jobs.get(version["job_id"]) if version["job_id"] is not None else None
        rows.append(
            {
                **version,
                "serving": served.get(version["version"], []),
                "parent": None if job is None else job.get("base_version"),
                "trigger": None if job is None else job.get("trigger"),
                "live_rmse": live.get(version["version"]),
                "serving_now": version["version"] == current,
                "guard": guarded.get(version["version"]),
            }
        )
    return {"current": current, "versions": rows, "rollbacks": registry.rollbacks()}


def _live_rmse(beats: list[dict[str, Any]]) -> dict[str, float]:
    """Each version's prequential RMSE over the heartbeats it served."""
    sums: dict[str, list[float]] = {}
    for beat in beats:
        version = beat.get("model_version")
        if version is None or beat.get("rmse") is None:
            continue
        total = sums.setdefault(version, [0.0, 0.0])
        total[0] += beat["rmse"] ** 2 * beat["events"]
        total[1] += beat["events"]
    return {v: math.sqrt(s / n) for v, (s, n) in sums.items() if n}
