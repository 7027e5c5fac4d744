"""Pipelines built for a test and closed after it, however many it builds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.settings import Settings
from service.wiring import Driftline, build_driftline

#: Seconds a closing pipeline waits for a background job to end.
CLOSE_WAIT_S = 120.0


@contextmanager
def pipeline_factory(settings_for: Callable[..., Settings]) -> Iterator[Callable[..., Driftline]]:
    """``make(*args, background=False, **overrides)`` builds a pipeline from
    ``settings_for(*args, **overrides)``; on exit every pipeline made is stopped (its
    registry follower, its jobs) and closed. A second one on the same data directory
    and database is a restart."""
    built: list[Driftline] = []

    def make(*args: Any, background: bool = False, **overrides: Any) -> Driftline:
        pipeline = build_driftline(settings_for(*args, **overrides), background_retrain=background)
        built.append(pipeline)
        return pipeline

    try:
        yield make
    finally:
        for pipeline in built:
            pipeline.follower.stop()
            pipeline.retrainer.wait(timeout=CLOSE_WAIT_S)
            pipeline.retrainer.close()
            pipeline.db.dispose()


@contextmanager
def replica_factory(
    data_dir: Path, database_url: str, **defaults: Any
) -> Iterator[Callable[..., Driftline]]:
    """``make(replica_id, background=False, **overrides)`` builds one replica of a
    cluster: ``small_settings`` on one shared database and object store, under its own
    ``REPLICA_ID``; closed like ``pipeline_factory``'s."""

    def settings(replica_id: str, **overrides: Any) -> Settings:
        values = {**defaults, **overrides}
        return small_settings(data_dir, database_url, replica_id=replica_id, **values)

    with pipeline_factory(settings) as make:
        yield make


def small_settings(data_dir: Path, database_url: str, **overrides: Any) -> Settings:
    """Small settings for pipeline tests: a bootstrap after 200 events, heartbeats of 50,
    two epochs on threads, no refresh, no registry polling; each overridable."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": database_url,
        "bootstrap_events": 200,
        "heartbeat_events": 50,
        "factors": 8,
        "max_epochs": 2,
        "refresh_events": None,
        "retrain_runtime": "thread",
        "registry_poll_seconds": None,
    }
    return Settings(**{**values, **overrides})
