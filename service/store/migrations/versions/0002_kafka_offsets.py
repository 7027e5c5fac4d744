"""Kafka consumption: offsets stored with the events they carried, and dead letters.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "consumer_offsets",
        sa.Column("topic", sa.String(255), nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("next_offset", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("topic", "partition", name="pk_consumer_offsets"),
    )
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("topic", sa.String(255), nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("key", sa.LargeBinary, nullable=True),
        sa.Column("value", sa.LargeBinary, nullable=True),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("received_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("dead_letters")
    op.drop_table("consumer_offsets")
