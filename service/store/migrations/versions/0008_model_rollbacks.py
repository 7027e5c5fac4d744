"""Model rollbacks: who made which earlier version serve again, when, from which one.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_rollbacks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("rolled_back_at", sa.Float, nullable=False, index=True),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("from_version", sa.String(64), nullable=True),
        sa.Column(
            "to_version", sa.String(64), sa.ForeignKey("model_versions.version"), nullable=False
        ),
    )


def downgrade() -> None:
    op.drop_table("model_rollbacks")
