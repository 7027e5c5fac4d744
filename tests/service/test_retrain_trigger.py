"""The retrain trigger asks the policy again when its ask was put off.

A batch that finds a version on its way (a swap running, the registry follower holding
the registry lock for its look, a version in shadow) starts no scheduled job: the job
would build on the version being replaced. The ingest path asks again after the next
batch; when no batch comes, the registry follower's tick must, or a stream that paused
would never get its first model.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from retrain.policies.adwin import AdwinPolicy
from service.stream.trigger import RetrainTrigger


@dataclass
class _Retrainer:
    published: threading.Event = field(default_factory=threading.Event)
    active_job_id: int | None = None
    requested: list[str] = field(default_factory=list)

    def request(self, trigger: str, alert_id: int | None = None, **_: object) -> int:
        self.requested.append(trigger)
        self.active_job_id = len(self.requested)
        return self.active_job_id


@dataclass
class _Learner:
    labelled_seen: int = 0
    labelled_since_swap: int | None = None
    current: object | None = None


class _Registry:
    def versions(self, include_deleted: bool = False) -> list[dict]:
        return []


def _trigger(swapping: list[bool], retrainer: _Retrainer, learner: _Learner) -> RetrainTrigger:
    return RetrainTrigger(
        db=None,  # type: ignore[arg-type]
        registry=_Registry(),  # type: ignore[arg-type]
        policy=AdwinPolicy(bootstrap_events=500),
        retrainer=retrainer,  # type: ignore[arg-type]
        learner=learner,  # type: ignore[arg-type]
        enabled=True,
        drift_preempts_jobs=True,
        swap_in_progress=lambda: swapping[0],
    )


def test_a_bootstrap_put_off_by_a_swap_in_progress_starts_on_the_next_tick() -> None:
    retrainer, learner, swapping = _Retrainer(), _Learner(labelled_seen=1_500), [True]
    trigger = _trigger(swapping, retrainer, learner)
    trigger.after_batch([])  # the stream's only batch, while the follower held the lock
    assert retrainer.requested == []
    trigger.ask_again()  # still on its way: put off again
    assert retrainer.requested == []
    swapping[0] = False
    trigger.ask_again()
    assert retrainer.requested == ["bootstrap"]
    retrainer.active_job_id = None
    trigger.ask_again()  # asked and answered: the tick does not ask twice
    assert retrainer.requested == ["bootstrap"]


def test_the_tick_asks_nothing_when_the_last_ask_was_not_put_off() -> None:
    retrainer, learner, swapping = _Retrainer(), _Learner(labelled_seen=100), [False]
    trigger = _trigger(swapping, retrainer, learner)
    trigger.after_batch([])  # too few events for a first model
    learner.labelled_seen = 1_500  # events the ingest path has not asked about yet
    trigger.ask_again()
    assert retrainer.requested == []
    trigger.after_batch([])
    assert retrainer.requested == ["bootstrap"]


def test_the_tick_leaves_a_running_job_alone_and_asks_once_it_ended() -> None:
    retrainer, learner, swapping = _Retrainer(), _Learner(labelled_seen=1_500), [True]
    trigger = _trigger(swapping, retrainer, learner)
    trigger.after_batch([])
    retrainer.active_job_id = 7  # a job another path started meanwhile
    swapping[0] = False
    trigger.ask_again()
    assert retrainer.requested == []
    retrainer.active_job_id = None
    trigger.ask_again()
    assert retrainer.requested == ["bootstrap"]
