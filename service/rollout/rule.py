"""The guard's rule: when a version in shadow is promoted or held, and when a watch
rolls back (docs/decisions/0010-guarded-rollout.md).

A comparison is new minus old on the same events (``service.rollout.paired``). With
``c`` = ``SHADOW_CONFIDENCE``, ``tol`` = ``SHADOW_TOLERANCE`` (relative RMSE) and
``margin`` = ``SHADOW_RANKING_TOLERANCE`` times the old version's hit-rate@10:

* **clearly worse**: the RMSE interval lies above ``+tol``, or the hit-rate interval
  below ``-margin``;
* **not worse**: the RMSE interval's top is at most ``+tol``, the version is not clearly
  worse on hit-rate, and its hit-rate estimate is no lower than ``-margin`` unless its
  RMSE interval lies below zero (the ranking sample is too small to prove a hit-rate
  not worse within a shadow, so its estimate must at least be, for a version that is
  not clearly better on RMSE);
* **clearly better**: not worse, with the RMSE interval below zero.

A shadow decides at each batch once it has compared ``SHADOW_EARLY_EVENTS``: held when
clearly worse; a drift job's version promoted when clearly better; any version
promoted when not worse once it has compared ``SHADOW_MIN_EVENTS``. With
``SHADOW_EVENTS`` set, it decides once, at that many. A shadow still undecided at
``SHADOW_MAX_EVENTS`` or ``SHADOW_MAX_S`` gets ``SHADOW_TIMEOUT_RULE``: ``estimate``
promotes it when its estimates are within the tolerances (the hit-rate's, unless its
RMSE estimate is lower than the serving one's) and holds it otherwise. A
watch rolls back when the promoted version is clearly worse than the one it replaced,
and keeps it after ``WATCH_EVENTS``.

Each look is a test at ``c``; looking at every batch makes the rule readier to act on
noise than one test would be, which the tolerance (not zero) and the minimum lengths
pay for.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from service.rollout.paired import Interval, PairedComparison
from service.settings import Settings

#: ``served``: someone rolled back to the version in shadow, which serves by their hand.
Decision = Literal["promote", "hold", "keep", "roll_back", "served"]


@dataclass(frozen=True)
class GuardOptions:
    """The rollout settings (``GUARD_*``, ``SHADOW_*``, ``WATCH_EVENTS``)."""

    enabled: bool = True
    observe_only: bool = False
    shadow_events: int | None = None
    min_events: int = 2_000
    early_events: int = 500
    max_events: int = 10_000
    max_s: float = 3_600.0
    tolerance: float = 0.005
    ranking_tolerance: float = 0.05
    confidence: float = 0.95
    timeout_rule: Literal["estimate", "promote", "hold"] = "estimate"
    watch_events: int = 5_000

    def __post_init__(self) -> None:
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")
        if self.early_events > self.min_events:
            raise ValueError("early_events must not exceed min_events")

    @classmethod
    def of(cls, settings: Settings) -> GuardOptions:
        return cls(
            enabled=settings.guard_enabled,
            observe_only=settings.guard_observe_only,
            shadow_events=settings.shadow_events,
            min_events=settings.shadow_min_events,
            early_events=min(settings.shadow_early_events, settings.shadow_min_events),
            max_events=settings.shadow_max_events,
            max_s=settings.shadow_max_s,
            tolerance=settings.shadow_tolerance,
            ranking_tolerance=settings.shadow_ranking_tolerance,
            confidence=settings.shadow_confidence,
            timeout_rule=settings.shadow_timeout_rule,
            watch_events=settings.watch_events,
        )


@dataclass(frozen=True)
class Verdict:
    """What the rule decided and why, in words an operator reads."""

    decision: Decision
    reason: str


@dataclass(frozen=True)
class _Reading:
    """One look at a comparison: its intervals and where they stand."""

    rmse: Interval
    hit: Interval | None
    margin: float
    tolerance: float

    @classmethod
    def of(cls, pair: PairedComparison, options: GuardOptions) -> _Reading:
        ranked = pair.ranked_events > 0
        old_hit = pair.old_hit_rate if ranked else 0.0
        return cls(
            pair.rmse_diff(options.confidence),
            pair.hit_rate_diff(options.confidence) if ranked else None,
            options.ranking_tolerance * (old_hit if math.isfinite(old_hit) else 0.0),
            options.tolerance,
        )

    @property
    def clearly_worse(self) -> bool:
        return bool(self.worse_on)

    @property
    def worse_on(self) -> str:
        """The measures on which the new version is clearly worse, in words ('' none)."""
        measures = []
        if self.rmse.low > self.tolerance:
            measures.append("RMSE")
        if self.hit is not None and self.hit.high < -self.margin:
            measures.append("hit-rate@10")
        return " and ".join(measures)

    @property
    def not_worse(self) -> bool:
        hit_ok = self.hit is None or self.hit.estimate >= -self.margin or self.rmse.high < 0
        return self.rmse.high <= self.tolerance and hit_ok and not self.clearly_worse

    @property
    def clearly_better(self) -> bool:
        return self.not_worse and self.rmse.high < 0

    @property
    def within_tolerances(self) -> bool:
        hit_ok = self.hit is None or self.hit.estimate >= -self.margin or self.rmse.estimate < 0
        return self.rmse.estimate <= self.tolerance and hit_ok

    def describe(self) -> str:
        text = f"RMSE {_interval(self.rmse)}"
        if self.hit is not None:
            text += f", hit-rate@10 {_interval(self.hit, relative=False)}"
        return text

    def over(self, events: int) -> Callable[[], str]:
        """The reading in words, written only when a decision needs it."""
        return lambda: f"{self.describe()} over {events:,} events"


def judge_shadow(
    pair: PairedComparison, options: GuardOptions, *, drift: bool, elapsed_s: float
) -> Verdict | None:
    """A candidate's fate after the events ``pair`` holds, or None to go on comparing."""
    events = pair.events
    cap = options.shadow_events or options.max_events
    timed_out = events >= cap or elapsed_s >= options.max_s
    first = options.shadow_events or options.early_events
    if events < first and not timed_out:
        return None
    reading = _Reading.of(pair, options)
    said = reading.over(events)
    if reading.clearly_worse:
        return Verdict("hold", f"worse on {reading.worse_on} than the serving version: {said()}")
    if drift and reading.clearly_better:
        return Verdict("promote", f"a drift version clearly better: {said()}")
    if events >= (options.shadow_events or options.min_events) and reading.not_worse:
        return Verdict("promote", f"not worse than the serving version: {said()}")
    if not timed_out:
        return None
    why = f"undecided after {events:,} events" if events >= cap else "undecided in time"
    rule = options.timeout_rule
    if rule == "estimate":
        rule = "promote" if reading.within_tolerances else "hold"
    return Verdict(rule, f"{why} ({options.timeout_rule} rule): {reading.describe()}")


def judge_watch(pair: PairedComparison, options: GuardOptions) -> Verdict | None:
    """A promoted version's fate against the one it replaced, or None to go on."""
    events = pair.events
    if events < min(options.early_events, options.watch_events):
        return None
    reading = _Reading.of(pair, options)
    said = reading.over(events)
    if reading.clearly_worse:
        return Verdict(
            "roll_back", f"the previous version does clearly better on {reading.worse_on}: {said()}"
        )
    if events >= options.watch_events:
        return Verdict("keep", f"not clearly worse than the previous version: {said()}")
    return None


def _interval(interval: Interval, *, relative: bool = True) -> str:
    """``+0.4 % [-0.2 %, +1.0 %]`` (relative) or ``-0.003 [-0.010, +0.004]``."""

    def shown(value: float) -> str:
        if not math.isfinite(value):
            return "∞" if value > 0 else "-∞"
        return f"{value * 100:+.1f} %" if relative else f"{value:+.3f}"

    return f"{shown(interval.estimate)} [{shown(interval.low)}, {shown(interval.high)}]"
