"""Abuse limits: token buckets per key, and a per-key cap on events per item.

* ``INGEST_RATE_EVENTS`` / ``RECOMMEND_RATE``: a token bucket per principal (the key's
  name, or the client's address while the service is open) refills at the rate and
  holds at most the burst; a request that needs more tokens than are left is answered
  429 with ``Retry-After``, the seconds until enough have refilled.
* ``INGEST_ITEM_CAP``: at most that many events per key per item in each window of
  ``INGEST_ITEM_WINDOW_SECONDS``. Fold-in learns item biases from every event, so a
  client inventing a dozen users who rate one item 5.0 could otherwise put it at the
  top of many users' lists; the cap bounds what any one key can do to one item. Keys
  with ``admin`` (an operator's bulk load) are not capped, nor is Kafka ingestion
  (producers there are the operator's own infrastructure).

Counts live in this process (one ``serve``): a limit is per replica, not global.
Everything here is off unless configured.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from fastapi import HTTPException, Request

from service.settings import Settings

#: Most principals whose bucket is kept; the least recently seen are forgotten (a
#: forgotten one starts again with a full bucket).
MAX_BUCKETS = 10_000


class Limited(HTTPException):
    """A 429 with ``Retry-After``; ``reason`` labels ``driftline_ingest_rejected``."""

    def __init__(self, detail: str, retry_after: float, reason: str) -> None:
        seconds = str(max(1, math.ceil(retry_after)))
        super().__init__(429, detail, headers={"Retry-After": seconds})
        self.reason = reason


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimit:
    """Token buckets per principal.

    Parameters
    ----------
    rate
        Tokens added per second.
    burst
        Most tokens a bucket holds: what a principal may spend at once.
    unit
        What a token is, for the refusal's wording ("events", "requests").

    Examples
    --------
    >>> limit = RateLimit(rate=10, burst=20, unit="events")
    >>> limit.take("k", 20, now=0.0)
    >>> try:
    ...     limit.take("k", 5, now=0.1)
    ... except Limited as exc:
    ...     print(exc.status_code, exc.headers["Retry-After"])
    429 1
    """

    def __init__(self, rate: float, burst: float, unit: str) -> None:
        self.rate = rate
        self.burst = burst
        self.unit = unit
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, principal: str, amount: float, now: float | None = None) -> None:
        """Spend ``amount`` tokens of ``principal``'s bucket, or raise Limited."""
        now = time.monotonic() if now is None else now
        with self._lock:
            bucket = self._buckets.pop(principal, None) or _Bucket(self.burst, now)
            self._buckets[principal] = bucket
            if len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
            bucket.at = now
            if amount <= bucket.tokens:
                bucket.tokens -= amount
                return
            wait = (min(amount, self.burst) - bucket.tokens) / self.rate
        raise Limited(
            f"over the limit of {self.rate:g} {self.unit}/s (burst {self.burst:g}) for {principal}",
            wait,
            "rate_limited",
        )


class ItemCap:
    """At most ``cap`` events per principal per item in each fixed window.

    Examples
    --------
    >>> cap = ItemCap(cap=3, window_seconds=60)
    >>> cap.take("k", ["a", "a", "b"], now=0.0)
    >>> try:
    ...     cap.take("k", ["a", "a"], now=1.0)
    ... except Limited as exc:
    ...     print(exc.detail)
    at most 3 events per item per 60 s for k; over it: a
    >>> cap.take("k", ["a", "a"], now=61.0)  # a new window
    """

    def __init__(self, cap: int, window_seconds: float) -> None:
        self.cap = cap
        self.window_seconds = window_seconds
        self._window = -1
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def take(self, principal: str, item_ids: Iterable[str], now: float | None = None) -> None:
        """Count the events of a batch, all or none; Limited naming the items over cap."""
        now = time.time() if now is None else now
        window = int(now // self.window_seconds)
        batch = Counter(item_ids)
        with self._lock:
            if window != self._window:
                self._window, self._counts = window, Counter()
            over = [
                item for item, n in batch.items() if self._counts[principal, item] + n > self.cap
            ]
            if not over:
                for item, n in batch.items():
                    self._counts[principal, item] += n
                return
        shown = ", ".join(sorted(over)[:5]) + (" …" if len(over) > 5 else "")
        raise Limited(
            f"at most {self.cap} events per item per {self.window_seconds:g} s for "
            f"{principal}; over it: {shown}",
            (window + 1) * self.window_seconds - now,
            "item_cap",
        )

    def give_back(self, principal: str, item_ids: Iterable[str]) -> None:
        """Return a batch's counts (it was not stored after all)."""
        with self._lock:
            for item, n in Counter(item_ids).items():
                key = (principal, item)
                self._counts[key] = max(0, self._counts[key] - n)


@dataclass(frozen=True)
class Limits:
    """The app's limits (``app.state.limits``); None where a limit is off."""

    ingest: RateLimit | None
    recommend: RateLimit | None
    item_cap: ItemCap | None


def limits_from(settings: Settings) -> Limits:
    """The limits the settings switch on.

    The ingest burst is at least ``MAX_BATCH_EVENTS``, so every batch the service
    accepts at all can pass once its tokens have refilled.
    """
    ingest = recommend = None
    if settings.ingest_rate_events is not None:
        rate = settings.ingest_rate_events
        burst = settings.ingest_burst_events or max(rate, settings.max_batch_events)
        ingest = RateLimit(rate, burst, "events")
    if settings.recommend_rate is not None:
        rate = settings.recommend_rate
        recommend = RateLimit(rate, settings.recommend_burst or max(rate, 1.0), "requests")
    cap = None
    if settings.ingest_item_cap is not None:
        cap = ItemCap(settings.ingest_item_cap, settings.ingest_item_window_seconds)
    return Limits(ingest, recommend, cap)


async def limit_recommend(request: Request) -> None:
    """``GET /recommend``'s request rate, per principal (a route dependency)."""
    limit = request.app.state.limits.recommend
    if limit is not None:
        limit.take(request.state.principal.name, 1)
