"""One policy on one runtime over one scenario, in virtual time.

The loop ticks once per virtual second: the events due by then arrive and are counted
by the policy (``observe_events``, weighted by the true arrivals they stand for); the
job that finished swaps its model in and the policy hears its duration
(``observe_job``); under a drift detector, the serving model's errors go to it in
heartbeats as in the service; and while no job runs, the policy may start one over the
events since the last job's window (plus a history sample, by the service's window
rule: :meth:`JobModel.history_for`). Only one job runs
at a time and a model serves only from the moment its job completes, so a slow runtime
costs accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from benchmarks.policy_eval.ladder import Ladder
from benchmarks.policy_eval.runtimes import JobModel, JobRuntime
from drift import DriftDetector
from drift.heartbeat import Heartbeat
from retrain.policies import TriggerPolicy

#: Triggers after which the detector starts afresh (as ``NEW_REGIME_TRIGGERS`` in the
#: service); a scheduled swap keeps its reference.
NEW_REGIME = frozenset({"drift", "bootstrap"})
HEARTBEAT_EVENTS = 500


@dataclass(frozen=True)
class Scenario:
    """One trace and seed: when each event arrives, what it stands for, the ladder."""

    times: np.ndarray
    weight: float
    horizon_s: int
    ladder: Ladder
    onsets_s: tuple[float, ...]
    rates: np.ndarray
    #: Each event's 16-bit user key (n, uint16), which the heartbeats carry as the
    #: service's do; None where an event stands for many arrivals and so no one user.
    user_keys: np.ndarray | None = None

    @property
    def start_s(self) -> float:
        """When the bootstrap model serves: once its training events have arrived."""
        return float(self.times[self.ladder.bootstrap])


@dataclass(frozen=True)
class Job:
    start_s: float
    finish_s: float
    data_end: int
    samples: float
    cost_usd: float
    trigger: str


@dataclass
class Run:
    """What one replay produced: every job, the swaps (time, data end) and the bill."""

    jobs: list[Job] = field(default_factory=list)
    swap_times: list[float] = field(default_factory=list)
    swap_data_ends: list[int] = field(default_factory=list)
    cost_usd: float = 0.0


class _Monitor:
    """Feeds the serving model's errors to a detector in heartbeats, as the service does
    (with each event's user key where the scenario has them)."""

    def __init__(self, detector: DriftDetector, keys: np.ndarray | None) -> None:
        self.detector = detector
        self.keys = keys
        self.pending: list[np.ndarray] = []
        self.count = 0
        self.index = 0
        self.seen = 0
        self.first = -1  # the event of the first pending error

    def feed(self, errors: np.ndarray, first: int) -> bool:
        """Take the errors of events ``first`` to ``first + errors.size - 1``."""
        if self.count == 0:
            self.first = first
        self.pending.append(errors)
        self.count += errors.size
        alerted = False
        while self.count >= HEARTBEAT_EVENTS:
            joined = np.concatenate(self.pending)
            beat, rest = joined[:HEARTBEAT_EVENTS], joined[HEARTBEAT_EVENTS:]
            self.pending, self.count = [rest], rest.size
            self.seen += beat.size
            keys = np.empty(0, dtype=np.uint16)
            if self.keys is not None:
                keys = self.keys[self.first : self.first + beat.size]
            self.first += beat.size
            heartbeat = Heartbeat(
                self.index, beat.size, self.seen, float(np.sqrt(beat.mean())), beat, keys
            )
            self.index += 1
            alerted = self.detector.update(heartbeat) is not None or alerted
        return alerted


def replay(
    scenario: Scenario,
    policy: TriggerPolicy,
    runtime: JobRuntime,
    detector: DriftDetector | None = None,
    jobs: JobModel | None = None,
) -> Run:
    """Replay ``policy`` on ``runtime`` over ``scenario``; see the module docstring.
    ``jobs`` sets how much history a job adds (the default job model's, if None)."""
    jobs = jobs or JobModel()
    ladder, times, weight = scenario.ladder, scenario.times, scenario.weight
    monitor = None if detector is None else _Monitor(detector, scenario.user_keys)
    run = Run(swap_times=[scenario.start_s], swap_data_ends=[ladder.bootstrap])
    arrived = last_end = ladder.bootstrap
    seen_at_swap, rung = arrived, 0
    running: Job | None = None
    alert = False
    for now in range(int(np.ceil(scenario.start_s)), scenario.horizon_s + 1):
        due = int(np.searchsorted(times, now, side="right"))
        if running is not None and running.finish_s <= now:
            run.swap_times.append(running.finish_s)
            run.swap_data_ends.append(running.data_end)
            rung = ladder.rung(running.data_end)
            seen_at_swap = int(np.searchsorted(times, running.finish_s, side="right"))
            policy.observe_job(running.samples, running.finish_s - running.start_s)
            if monitor is not None:
                monitor.detector.on_swap(running.trigger not in NEW_REGIME)
            running = None
        policy.observe_events((due - arrived) * weight, float(now))
        if monitor is not None and due > arrived:
            alert = monitor.feed(ladder.errors[rung, arrived:due], arrived) or alert
        arrived = due
        if running is not None:
            continue
        trigger = policy.on_alert() if alert else None
        alert = False
        if trigger is None:
            since = int((arrived - seen_at_swap) * weight)
            trigger = policy.on_progress(int(arrived * weight), since)
        if trigger is None or arrived <= last_end:
            continue
        window = (arrived - last_end) * weight
        samples = window + jobs.history_for(trigger, window, last_end * weight)
        outcome = runtime.run(float(now), samples, trigger)
        running = Job(float(now), outcome.finish_s, arrived, samples, outcome.cost_usd, trigger)
        run.jobs.append(running)
        run.cost_usd += outcome.cost_usd
        last_end = arrived
    run.cost_usd += runtime.standing_cost()
    return run
