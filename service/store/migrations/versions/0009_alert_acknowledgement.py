"""Drift alerts can be acknowledged: by whom and when, so an operator's team sees which
alerts somebody has looked at.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("drift_alerts") as batch:
        batch.add_column(sa.Column("acknowledged_at", sa.Float, nullable=True))
        batch.add_column(sa.Column("acknowledged_by", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("drift_alerts") as batch:
        batch.drop_column("acknowledged_by")
        batch.drop_column("acknowledged_at")
