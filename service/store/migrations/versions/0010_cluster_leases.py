"""Replicas elect one leader through a lease row with a fencing token, and every
retraining job records the token it was started under.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cluster_leases",
        sa.Column("role", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("incarnation", sa.String(32), nullable=False),
        sa.Column("token", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("acquired_at", sa.Float, nullable=False),
    )
    with op.batch_alter_table("retrain_jobs") as batch:
        batch.add_column(sa.Column("fencing_token", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("retrain_jobs") as batch:
        batch.drop_column("fencing_token")
    op.drop_table("cluster_leases")
