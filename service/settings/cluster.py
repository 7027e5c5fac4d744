"""Cluster settings: who this replica is, how leadership is held, how the log is followed."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ClusterSettings(BaseModel):
    """Replicas that share a database, an object store and a topic form a cluster: each
    applies the event log in order, and one leader runs the drift monitor's writes and
    the retraining trigger (docs/operations.md "Running a cluster")."""

    replica_id: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.:@-]+$",
        description="This replica's name in /healthz, metrics and the leader lease; "
        "default: host name and process id.",
    )
    leader_lease_s: float = Field(
        10.0,
        ge=1.0,
        le=600.0,
        description="How long the leader's lease lasts unless renewed (every third of it): "
        "the longest a dead leader's role waits for another replica.",
    )
    log_poll_s: float = Field(
        0.1,
        gt=0,
        le=10.0,
        description="How often a replica looks for events other replicas stored, to apply "
        "them in log order (read-your-writes across replicas waits about this long).",
    )
    stream_process: bool = Field(
        False,
        description="serve runs the stream role (Kafka consumption, the drift monitor, "
        "the trigger and retraining jobs) in a child process of its own, and the serving "
        "process only folds the event log in, so learning and jobs cannot hold up "
        "/recommend (docs/operations.md).",
    )
    stream_niceness: int = Field(
        10,
        ge=0,
        le=19,
        description="How much lower the stream process's CPU priority is than the serving "
        "process's (Unix niceness; its jobs' workers inherit it).",
    )
    read_wait_max_s: float = Field(
        1.0,
        ge=0,
        le=30.0,
        description="Longest /recommend?after=POSITION waits for this replica to apply "
        "the log up to POSITION before it answers anyway.",
    )
    snapshot_every_events: int | None = Field(
        200_000,
        ge=1,
        description="The leader writes a snapshot of the online state to the object store "
        "every this many events of the log, so a replica that starts replays only the log "
        "after the newest one (none: no snapshots; docs/architecture.md).",
    )
    snapshot_retention: int = Field(
        3,
        ge=1,
        le=1_000,
        description="Newest online-state snapshots kept; older ones are deleted.",
    )
