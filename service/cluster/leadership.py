"""Leader election through a lease row in the shared database.

Every replica runs one ``Leadership``: it claims the ``leader`` lease when it is free or
expired and renews it every third of ``LEADER_LEASE_S`` while it holds it. The lease's
fencing token grows with every change of holder; the leader starts jobs under it
(``service.store.jobs.create_fenced_job``), so a deposed leader's late start is
refused by the database even before it learns it lost the lease.

A replica that cannot reach the database keeps leading only until its lease would
have run out, then steps down: by then another replica may hold the role.

Ownership: the election thread alone changes the state; listeners run on it, in the
order they were added. Readers (``/healthz``, the metrics) read ``status``.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from service.background import BackgroundLoop
from service.store import Database
from service.store.leases import Claimant, Lease, claim_lease, read_lease, release_lease

log = logging.getLogger(__name__)


class Leadership:
    """This replica's side of the leader election."""

    def __init__(
        self,
        db: Database,
        replica_id: str,
        lease_s: float,
        *,
        candidate: bool = True,
        companion: str | None = None,
    ) -> None:
        self.db = db
        #: Whether this process may lead; one that may not only watches who does.
        self.candidate = candidate
        #: The replica's stream process, which leads for it when this one may not.
        self.companion = companion
        self.replica_id = replica_id
        self.lease_s = lease_s
        #: This process among the replica's incarnations: a restart takes over at once.
        self.claimant = Claimant(replica_id, secrets.token_hex(8))
        #: Called with the fencing token when this replica becomes the leader.
        self.on_elected: list[Callable[[int], None]] = []
        #: Called when it stops being the leader (lost, expired or released).
        self.on_deposed: list[Callable[[], None]] = []
        self._token: int | None = None
        self._seen: Lease | None = None
        self._renewed_at = 0.0
        self._loop = BackgroundLoop("leadership")
        self._round = threading.Lock()

    @property
    def is_leader(self) -> bool:
        return self._token is not None

    def fencing_token(self) -> int | None:
        """The token this replica leads under; None while it follows."""
        return self._token

    def status(self) -> dict[str, Any]:
        """Who leads, as this replica last saw it, for ``/healthz`` and the dashboard."""
        seen = self._seen
        companion_leads = seen is not None and seen.holder == self.companion
        return {
            "replica_id": self.replica_id,
            "leader": self.is_leader or companion_leads,
            # This process itself (not its stream process): what driftline_leader counts.
            "holds_lease": self.is_leader,
            "leader_id": seen.holder if seen else None,
            "fencing_token": seen.token if seen else None,
        }

    # -- the election -------------------------------------------------------------------
    def claim(self) -> bool:
        """One round: claim or renew the lease; returns whether this replica leads."""
        if not self.candidate:
            return self._watch()
        with self._round:
            try:
                with self.db.begin() as conn:
                    lease = claim_lease(conn, self.claimant, self.lease_s)
            except IntegrityError:
                return self.is_leader  # another replica created the row first
            except SQLAlchemyError:
                log.warning("leader lease: database unreachable", exc_info=True)
                if self.is_leader and time.monotonic() - self._renewed_at > self.lease_s:
                    self._step_down("its lease ran out while the database was unreachable")
                return self.is_leader
            self._seen = lease
            if self.claimant.holds(lease):
                self._renewed_at = time.monotonic()
                if self._token != lease.token:
                    self._become_leader(lease.token)
            elif self.is_leader:
                if lease.holder == self.replica_id:
                    log.error(
                        "another process runs as replica %s: give each its own REPLICA_ID",
                        self.replica_id,
                    )
                self._step_down(f"{lease.holder} holds the lease now")
            return self.is_leader

    def _watch(self) -> bool:
        """A process that may not lead only reads the lease, for ``status``."""
        try:
            with self.db.connect() as conn:
                self._seen = read_lease(conn)
        except SQLAlchemyError:
            log.warning("leader lease: database unreachable", exc_info=True)
        return False

    def start(self) -> None:
        """Claim now, then keep claiming on a thread of its own until ``stop``."""
        self.claim()
        self._loop.start(self._run)

    def stop(self, *, release: bool = True) -> None:
        """Stop the election; with ``release`` a leader lets the lease go at once, so
        another replica takes over without waiting for it to expire."""
        self._loop.stop(timeout_s=self.lease_s)
        if release and self.is_leader:
            with self._round:
                try:
                    with self.db.begin() as conn:
                        release_lease(conn, self.claimant)
                except SQLAlchemyError:
                    log.warning("could not release the leader lease; it expires on its own")
                self._step_down("it is shutting down")

    def _run(self) -> None:
        while not self._loop.stopped.wait(self.lease_s / 3):
            self.claim()

    def _become_leader(self, token: int) -> None:
        self._token = token
        log.info("%s leads the cluster (fencing token %d)", self.replica_id, token)
        for listener in self.on_elected:
            try:
                listener(token)
            except Exception:  # a failed listener must not stop the election
                log.exception("a leadership listener failed")

    def _step_down(self, why: str) -> None:
        self._token = None
        log.warning("%s no longer leads: %s", self.replica_id, why)
        for listener in self.on_deposed:
            try:
                listener()
            except Exception:
                log.exception("a leadership listener failed")
