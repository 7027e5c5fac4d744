"""Partitions of the event log archived to the object store (event retention).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-09
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "event_archives",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("first_id", sa.BigInteger, nullable=False, unique=True),
        sa.Column("last_id", sa.BigInteger, nullable=False, index=True),
        sa.Column("key", sa.String(255), nullable=False, unique=True),
        sa.Column("checksum", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("events", sa.BigInteger, nullable=False),
        sa.Column("labelled", sa.BigInteger, nullable=False),
        sa.Column("first_ingested_at", sa.Float, nullable=False),
        sa.Column("last_ingested_at", sa.Float, nullable=False),
        sa.Column("archived_at", sa.Float, nullable=False),
        sa.Column("purged_at", sa.Float, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("event_archives")
