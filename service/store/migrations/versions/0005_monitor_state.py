"""The drift monitor's state survives a restart.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "monitor_state",
        sa.Column("replica", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("saved_at", sa.Float, nullable=False),
        sa.Column("model_version", sa.String(64), nullable=True),
        sa.Column("state", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("monitor_state")
