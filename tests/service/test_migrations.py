"""Schema upgrades of databases written by earlier releases."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text

from service.store.database import MIGRATIONS, make_engine


def test_a_job_published_twice_before_0004_upgrades_to_one_linked_version(
    tmp_path: Path,
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0003")
        conn.execute(
            text(
                "INSERT INTO retrain_jobs (id, policy, trigger, runtime, status, created_at, "
                "params) VALUES (1, 'adwin', 'drift', 'local', 'succeeded', 0, '{}')"
            )
        )
        for version in ("v0001", "v0002"):  # the crash-between-publish-and-record bug
            conn.execute(
                text(
                    "INSERT INTO model_versions (version, created_at, artifact_key, checksum, "
                    "job_id, last_event_id, n_users, n_items) "
                    f"VALUES ('{version}', 0, 'k', 'c', 1, 1, 1, 1)"
                )
            )
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "head")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT version, job_id FROM model_versions ORDER BY version"))
        assert rows.all() == [("v0001", 1), ("v0002", None)]
    engine.dispose()
