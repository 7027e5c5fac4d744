"""Snapshots of the online state in the object store, so a replica that starts replays
only the log after the newest one.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "online_snapshots",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("position", sa.BigInteger, nullable=False, index=True),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("key", sa.String(255), nullable=False, unique=True),
        sa.Column("checksum", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("online_snapshots")
