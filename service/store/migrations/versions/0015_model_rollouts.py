"""The rollout guard: versions in shadow, held or promoted, and alerts of kind rollback.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-10
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_rollouts",
        sa.Column(
            "version",
            sa.String(64),
            sa.ForeignKey("model_versions.version"),
            primary_key=True,
        ),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("compared_with", sa.String(64), nullable=True),
        sa.Column("published_at", sa.Float, nullable=False),
        sa.Column("shadow_started_at", sa.Float, nullable=True),
        sa.Column("decided_at", sa.Float, nullable=True),
        sa.Column("promoted_at", sa.Float, nullable=True),
        sa.Column("watch_ended_at", sa.Float, nullable=True),
        sa.Column("shadow", sa.JSON, nullable=True),
        sa.Column("watch", sa.JSON, nullable=True),
    )
    with op.batch_alter_table("drift_alerts") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="drift"))


def downgrade() -> None:
    with op.batch_alter_table("drift_alerts") as batch:
        batch.drop_column("kind")
    op.drop_table("model_rollouts")
