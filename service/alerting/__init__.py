"""Alert delivery: notices of drift, failed jobs, spent budgets and the rollout guard's
held and rolled-back versions, sent to a webhook."""

from __future__ import annotations

from typing import Protocol

from service.alerting.notices import (
    budget_notice,
    drift_notice,
    job_failed_notice,
    version_held_notice,
    version_rolled_back_notice,
)
from service.alerting.webhook import AlertWebhook, Delivery, Notice, NoWebhook, slack_message
from service.metrics import Metrics
from service.settings import Settings

__all__ = [
    "AlertWebhook",
    "Delivery",
    "NoWebhook",
    "Notice",
    "Notifier",
    "budget_notice",
    "drift_notice",
    "job_failed_notice",
    "make_notifier",
    "slack_message",
    "version_held_notice",
    "version_rolled_back_notice",
]


class Notifier(Protocol):
    """What raises notices sees: ``notify`` never blocks; the owner starts and stops it."""

    def notify(self, notice: Notice) -> bool: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...


def make_notifier(settings: Settings, metrics: Metrics) -> Notifier:
    """The webhook ``ALERT_WEBHOOK_URL`` names, or one that sends nothing."""
    if settings.alert_webhook_url is None:
        return NoWebhook()
    return AlertWebhook(
        settings.alert_webhook_url.get_secret_value(),
        metrics,
        cooldown_s=settings.alert_webhook_cooldown_s,
        runbook_url=settings.alert_runbook_url,
    )
