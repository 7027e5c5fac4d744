"""The notices Driftline sends: what each says and what makes two of them the same."""

from __future__ import annotations

from service.alerting.webhook import Notice


def drift_notice(
    alert_id: int, *, metric: str, before: float, after: float, events_seen: int, model: str | None
) -> Notice:
    """A drift alert; the same metric drifting on the same model is one notice per cooldown
    (a detector re-firing each heartbeat on a flapping metric pages once)."""
    rise = (after - before) / before if before else float("inf")
    return Notice(
        "drift",
        f"{metric}:{model}",
        f"Drift alert {alert_id}: {metric} rose from {before:.4f} to {after:.4f} "
        f"({rise:+.1%}) on model {model}.",
        {
            "alert": f"/drift/alerts/{alert_id}",
            "model": str(model),
            "events seen": str(events_seen),
        },
    )


def job_failed_notice(job_id: int, error: str) -> Notice:
    """A failed job; the same error's first line is one notice per cooldown (a broken
    runtime fails every job the same way)."""
    first_line = (error.strip().splitlines() or ["unknown error"])[0][:200]
    return Notice(
        "job_failed",
        first_line,
        f"Retraining job {job_id} failed: {first_line}",
        {"job": f"/jobs/{job_id}"},
    )


def budget_notice(job_id: int, cost_usd: float | None, budget_usd: float | None) -> Notice:
    """A job its workers' bill stopped (``RETRAIN_BUDGET_USD``); one per cooldown."""
    spent = "unknown" if cost_usd is None else f"${cost_usd:.4f}"
    limit = "unset" if budget_usd is None else f"${budget_usd:.4f}"
    return Notice(
        "budget",
        "retrain_budget_usd",
        f"Retraining job {job_id} stopped at its budget: spent {spent} of {limit} "
        "(RETRAIN_BUDGET_USD); its model was published as trained so far.",
        {"job": f"/jobs/{job_id}", "spent": spent, "budget": limit},
    )


def version_held_notice(version: str, serving: str | None, reason: str) -> Notice:
    """A version the rollout guard did not promote; one per version."""
    return Notice(
        "version_held",
        version,
        f"Model {version} was held in shadow and does not serve: {reason}.",
        {"model": version, "serving": str(serving), "versions": "/dashboard/versions"},
    )


def version_rolled_back_notice(version: str, to_version: str, reason: str) -> Notice:
    """A promoted version the rollout guard rolled back on its own; one per version."""
    return Notice(
        "version_rolled_back",
        version,
        f"Model {version} was rolled back to {to_version} by the rollout guard: {reason}.",
        {"model": version, "serving": to_version, "versions": "/dashboard/versions"},
    )
