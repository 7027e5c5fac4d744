"""Retraining requests: ``POST /retrain`` on any replica, the job started by the leader.

Only the leader starts jobs. A replica that does not lead (a follower, or a process
that never leads) stores a request (``ask``) and polls it for the answer
(``answer_to``). The leader's ``RetrainRequests`` answers on every tick of its registry
follower, oldest first: the job it started, or a refusal with status 409 when a job
runs already or nothing is stored to train on. After ``ANSWER_WAIT_S`` the asker gives
up (``give_up``) and answers 503; the leader refuses, unstarted, a request older than
that whose asker is gone without giving up (its process stopped).

Ownership: ``RetrainRequests.answer_pending`` runs on the registry follower's thread;
the asking side's functions on any thread, each in a transaction of its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from retrain.lifecycle import JobAlreadyRunning, NothingToTrain
from service.store import Database
from service.store.leases import NotLeaseHolder, database_now
from service.store.requests import (
    CLAIM_LIMIT,
    add_request,
    answer_request,
    claim_unanswered,
    get_request,
)
from service.stream.trigger import RetrainTrigger

log = logging.getLogger(__name__)

#: Seconds an asker waits for the leader's answer before it answers 503.
ANSWER_WAIT_S = 10.0
#: The status codes of the answers: a job started, refused, nobody answered.
STARTED, REFUSED, UNANSWERED = 202, 409, 503
NO_ANSWER = f"no leader answered within {ANSWER_WAIT_S:g} s"


@dataclass(frozen=True)
class RequestAnswer:
    """The answer to a request: ``status`` with the job started, or the refusal."""

    status: int
    job_id: int | None = None
    refusal: str | None = None

    @classmethod
    def of(cls, row: dict[str, Any] | None) -> RequestAnswer | None:
        """The answer ``row`` holds; None while it is unanswered."""
        if row is None or row["answered_at"] is None:
            return None
        return cls(int(row["status"] or UNANSWERED), row["job_id"], row["refusal"])


class RetrainRequests:
    """The leader's side: starts a job for each request other replicas stored."""

    def __init__(self, db: Database, trigger: RetrainTrigger) -> None:
        self.db = db
        self.trigger = trigger

    def answer_pending(self) -> int:
        """Answer the unanswered requests, oldest first, if this replica leads; returns
        how many it answered. Each is claimed and answered in a transaction of its own
        (the job starts in another), so no lock is held while a job is recorded."""
        answered = 0
        for _ in range(CLAIM_LIMIT):
            if not self.trigger.leading():
                break
            with self.db.begin() as conn:
                claimed = claim_unanswered(conn, limit=1)
                if not claimed:
                    break
                request = claimed[0]
                answer = self._answer(request, database_now(conn))
                if answer is None:
                    break  # deposed meanwhile: the next leader answers it
                written = answer_request(
                    conn, request["id"], answer.job_id, answer.refusal, answer.status
                )
                if written:
                    answered += 1
                elif answer.job_id is not None:
                    log.warning(
                        "retraining job %s started for request %s, which its asker gave up on",
                        answer.job_id,
                        request["id"],
                    )
        return answered

    def _answer(self, request: dict[str, Any], now: float) -> RequestAnswer | None:
        if now - request["requested_at"] > ANSWER_WAIT_S:
            return RequestAnswer(UNANSWERED, refusal=NO_ANSWER)
        try:
            job_id = self.trigger.retrain_now(request["trigger"])
        except NotLeaseHolder:
            return None
        except (JobAlreadyRunning, NothingToTrain) as refused:
            return RequestAnswer(REFUSED, refusal=str(refused))
        log.info(
            "retraining job %s started for request %s from %s",
            job_id,
            request["id"],
            request["requested_by"],
        )
        return RequestAnswer(STARTED, job_id=job_id)


# -- the asking side --------------------------------------------------------------------
def ask(db: Database, requested_by: str, trigger: str = "manual") -> int:
    """Ask the leader for a job; returns the request's id."""
    with db.begin() as conn:
        return add_request(conn, requested_by, trigger)


def answer_to(db: Database, request_id: int) -> RequestAnswer | None:
    """The leader's answer to request ``request_id``; None while there is none."""
    with db.connect() as conn:
        return RequestAnswer.of(get_request(conn, request_id))


def give_up(db: Database, request_id: int) -> RequestAnswer:
    """Stop waiting: the request is answered 503 unless the leader answered first, in
    which case that answer stands and is returned."""
    with db.begin() as conn:
        if answer_request(conn, request_id, refusal=NO_ANSWER, status=UNANSWERED):
            return RequestAnswer(UNANSWERED, refusal=NO_ANSWER)
        answer = RequestAnswer.of(get_request(conn, request_id))
    assert answer is not None  # answered: that is why ours was not written
    return answer
