"""Heartbeats carry ranking quality; alerts say which detector fired, where the change
began and how the error rise splits across segments.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_RANKING = ("hit_rate", "ndcg", "static_hit_rate", "static_ndcg")


def upgrade() -> None:
    with op.batch_alter_table("heartbeats") as batch:
        for name in _RANKING:
            batch.add_column(sa.Column(name, sa.Float, nullable=True))
        batch.add_column(sa.Column("ranked_events", sa.Integer, nullable=True))
    with op.batch_alter_table("drift_alerts") as batch:
        batch.add_column(sa.Column("detector", sa.String(64), nullable=True))
        batch.add_column(sa.Column("change_events", sa.BigInteger, nullable=True))
        batch.add_column(sa.Column("segments", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("drift_alerts") as batch:
        for name in ("segments", "change_events", "detector"):
            batch.drop_column(name)
    with op.batch_alter_table("heartbeats") as batch:
        for name in (*_RANKING, "ranked_events"):
            batch.drop_column(name)
