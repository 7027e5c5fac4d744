"""Alert delivery to a Slack-compatible webhook, off the ingest path.

What raises a notice (a drift alert, a failed job, a job stopped by its budget, a
version the rollout guard held or rolled back) runs on
the ingest path or in a job thread, so ``notify`` only decides and enqueues: a notice
with the same kind and key as one sent within ``cooldown_s`` is suppressed (one drift
alert on a flapping metric pages once, not every heartbeat); others go into a bounded
queue, which drops its oldest notice when full rather than wait. One thread drains the
queue and posts each notice, retried with exponential backoff (tenacity) on connection
errors, timeouts, ``429`` and ``5xx``; a receiver that hangs delays only that thread.

The JSON is Slack's incoming-webhook format (``text`` for notifications and clients
without blocks, ``blocks`` for the message), which Mattermost, Rocket.Chat, Discord's
``/slack`` endpoint and most alert routers accept too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_when_event_set,
    wait_exponential,
)

from service.metrics import Metrics

log = logging.getLogger(__name__)

#: Kinds of notice and the heading each gets.
HEADINGS = {
    "drift": "Drift alert",
    "job_failed": "Retraining job failed",
    "budget": "Retraining budget exhausted",
    "version_held": "Model version held",
    "version_rolled_back": "Model version rolled back",
}


@dataclass(frozen=True)
class Notice:
    """One thing an operator should hear about.

    ``kind`` is a key of ``HEADINGS``; ``key`` what makes two notices of a kind the same
    for de-duplication (the drifting metric and model, the failure's message);
    ``fields`` are shown as label/value pairs, in order.
    """

    kind: str
    key: str
    summary: str
    fields: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in HEADINGS:
            raise ValueError(f"notice kind must be one of {sorted(HEADINGS)}; got {self.kind!r}")


def slack_message(notice: Notice, runbook_url: str | None) -> dict[str, Any]:
    """The Slack-compatible body for ``notice``: ``text`` plus ``blocks``.

    Examples
    --------
    >>> body = slack_message(Notice("budget", "job", "job 3 stopped"), "https://r/b")
    >>> body["text"]
    'Driftline: Retraining budget exhausted: job 3 stopped'
    >>> body["blocks"][-1]["elements"][0]["text"]
    '<https://r/b#budget|Runbook: what to do>'
    """
    heading = HEADINGS[notice.kind]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": f"Driftline: {heading}"}},
        {"type": "section", "text": {"type": "mrkdwn", "text": notice.summary}},
    ]
    if notice.fields:
        shown = [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, v in notice.fields.items()]
        blocks.append({"type": "section", "fields": shown[:10]})  # Slack's limit
    if runbook_url:
        link = f"<{runbook_url}#{notice.kind}|Runbook: what to do>"
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": link}]})
    return {"text": f"Driftline: {heading}: {notice.summary}", "blocks": blocks}


class Undelivered(Exception):
    """The receiver answered with a status worth retrying (``429``, ``5xx``)."""


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, Undelivered | httpx.TransportError)


@dataclass(frozen=True)
class Delivery:
    """How hard to try: attempts per notice, backoff bounds, the request's timeout."""

    attempts: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    timeout_s: float = 10.0
    queue_size: int = 256

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.queue_size < 1 or self.timeout_s <= 0:
            raise ValueError("attempts and queue_size must be at least 1, timeout_s positive")


class AlertWebhook:
    """Posts notices to ``url`` from one background thread (``start``/``stop``)."""

    def __init__(
        self,
        url: str,
        metrics: Metrics,
        *,
        cooldown_s: float = 600.0,
        runbook_url: str | None = None,
        delivery: Delivery | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.metrics = metrics
        self.cooldown_s = cooldown_s
        self.runbook_url = runbook_url
        self.delivery = delivery or Delivery()
        self.clock = clock
        self._queue: deque[Notice] = deque()
        self._announced: dict[tuple[str, str], float] = {}
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the caller's side: never waits on the network ---------------------------
    def notify(self, notice: Notice) -> bool:
        """Queue ``notice`` unless one like it went out within the cooldown; returns
        whether it was queued. O(1) under a lock no network call ever holds."""
        now = self.clock()
        with self._lock:
            seen = self._announced.get((notice.kind, notice.key))
            if seen is not None and now - seen < self.cooldown_s:
                self.metrics.alert_webhook_suppressed.labels(kind=notice.kind).inc()
                return False
            self._forget_before(now - self.cooldown_s)
            self._announced[notice.kind, notice.key] = now
            if len(self._queue) >= self.delivery.queue_size:
                dropped = self._queue.popleft()
                self.metrics.alert_webhook_dropped.labels(kind=dropped.kind).inc()
                log.warning("alert queue full: dropped the oldest %s notice", dropped.kind)
            self._queue.append(notice)
            self._lock.notify()
        return True

    def _forget_before(self, cutoff: float) -> None:
        if len(self._announced) > 1024:  # keep the de-duplication map small
            self._announced = {k: t for k, t in self._announced.items() if t >= cutoff}

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    # -- the sender's side ---------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="alert-webhook", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop after the notice in flight; queued ones are given ``timeout`` to go out."""
        deadline = time.monotonic() + timeout
        while self.pending and time.monotonic() < deadline and self._thread is not None:
            time.sleep(0.05)
        self._stopping.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=max(0.1, deadline - time.monotonic()))
            self._thread = None

    def _run(self) -> None:
        with httpx.Client(timeout=self.delivery.timeout_s) as http:
            while not self._stopping.is_set():
                notice = self._next()
                if notice is not None:
                    self._deliver(http, notice)

    def _next(self) -> Notice | None:
        with self._lock:
            if not self._queue:
                self._lock.wait(timeout=0.5)
            return self._queue.popleft() if self._queue else None

    def _deliver(self, http: httpx.Client, notice: Notice) -> None:
        body = slack_message(notice, self.runbook_url)
        d = self.delivery
        retrying = Retrying(
            stop=stop_after_attempt(d.attempts) | stop_when_event_set(self._stopping),
            wait=wait_exponential(multiplier=d.backoff_s, max=d.backoff_max_s),
            retry=retry_if_exception(_retryable),
            sleep=self._pause,
        )
        try:
            retrying(self._post, http, body)
        except (RetryError, httpx.HTTPError, Undelivered) as exc:
            self.metrics.alert_webhook_failed.labels(kind=notice.kind).inc()
            log.error("could not deliver the %s notice: %s", notice.kind, _reason(exc))
            return
        self.metrics.alert_webhook_sent.labels(kind=notice.kind).inc()

    def _pause(self, seconds: float) -> None:
        """Tenacity's backoff sleep, cut short by ``stop`` so shutdown never waits it out."""
        self._stopping.wait(seconds)

    def _post(self, http: httpx.Client, body: dict[str, Any]) -> None:
        answer = http.post(self.url, json=body)
        if answer.status_code == 429 or answer.status_code >= 500:
            raise Undelivered(f"the webhook answered {answer.status_code}")
        answer.raise_for_status()  # another 4xx: retrying the same body will not help


def _reason(exc: BaseException) -> str:
    """Why a delivery failed, without the URL (a Slack webhook URL is a credential)."""
    if isinstance(exc, RetryError):
        last = exc.last_attempt.exception()
        return f"gave up after {exc.last_attempt.attempt_number} attempts: " + (
            _reason(last) if last is not None else "no answer"
        )
    if isinstance(exc, httpx.HTTPStatusError):
        return f"the webhook answered {exc.response.status_code}"
    if isinstance(exc, Undelivered):
        return str(exc)
    return type(exc).__name__


class NoWebhook:
    """Where no ``ALERT_WEBHOOK_URL`` is set: notices are dropped here, silently."""

    def notify(self, notice: Notice) -> bool:
        return False

    def start(self) -> None:
        pass

    def stop(self, timeout: float = 5.0) -> None:
        pass
