"""A replica that does not lead asks the leader for a retraining job through a row the
leader answers.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "retrain_requests",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("requested_at", sa.Float, nullable=False),
        sa.Column("trigger", sa.String(32), nullable=False, server_default="manual"),
        sa.Column("requested_by", sa.String(128), nullable=False),
        sa.Column("answered_at", sa.Float, nullable=True, index=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("retrain_jobs.id"), nullable=True),
        sa.Column("refusal", sa.Text, nullable=True),
        sa.Column("status", sa.Integer, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("retrain_requests")
