"""Table definitions. The Alembic migrations create these; keep both in step."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)

# SQLite only autoincrements an INTEGER PRIMARY KEY; PostgreSQL wants a BIGINT.
BigId = BigInteger().with_variant(Integer, "sqlite")

metadata = MetaData()

events = Table(
    "events",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("event_id", String(256), nullable=False, unique=True),
    Column("user_id", String(256), nullable=False),
    Column("item_id", String(256), nullable=False),
    Column("rating", Float, nullable=True),
    Column("timestamp", Float, nullable=True),
    Column("ingested_at", Float, nullable=False),
)

retrain_jobs = Table(
    "retrain_jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("policy", String(32), nullable=False),
    Column("trigger", String(32), nullable=False),
    Column("status", String(16), nullable=False),
    Column("runtime", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("started_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
    Column("base_version", String(64), nullable=True),
    Column("model_version", String(64), nullable=True),
    Column("window_events", Integer, nullable=True),
    Column("last_event_id", BigInteger, nullable=True),
    Column("stop_reason", String(32), nullable=True),
    Column("cost_usd", Float, nullable=True),
    Column("error", Text, nullable=True),
    Column("params", JSON, nullable=False),
    Column("invocations", JSON, nullable=True),
    # The leader's fencing token the job was started under (``store.leases``).
    Column("fencing_token", BigInteger, nullable=True),
)

job_epochs = Table(
    "job_epochs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", Integer, ForeignKey("retrain_jobs.id"), nullable=False, index=True),
    Column("epoch", Integer, nullable=False),
    Column("loss", Float, nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("config", JSON, nullable=False),
    UniqueConstraint("job_id", "epoch", name="uq_job_epochs_job_epoch"),
)

model_versions = Table(
    "model_versions",
    metadata,
    Column("version", String(64), primary_key=True),
    Column("created_at", Float, nullable=False),
    Column("artifact_key", String(512), nullable=False),
    Column("checksum", String(64), nullable=False),
    Column("rmse", Float, nullable=True),
    Column("job_id", Integer, ForeignKey("retrain_jobs.id"), nullable=True),
    Column("last_event_id", BigInteger, nullable=False),
    Column("n_users", Integer, nullable=False),
    Column("n_items", Integer, nullable=False),
    # When retention deleted the artifact (the row stays: the history says it existed).
    Column("deleted_at", Float, nullable=True),
    # A job publishes at most one version, even across a crash and a resume.
    UniqueConstraint("job_id", name="uq_model_versions_job_id"),
)

drift_alerts = Table(
    "drift_alerts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("detected_at", Float, nullable=False),
    Column("metric", String(32), nullable=False),
    Column("before", Float, nullable=False),
    Column("after", Float, nullable=False),
    Column("events_seen", BigInteger, nullable=False),
    Column("model_version", String(64), nullable=True),
    Column("retrain_job_id", Integer, ForeignKey("retrain_jobs.id"), nullable=True),
    # The detector that fired, where it places the change (events seen) and how the
    # error rise splits across user and item segments (drift/segments.py).
    Column("detector", String(64), nullable=True),
    Column("change_events", BigInteger, nullable=True),
    Column("segments", JSON, nullable=True),
    # Who acknowledged the alert (a key's name) and when; None until somebody has.
    Column("acknowledged_at", Float, nullable=True),
    Column("acknowledged_by", String(128), nullable=True),
    # drift (the monitor's) or rollback (the rollout guard's, ``service.rollout.guard``).
    Column("kind", String(16), nullable=False, server_default="drift"),
)

heartbeats = Table(
    "heartbeats",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", Float, nullable=False),
    Column("events_seen", BigInteger, nullable=False),
    Column("events", Integer, nullable=False),
    Column("rmse", Float, nullable=False),
    Column("static_rmse", Float, nullable=True),
    Column("model_version", String(64), nullable=True),
    # Ranking quality on the heartbeat's sampled positive events (drift/ranking.py);
    # null when the heartbeat held none.
    Column("hit_rate", Float, nullable=True),
    Column("ndcg", Float, nullable=True),
    Column("static_hit_rate", Float, nullable=True),
    Column("static_ndcg", Float, nullable=True),
    Column("ranked_events", Integer, nullable=True),
)

# The drift monitor's and heartbeat aggregator's state, written by the cluster's leader
# with the heartbeats it accounts for, so a restarted service carries on detecting. One
# row (``replica`` 0); the column stays from when each Kafka replica monitored its own.
monitor_state = Table(
    "monitor_state",
    metadata,
    Column("replica", Integer, primary_key=True, autoincrement=False),
    Column("saved_at", Float, nullable=False),
    Column("model_version", String(64), nullable=True),
    Column("state", JSON, nullable=False),
)

# The drift detector's record of recent errors, saved as it grows: one row per write of
# the monitor's state, holding the errors appended since the previous write (numbers
# ``start`` to ``stop`` of record ``epoch``). ``monitor_state`` names the record and the
# numbers it holds; rows of other epochs, and those entirely older, are deleted in the
# same transaction.
monitor_errors = Table(
    "monitor_errors",
    metadata,
    Column("replica", Integer, nullable=False),
    Column("epoch", BigInteger, nullable=False),
    Column("start", BigInteger, nullable=False),
    Column("stop", BigInteger, nullable=False),
    Column("errors", LargeBinary, nullable=False),
    Column("users", LargeBinary, nullable=False),
    PrimaryKeyConstraint("replica", "epoch", "start", name="pk_monitor_errors"),
)

consumer_offsets = Table(
    "consumer_offsets",
    metadata,
    Column("topic", String(255), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("next_offset", BigInteger, nullable=False),
    Column("updated_at", Float, nullable=False),
    PrimaryKeyConstraint("topic", "partition", name="pk_consumer_offsets"),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("topic", String(255), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("key", LargeBinary, nullable=True),
    Column("value", LargeBinary, nullable=True),
    Column("error", Text, nullable=False),
    Column("received_at", Float, nullable=False),
)

# Revoked keys stay (``revoked_at`` set): once any key has existed the service keeps
# asking for one, and a revoked key's name can be reused by a new key.
api_keys = Table(
    "api_keys",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False, index=True),
    Column("key_id", String(32), nullable=False, unique=True),
    Column("secret_hash", String(64), nullable=False),
    Column("scopes", JSON, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("last_used_at", Float, nullable=True),
    Column("revoked_at", Float, nullable=True),
)

# A rollback makes an earlier version serve again until the next one is published or
# rolled back to; the rows are the record of who did it (``service.serving.timeline``).
model_rollbacks = Table(
    "model_rollbacks",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("rolled_back_at", Float, nullable=False, index=True),
    Column("actor", String(128), nullable=False),
    Column("from_version", String(64), nullable=True),
    Column("to_version", String(64), ForeignKey("model_versions.version"), nullable=False),
)

# The rollout guard's record of a version published while another served
# (``service.rollout.guard``): in shadow, held, or promoted (watched, kept or rolled
# back). A version with a row serves from its promotion on, not from its publication
# (``service.serving.timeline``); ``shadow`` and ``watch`` hold the paired comparisons'
# figures and decisions.
model_rollouts = Table(
    "model_rollouts",
    metadata,
    Column("version", String(64), ForeignKey("model_versions.version"), primary_key=True),
    Column("state", String(16), nullable=False, index=True),
    Column("compared_with", String(64), nullable=True),
    Column("published_at", Float, nullable=False),
    Column("shadow_started_at", Float, nullable=True),
    Column("decided_at", Float, nullable=True),
    Column("promoted_at", Float, nullable=True),
    Column("watch_ended_at", Float, nullable=True),
    Column("shadow", JSON, nullable=True),
    Column("watch", JSON, nullable=True),
)

# One row per role (``leader``): who holds it, until when, and its fencing token, which
# grows with every change of holder (``service.store.leases``).
cluster_leases = Table(
    "cluster_leases",
    metadata,
    Column("role", String(32), primary_key=True),
    Column("holder", String(128), nullable=False),
    # The holding process: a replica restarted under its name takes over at once.
    Column("incarnation", String(32), nullable=False),
    Column("token", BigInteger, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("acquired_at", Float, nullable=False),
)

# ``POST /retrain`` on a replica that does not lead: the leader answers each request with
# the job it started or why it did not, and the status code the asker answers with
# (``service.store.requests``).
retrain_requests = Table(
    "retrain_requests",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("requested_at", Float, nullable=False),
    Column("trigger", String(32), nullable=False, server_default="manual"),
    Column("requested_by", String(128), nullable=False),
    Column("answered_at", Float, nullable=True, index=True),
    Column("job_id", Integer, ForeignKey("retrain_jobs.id"), nullable=True),
    Column("refusal", Text, nullable=True),
    Column("status", Integer, nullable=True),
)

# Snapshots of the online state at a log position (``service.stream.snapshot``): the
# object under ``key`` and its SHA-256; the leader writes them and keeps the newest few.
online_snapshots = Table(
    "online_snapshots",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("position", BigInteger, nullable=False, index=True),
    Column("version", String(64), nullable=False),
    Column("key", String(255), nullable=False, unique=True),
    Column("checksum", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("size", BigInteger, nullable=False),
)

# Partitions of the event log moved to the object store (``service.store.archives``): the
# events with ids ``first_id..last_id`` as Parquet under ``key``, with its SHA-256. A row
# is written once its object is, and before its events leave ``events``; ``purged_at``
# says they have. The newest ``last_id`` is the archive's boundary.
event_archives = Table(
    "event_archives",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("first_id", BigInteger, nullable=False, unique=True),
    Column("last_id", BigInteger, nullable=False, index=True),
    Column("key", String(255), nullable=False, unique=True),
    Column("checksum", String(64), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("events", BigInteger, nullable=False),
    Column("labelled", BigInteger, nullable=False),
    Column("first_ingested_at", Float, nullable=False),
    Column("last_ingested_at", Float, nullable=False),
    Column("archived_at", Float, nullable=False),
    Column("purged_at", Float, nullable=True),
)
