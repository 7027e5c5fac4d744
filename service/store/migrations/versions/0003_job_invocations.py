"""Retraining jobs keep their worker invocations (timings, outcome, cost).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("retrain_jobs") as batch:
        batch.add_column(sa.Column("invocations", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("retrain_jobs") as batch:
        batch.drop_column("invocations")
