"""Model versions say when their artifact was deleted by retention; at most one per job.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Before this revision a crash between publishing and recording could register one
    # job's model twice: the later duplicates keep their rows but lose the job link, so
    # the constraint can be added to a database that has them.
    op.execute(
        "UPDATE model_versions SET job_id = NULL WHERE job_id IS NOT NULL AND version NOT IN "
        "(SELECT MIN(version) FROM model_versions WHERE job_id IS NOT NULL GROUP BY job_id)"
    )
    with op.batch_alter_table("model_versions") as batch:
        batch.add_column(sa.Column("deleted_at", sa.Float, nullable=True))
        batch.create_unique_constraint("uq_model_versions_job_id", ["job_id"])


def downgrade() -> None:
    with op.batch_alter_table("model_versions") as batch:
        batch.drop_constraint("uq_model_versions_job_id", type_="unique")
        batch.drop_column("deleted_at")
