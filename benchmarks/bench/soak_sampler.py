"""The soak's sampler: resident memory of each process of a ``LocalCluster``, the size
of its PostgreSQL schema and of its bucket, and the events stored, every few seconds.

Resident memory is ``VmRSS`` from ``/proc`` (no psutil needed): a replica's with its
children's (the configurator's process, a job's workers), HAProxy's, the broker's and
this process's, which holds moto's server and the producer. The schema's size is
``pg_total_relation_size`` (heap, indexes, TOAST) summed over its tables; the bucket's is
its objects' sizes by kind: archived event partitions, online-state snapshots, and the
rest (model artifacts). Where the server runs without autovacuum (a test server may),
the sampler vacuums the schema's tables itself every ``vacuum_s``, as autovacuum would:
otherwise no deleted row's space is ever reused and the size measures the setting.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, text

from benchmarks.cluster import S3_BUCKET, S3_CREDENTIALS, LocalCluster

__all__ = ["Sampler", "stored_events"]


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process under it (from /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(parents.get(current, []))
    return out


def _processes(cluster: LocalCluster) -> dict[str, tuple[int, bool]]:
    """Name -> (pid, whether its children count too)."""
    out = {}
    for i, replica in enumerate(cluster.replicas):
        if replica.process is not None:
            out[cluster.name(i)] = (replica.process.pid, True)
    if cluster.haproxy is not None and cluster.haproxy.process is not None:
        out["haproxy"] = (cluster.haproxy.process.pid, False)
    if cluster.broker is not None and cluster.broker.process is not None:
        out["broker"] = (cluster.broker.process.pid, False)
    out["bench"] = (os.getpid(), False)
    return out


_DB_SIZE = text(
    "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND c.relkind = 'r'"
)


def _store_sizes(s3: Any) -> dict[str, int]:
    """The bucket's bytes by kind of object: archived events, snapshots, the rest."""
    sizes = {"archive": 0, "snapshots": 0, "models": 0}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET):
        for item in page.get("Contents", []):
            key = item["Key"]
            kind = "archive" if "/events/archive/" in key else "models"
            kind = "snapshots" if "/snapshots/" in key else kind
            sizes[kind] += int(item["Size"])
    return sizes


class Sampler:
    """Samples the cluster every ``interval`` seconds on a thread of its own."""

    def __init__(
        self, cluster: LocalCluster, engine: Engine, interval: float, vacuum_s: float
    ) -> None:
        import boto3

        self.cluster, self.engine, self.interval = cluster, engine, interval
        with engine.connect() as conn:
            self.autovacuum = str(conn.scalar(text("SHOW autovacuum")))
        #: Seconds between the sampler's own VACUUMs of the schema (None: none).
        self.vacuum_s = vacuum_s if self.autovacuum != "on" else None
        self.vacuums = 0
        self._vacuumed = time.monotonic()
        self.s3 = boto3.client(
            "s3",
            endpoint_url=cluster.s3_endpoint,
            aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=S3_CREDENTIALS["AWS_REGION"],
        )
        self.samples: list[dict[str, Any]] = []
        self.tables: dict[str, int] = {}
        self.produced: Callable[[], int] = lambda: 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)

    def sample(self) -> dict[str, Any]:
        with self.engine.connect() as conn:
            tables = {str(name): int(size) for name, size in conn.execute(_DB_SIZE)}
            rows = int(conn.scalar(text("SELECT count(*) FROM events")) or 0)
            stored = stored_events(conn)
        self.tables = tables
        rss = {
            name: sum(_rss_bytes(p) for p in (_descendants(pid) if tree else [pid]))
            for name, (pid, tree) in _processes(self.cluster).items()
        }
        row = {
            "t": time.time(),
            "produced": self.produced(),
            "stored": stored,
            "db_bytes": sum(tables.values()),
            "db_event_rows": rows,
            **{f"store_{k}_bytes": v for k, v in _store_sizes(self.s3).items()},
            **{f"rss_{name}": value for name, value in rss.items()},
        }
        self.samples.append(row)
        return row

    def vacuum(self) -> None:
        """``VACUUM`` every table of the schema: what autovacuum would do, where the
        server runs without it, so that deleted rows' space is reused."""
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            for name in list(conn.execute(_DB_SIZE).scalars()):
                conn.execute(text(f'VACUUM "{name}"'))
        self.vacuums += 1
        self._vacuumed = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                due = self.vacuum_s is not None
                if due and time.monotonic() - self._vacuumed >= (self.vacuum_s or 0):
                    self.vacuum()
                self.sample()
            except Exception as exc:  # a missed sample is not worth ending the run
                print(f"soak: sample failed: {exc!r}", flush=True)

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.sample()


def stored_events(conn: Connection) -> int:
    """Events stored, archived or not: the archive's and the table's past its boundary."""
    archived, boundary = conn.execute(
        text("SELECT coalesce(sum(events), 0), coalesce(max(last_id), 0) FROM event_archives")
    ).one()
    table = conn.scalar(text("SELECT count(*) FROM events WHERE id > :b"), {"b": boundary})
    return int(archived) + int(table or 0)
