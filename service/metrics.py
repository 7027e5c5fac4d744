"""Prometheus metrics of one service instance.

Each app owns its own ``CollectorRegistry`` instead of the process-global one, so two
services in one process (tests, the benchmark) never share or clash over counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    """The counters, gauges and histograms Driftline exports on ``/metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events_ingested = Counter(
            "driftline_events_ingested", "Events newly stored.", registry=r
        )
        self.events_duplicate = Counter(
            "driftline_events_duplicate", "Events skipped as already stored.", registry=r
        )
        self.ingest_group_batches = Histogram(
            "driftline_ingest_group_batches",
            "POST /ingest batches stored in one transaction and learnt together.",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.ingest_rejected = Counter(
            "driftline_ingest_rejected", "Ingest requests refused.", ["reason"], registry=r
        )
        self.prequential_rmse = Gauge(
            "driftline_prequential_rmse",
            "RMSE of the newest heartbeat (test-then-train).",
            ["model"],
            registry=r,
        )
        self.prequential_hit_rate = Gauge(
            "driftline_prequential_hit_rate",
            "Hit-rate@10 of the newest heartbeat that ranked a sampled liked event.",
            ["model"],
            registry=r,
        )
        self.prequential_ndcg = Gauge(
            "driftline_prequential_ndcg",
            "NDCG@10 of the newest heartbeat that ranked a sampled liked event.",
            ["model"],
            registry=r,
        )
        self.labelled_events = Counter(
            "driftline_labelled_events_evaluated", "Labelled events evaluated.", registry=r
        )
        self.drift_alerts = Counter("driftline_drift_alerts", "Drift alerts raised.", registry=r)
        self.drift_segment_share = Gauge(
            "driftline_drift_segment_share",
            "Share of the newest drift alert's error rise in each segment (new and returning "
            "users, head and tail items), recomputed as events after its change arrive.",
            ["segment"],
            registry=r,
        )
        self.retrain_jobs = Counter(
            "driftline_retrain_jobs", "Retraining jobs finished.", ["status"], registry=r
        )
        self.retrain_jobs_started = Counter(
            "driftline_retrain_jobs_started",
            "Retraining jobs started, by trigger policy and trigger.",
            ["policy", "trigger"],
            registry=r,
        )
        self.model_swaps = Counter(
            "driftline_model_swaps", "Model versions hot-swapped in.", registry=r
        )
        self.model_rollbacks = Counter(
            "driftline_model_rollbacks",
            "Rollbacks to an earlier model version (POST /models/{version}/rollback, "
            "or the rollout guard's).",
            registry=r,
        )
        self.version_held = Counter(
            "driftline_version_held",
            "Versions the rollout guard held in shadow instead of promoting.",
            registry=r,
        )
        self.version_rolled_back = Counter(
            "driftline_version_rolled_back",
            "Promoted versions the rollout guard rolled back on its own (actor guard).",
            registry=r,
        )
        self.version_promoted = Counter(
            "driftline_version_promoted",
            "Versions the rollout guard promoted from shadow.",
            registry=r,
        )
        self.shadow_events = Gauge(
            "driftline_shadow_events",
            "Labelled events compared by the version in shadow or under watch (0: none).",
            registry=r,
        )
        self.alert_webhook_sent = Counter(
            "driftline_alert_webhook_sent",
            "Notices the alert webhook accepted, by kind.",
            ["kind"],
            registry=r,
        )
        self.alert_webhook_failed = Counter(
            "driftline_alert_webhook_failed",
            "Notices given up on after every retry, by kind.",
            ["kind"],
            registry=r,
        )
        self.alert_webhook_suppressed = Counter(
            "driftline_alert_webhook_suppressed",
            "Notices not sent: one like it went out within ALERT_WEBHOOK_COOLDOWN_S.",
            ["kind"],
            registry=r,
        )
        self.alert_webhook_dropped = Counter(
            "driftline_alert_webhook_dropped",
            "Notices dropped, oldest first, from a full delivery queue.",
            ["kind"],
            registry=r,
        )
        self.model_load_failures = Counter(
            "driftline_model_load_failures", "Model artifacts refused.", registry=r
        )
        self.dead_letters = Counter(
            "driftline_dead_letters", "Kafka messages that were not valid events.", registry=r
        )
        self.consumer_lag = Gauge(
            "driftline_consumer_lag",
            "Messages in the partition not yet stored, by the replica that owns it now "
            "(REPLICA_ID, or hostname-pid).",
            ["partition", "replica"],
            registry=r,
        )
        self.leader = Gauge(
            "driftline_leader",
            "1 while this replica leads the cluster (drift monitor writes, jobs), else 0.",
            registry=r,
        )
        self.log_lag_events = Gauge(
            "driftline_log_lag_events",
            "Events other replicas stored that this replica has not applied yet.",
            registry=r,
        )
        self.log_applied_position = Gauge(
            "driftline_log_applied_position",
            "The newest event id (log position) this replica has learnt.",
            registry=r,
        )
        self.request_seconds = Histogram(
            "driftline_request_seconds", "Request latency.", ["route"], registry=r
        )
        self.responses = Counter(
            "driftline_responses",
            "Answers by route template and status class (2xx, 4xx, 5xx).",
            ["route", "status"],
            registry=r,
        )
        self.retrain_stops = Counter(
            "driftline_retrain_stops",
            "Retraining jobs that published, by why they stopped (converged, budget, ...).",
            ["reason"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
