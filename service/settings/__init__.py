"""One settings object for the whole service, composed of one part per concern.

Values come from CLI flags, then ``DRIFTLINE_*`` environment variables, then defaults.
The object is built once (in the CLI or a test) and handed to the app, never read at
import time, so tests can run several differently configured services side by side.

Each concern's fields and validators live in their own module (``stack``, ``stream``,
``drift``, ``retrain``, ``serving``, ``rollout``, ``security``, ``cluster``,
``retention``); a field's group is the part that declares it (:func:`group_of`), which
``driftline settings`` and ``docs/settings.md`` list it under.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.settings.cluster import ClusterSettings
from service.settings.drift import DriftSettings
from service.settings.limits import EventLimits, Problem
from service.settings.retention import RetentionPolicy, RetentionSettings, parse_retention
from service.settings.retrain import RetrainSettings
from service.settings.rollout import RolloutSettings
from service.settings.security import LOOPBACK_HOSTS, Names, SecuritySettings
from service.settings.serving import ServingSettings
from service.settings.stack import StackSettings
from service.settings.stream import StreamSettings

__all__ = [
    "GROUPS",
    "LOOPBACK_HOSTS",
    "ClusterSettings",
    "DriftSettings",
    "EventLimits",
    "Names",
    "Problem",
    "RetentionPolicy",
    "RetentionSettings",
    "RetrainSettings",
    "RolloutSettings",
    "SecuritySettings",
    "ServingSettings",
    "Settings",
    "StackSettings",
    "StreamSettings",
    "group_of",
    "parse_retention",
    "settings_groups",
]

#: The concerns, in the order they are listed, each with the part declaring its fields.
GROUPS: dict[str, type[BaseModel]] = {
    "stack": StackSettings,
    "stream": StreamSettings,
    "drift": DriftSettings,
    "retrain": RetrainSettings,
    "serving": ServingSettings,
    "rollout": RolloutSettings,
    "security": SecuritySettings,
    "cluster": ClusterSettings,
    "retention": RetentionSettings,
}


# The parts are listed in the reverse of GROUPS: pydantic takes the last base's fields
# (and runs its validators) first, so flags and errors come in GROUPS' order.
class Settings(
    RetentionSettings,
    ClusterSettings,
    SecuritySettings,
    RolloutSettings,
    ServingSettings,
    RetrainSettings,
    DriftSettings,
    StreamSettings,
    StackSettings,
    BaseSettings,
):
    """Driftline's configuration (environment prefix ``DRIFTLINE_``)."""

    model_config = SettingsConfigDict(
        env_prefix="DRIFTLINE_", extra="forbid", env_parse_none_str="none"
    )

    @model_validator(mode="after")
    def _check_runtime_store(self) -> Self:
        """Lambda workers read and write artifacts themselves: only S3 reaches them."""
        if self.retrain_runtime == "lambda" and not self.resolved_object_store_url.startswith(
            "s3://"
        ):
            raise ValueError(
                "retrain_runtime lambda needs an s3:// object_store_url: workers on AWS "
                f"cannot read {self.resolved_object_store_url}"
            )
        return self


def settings_groups() -> dict[str, tuple[str, ...]]:
    """Each group's setting names, in declaration order.

    >>> list(settings_groups())  # doctest: +NORMALIZE_WHITESPACE
    ['stack', 'stream', 'drift', 'retrain', 'serving', 'rollout', 'security', 'cluster',
     'retention']
    >>> settings_groups()["stream"][:2]
    ('rating_min', 'rating_max')
    """
    return {group: tuple(part.model_fields) for group, part in GROUPS.items()}


def group_of(name: str) -> str:
    """The group of the setting ``name``: the part that declares it.

    >>> group_of("retrain_workers"), group_of("database_url"), group_of("session_secret")
    ('retrain', 'stack', 'security')
    """
    for group, part in GROUPS.items():
        if name in part.model_fields:
            return group
    raise KeyError(f"no setting named {name!r}")
