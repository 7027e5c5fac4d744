"""Initial schema: events, retraining jobs and epochs, model versions, alerts, heartbeats.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(256), nullable=False, unique=True),
        sa.Column("user_id", sa.String(256), nullable=False, index=True),
        sa.Column("item_id", sa.String(256), nullable=False),
        sa.Column("rating", sa.Float, nullable=True),
        sa.Column("timestamp", sa.Float, nullable=True),
        sa.Column("ingested_at", sa.Float, nullable=False),
    )
    op.create_table(
        "retrain_jobs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("policy", sa.String(32), nullable=False),
        sa.Column("trigger", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("runtime", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("base_version", sa.String(64), nullable=True),
        sa.Column("model_version", sa.String(64), nullable=True),
        sa.Column("window_events", sa.Integer, nullable=True),
        sa.Column("last_event_id", sa.BigInteger, nullable=True),
        sa.Column("stop_reason", sa.String(32), nullable=True),
        sa.Column("cost_usd", sa.Float, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("params", sa.JSON, nullable=False),
    )
    op.create_table(
        "job_epochs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "job_id", sa.Integer, sa.ForeignKey("retrain_jobs.id"), nullable=False, index=True
        ),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("loss", sa.Float, nullable=False),
        sa.Column("duration_s", sa.Float, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.UniqueConstraint("job_id", "epoch", name="uq_job_epochs_job_epoch"),
    )
    op.create_table(
        "model_versions",
        sa.Column("version", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("artifact_key", sa.String(512), nullable=False),
        sa.Column("checksum", sa.String(64), nullable=False),
        sa.Column("rmse", sa.Float, nullable=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("retrain_jobs.id"), nullable=True),
        sa.Column("last_event_id", sa.BigInteger, nullable=False),
        sa.Column("n_users", sa.Integer, nullable=False),
        sa.Column("n_items", sa.Integer, nullable=False),
    )
    op.create_table(
        "drift_alerts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("detected_at", sa.Float, nullable=False),
        sa.Column("metric", sa.String(32), nullable=False),
        sa.Column("before", sa.Float, nullable=False),
        sa.Column("after", sa.Float, nullable=False),
        sa.Column("events_seen", sa.BigInteger, nullable=False),
        sa.Column("model_version", sa.String(64), nullable=True),
        sa.Column("retrain_job_id", sa.Integer, sa.ForeignKey("retrain_jobs.id"), nullable=True),
    )
    op.create_table(
        "heartbeats",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("events_seen", sa.BigInteger, nullable=False),
        sa.Column("events", sa.Integer, nullable=False),
        sa.Column("rmse", sa.Float, nullable=False),
        sa.Column("static_rmse", sa.Float, nullable=True),
        sa.Column("model_version", sa.String(64), nullable=True),
    )


def downgrade() -> None:
    for table in (
        "heartbeats",
        "drift_alerts",
        "model_versions",
        "job_epochs",
        "retrain_jobs",
        "events",
    ):
        op.drop_table(table)
