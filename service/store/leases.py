"""Leases: one holder per role across every process sharing the database.

A lease row names its holder (a replica's name and the process, its incarnation), when
it expires and a fencing token. A process claims the role when the row is missing or
expired, or when its holder is an earlier incarnation of the same replica (a restart:
that process is gone), and renews it while it holds it. Every change of holder
increments the token, so anything the holder writes can carry its token and be refused
once another process has taken over (``retrain_jobs`` records it;
``service.store.jobs.create_fenced_job`` checks it). Time is the database's clock, so
processes on machines whose clocks disagree still agree on expiry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sqlalchemy import Connection, Update, insert, select, text, update

from service.store.tables import cluster_leases

LEADER = "leader"


@dataclass(frozen=True)
class Lease:
    """A role's lease as the database holds it."""

    role: str
    holder: str
    incarnation: str
    token: int
    expires_at: float
    acquired_at: float


@dataclass(frozen=True)
class Claimant:
    """A process asking for a role: its replica's name and its own incarnation."""

    replica: str
    incarnation: str

    def holds(self, lease: Lease) -> bool:
        return lease.holder == self.replica and lease.incarnation == self.incarnation


class NotLeaseHolder(RuntimeError):
    """A write fenced by a token that no longer holds the role."""

    def __init__(self, role: str, token: int | None) -> None:
        super().__init__(f"fencing token {token} does not hold the {role} lease")
        self.role = role
        self.token = token


def database_now(conn: Connection) -> float:
    """Seconds since the epoch on the database's clock."""
    if conn.dialect.name == "postgresql":
        return float(conn.scalar(text("SELECT extract(epoch FROM clock_timestamp())")))
    return float(conn.scalar(text("SELECT (julianday('now') - 2440587.5) * 86400.0")))


def read_lease(conn: Connection, role: str = LEADER, *, lock: bool = False) -> Lease | None:
    """The lease of ``role``, or None if nobody ever held it; ``lock`` keeps the row
    from changing hands until the transaction ends."""
    query = select(cluster_leases).where(cluster_leases.c.role == role)
    if lock:
        query = query.with_for_update()
    row = conn.execute(query).first()
    return None if row is None else Lease(**row._mapping)


def claim_lease(conn: Connection, claimant: Claimant, lease_s: float, role: str = LEADER) -> Lease:
    """Take or renew ``role`` for ``claimant`` if it is free, expired, theirs or their
    replica's earlier incarnation's; returns the lease as it stands afterwards (held by
    someone else when not).

    Run in a transaction of its own: the row is locked from reading to writing, so two
    claimants never both win.
    """
    now = database_now(conn)
    current = read_lease(conn, role, lock=True)
    if current is None:
        lease = Lease(role, claimant.replica, claimant.incarnation, 1, now + lease_s, now)
        conn.execute(insert(cluster_leases).values(**asdict(lease)))
        return lease
    if claimant.holds(current):
        # Ours, even if it lapsed: nobody else took it, so the token still fences.
        conn.execute(_set(role, expires_at=now + lease_s))
        return Lease(**{**asdict(current), "expires_at": now + lease_s})
    if current.expires_at >= now and current.holder != claimant.replica:
        return current
    taken = Lease(
        role, claimant.replica, claimant.incarnation, current.token + 1, now + lease_s, now
    )
    conn.execute(_set(role, **{k: v for k, v in asdict(taken).items() if k != "role"}))
    return taken


def release_lease(conn: Connection, claimant: Claimant, role: str = LEADER) -> None:
    """Let ``role`` go at once (a clean shutdown), so another process need not wait
    for the lease to expire."""
    conn.execute(
        update(cluster_leases)
        .where(
            cluster_leases.c.role == role,
            cluster_leases.c.holder == claimant.replica,
            cluster_leases.c.incarnation == claimant.incarnation,
        )
        .values(expires_at=0.0)
    )


def check_fencing(conn: Connection, token: int | None, role: str = LEADER) -> None:
    """Raise ``NotLeaseHolder`` unless ``token`` is ``role``'s current token; the row
    stays locked until the caller's transaction ends, so no takeover slips between
    this check and the write it guards."""
    current = read_lease(conn, role, lock=True)
    if token is None or current is None or current.token != token:
        raise NotLeaseHolder(role, token)


def _set(role: str, **values: object) -> Update:
    return update(cluster_leases).where(cluster_leases.c.role == role).values(**values)
