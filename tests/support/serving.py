"""What a test may expect to serve, read from ``GET /models``."""

from __future__ import annotations

from typing import Any

from service.store.rollouts import NOT_PROMOTED


def serves_newest_promoted(models: dict[str, Any]) -> bool:
    """Whether ``/models``' current version is the newest that may serve: not deleted,
    and not run in shadow or held by the rollout guard (which, once a stream is over,
    may keep a version waiting for good)."""
    live = [
        v["version"]
        for v in models["versions"]
        if v["deleted_at"] is None and (v.get("guard") or {}).get("state") not in NOT_PROMOTED
    ]
    return not live or models["current"] == live[0]
