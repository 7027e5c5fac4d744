"""The drift detector's record of recent errors, saved as it grows.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-12
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "monitor_errors",
        sa.Column("replica", sa.Integer, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("start", sa.BigInteger, nullable=False),
        sa.Column("stop", sa.BigInteger, nullable=False),
        sa.Column("errors", sa.LargeBinary, nullable=False),
        sa.Column("users", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("replica", "epoch", "start", name="pk_monitor_errors"),
    )


def downgrade() -> None:
    op.drop_table("monitor_errors")
