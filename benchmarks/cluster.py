"""A Driftline cluster on one machine, for real: what the end-to-end tests and the
cluster benchmark run.

``LocalCluster`` starts a PostgreSQL schema of its own, moto's S3 server, the embedded
Kafka-protocol broker, N ``driftline serve`` replicas (``replica-0`` .. ``replica-N-1``,
the same settings otherwise) and HAProxy in front of them, configured like
``deploy/haproxy/haproxy.cfg`` (hashed on ``user_id``, health checks on ``/healthz``,
retries on a replica going away) with its runtime API on a Unix socket for draining.
Every process it started is killed when the ``with`` block ends, however it ends.

    with LocalCluster(ClusterConfig(database_url=URL, work_dir=path)) as cluster:
        httpx.post(f"{cluster.lb_url}/ingest", json={"events": [...]})
        cluster.kill(cluster.leader())
        cluster.rolling_restart()
"""

from __future__ import annotations

import atexit
import logging
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from benchmarks.broker import EmbeddedBroker
from benchmarks.launcher import ServerProcess, free_port, stop_process

log = logging.getLogger(__name__)

HAPROXY = "haproxy"
S3_BUCKET = "driftline"
#: Credentials moto accepts; nothing outside the cluster sees them.
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "driftline",
    "AWS_SECRET_ACCESS_KEY": "driftline-local",
    "AWS_REGION": "us-east-1",
}
#: What every replica runs with unless ``ClusterConfig.env`` says otherwise: small
#: heartbeats and bootstrap so a test-sized stream drifts, alerts and retrains, jobs in
#: the serving process (nothing outlives a killed replica), every replica's host trusted.
REPLICA_ENV = {
    "DRIFTLINE_RETRAIN_RUNTIME": "inprocess",
    "DRIFTLINE_HEARTBEAT_EVENTS": "25",
    "DRIFTLINE_BOOTSTRAP_EVENTS": "1000",
    "DRIFTLINE_REFRESH_EVENTS": "none",
    "DRIFTLINE_FACTORS": "8",
    "DRIFTLINE_MAX_EPOCHS": "15",
    "DRIFTLINE_LATENCY_CAP_SECONDS": "20",
    "DRIFTLINE_REGISTRY_POLL_SECONDS": "1",
    "DRIFTLINE_TRUSTED_HOSTS": "127.0.0.1,localhost,::1",
}


@dataclass
class ClusterConfig:
    """Everything a ``LocalCluster`` is started with, in one place."""

    #: A PostgreSQL database URL; the cluster creates a schema of its own in it and
    #: drops it at the end (unless ``keep_schema``).
    database_url: str
    #: Where logs, data directories and the HAProxy config go.
    work_dir: Path
    replicas: int = 3
    partitions: int = 4
    topic: str = "events"
    leader_lease_s: float = 3.0
    kafka_session_timeout_ms: int = 6_000
    log_poll_s: float = 0.1
    #: HAProxy's health-check interval (ms): a replica that stopped answering leaves the
    #: ring after ``fall`` failed checks and comes back after ``rise`` good ones.
    check_inter_ms: int = 500
    check_fall: int = 2
    check_rise: int = 2
    #: Settings for every replica, over ``REPLICA_ENV``.
    env: dict[str, str] = field(default_factory=dict)
    keep_schema: bool = False
    start_timeout_s: float = 120.0


def haproxy_available() -> bool:
    return shutil.which(HAPROXY) is not None or Path("/usr/sbin/haproxy").exists()


def _haproxy_binary() -> str:
    return shutil.which(HAPROXY) or "/usr/sbin/haproxy"


def haproxy_config(
    port: int,
    servers: list[tuple[str, int]],
    socket_path: Path,
    *,
    check_inter_ms: int = 500,
    fall: int = 2,
    rise: int = 2,
) -> str:
    """deploy/haproxy/haproxy.cfg on loopback ports: the same routing, checks and
    retries; no DNS resolvers; a runtime API socket for draining."""
    lines = [
        "global",
        "    log stdout format raw local0 info",
        "    maxconn 4096",
        "    tune.bufsize 262144",
        f"    stats socket {socket_path} mode 600 level admin",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option dontlognull",
        "    option http-keep-alive",
        "    option forwardfor",
        "    timeout connect 2s",
        "    timeout client 60s",
        "    timeout server 30s",
        "    timeout http-request 10s",
        "    timeout http-keep-alive 10s",
        "    timeout queue 10s",
        "    timeout check 2s",
        "    retries 3",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response response-timeout 503",
        "    option http-buffer-request",
        "",
        "frontend driftline",
        f"    bind 127.0.0.1:{port}",
        "    default_backend driftline",
        "",
        "backend driftline",
        "    balance url_param user_id",
        "    hash-type consistent",
        "    option httpchk",
        "    http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host localhost",
        "    http-check expect status 200",
        f"    default-server check inter {check_inter_ms} fall {fall} rise {rise}",
    ]
    lines += [f"    server {name} 127.0.0.1:{server_port}" for name, server_port in servers]
    return "\n".join(lines) + "\n"


class HAProxyProcess:
    """HAProxy in the foreground with a generated config, and its runtime API."""

    def __init__(self, config: str, work_dir: Path, socket_path: Path) -> None:
        self.config_path = work_dir / "haproxy.cfg"
        self.log_path = work_dir / "haproxy.log"
        self.socket_path = socket_path
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> HAProxyProcess:
        self.config_path.write_text(self.config)
        binary = _haproxy_binary()
        check = subprocess.run(
            [binary, "-c", "-q", "-f", str(self.config_path)], capture_output=True, text=True
        )
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused its config: {check.stdout}{check.stderr}")
        with self.log_path.open("ab") as output:
            self.process = subprocess.Popen(
                [binary, "-db", "-f", str(self.config_path)],
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 10
        while not self.socket_path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not start; see {self.log_path}")
            time.sleep(0.05)
        return self

    def command(self, line: str) -> str:
        """One runtime API command (``show stat``, ``set server b/s state maint``, ...)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def servers(self, backend: str = "driftline") -> dict[str, dict[str, str]]:
        """``show stat`` for ``backend``'s servers: name -> the CSV columns."""
        rows = [row for row in self.command("show stat").splitlines() if row]
        header = rows[0].lstrip("# ").split(",")
        table = [dict(zip(header, row.split(","), strict=False)) for row in rows[1:]]
        return {
            row["svname"]: row
            for row in table
            if row.get("pxname") == backend and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def stop(self) -> None:
        stop_process(self.process, wait_s=10)


class _MotoS3:
    """moto's S3 server on a free loopback port, with the models bucket."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.endpoint = ""

    def start(self) -> _MotoS3:
        import boto3

        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=S3_CREDENTIALS["AWS_REGION"],
        )
        s3.create_bucket(Bucket=S3_BUCKET)
        return self

    def stop(self) -> None:
        self.server.stop()


def create_schema(base_url: str) -> tuple[str, Callable[[], None]]:
    """A fresh schema in ``base_url``'s PostgreSQL database: the URL selecting it (its
    connections' ``search_path``) and a function that drops it."""
    parsed = make_url(base_url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"a cluster needs a PostgreSQL database, not {parsed.render_as_string()}")
    schema = f"cluster_{uuid.uuid4().hex[:12]}"
    admin = create_engine(parsed, poolclass=NullPool)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = parsed.update_query_dict({"options": f"-csearch_path={schema}"})

    def drop() -> None:
        try:
            with admin.begin() as conn:
                conn.execute(text("SET LOCAL lock_timeout = '30s'"))
                conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        finally:
            admin.dispose()

    return url.render_as_string(hide_password=False), drop


class LocalCluster:
    """N ``driftline serve`` replicas behind HAProxy, sharing PostgreSQL, S3 and Kafka.

    Use as a context manager; every process is killed on exit. Replica ``i`` is named
    ``replica-i`` (``DRIFTLINE_REPLICA_ID``) and keeps its port and data directory
    across restarts.
    """

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.work_dir = config.work_dir
        self.database_url = ""
        self.s3_endpoint = ""
        self.broker: EmbeddedBroker | None = None
        self.haproxy: HAProxyProcess | None = None
        self.replicas: list[ServerProcess] = []
        self.lb_port = free_port()
        self._stack = ExitStack()
        self._http = httpx.Client(timeout=5)

    # -- addresses -----------------------------------------------------------------------
    @property
    def lb_url(self) -> str:
        return f"http://127.0.0.1:{self.lb_port}"

    @property
    def replica_urls(self) -> list[str]:
        return [replica.url for replica in self.replicas]

    @property
    def bootstrap(self) -> str:
        assert self.broker is not None
        return self.broker.bootstrap

    @property
    def topic(self) -> str:
        return self.config.topic

    def name(self, i: int) -> str:
        return f"replica-{i}"

    def replica_env(self, i: int) -> dict[str, str]:
        """Replica ``i``'s settings (those of every replica but its name)."""
        return {
            **REPLICA_ENV,
            **S3_CREDENTIALS,
            "DRIFTLINE_DATABASE_URL": self.database_url,
            "DRIFTLINE_OBJECT_STORE_URL": f"s3://{S3_BUCKET}/models",
            "DRIFTLINE_S3_ENDPOINT_URL": self.s3_endpoint,
            "DRIFTLINE_KAFKA_BOOTSTRAP": self.bootstrap,
            "DRIFTLINE_KAFKA_TOPIC": self.config.topic,
            "DRIFTLINE_KAFKA_SESSION_TIMEOUT_MS": str(self.config.kafka_session_timeout_ms),
            "DRIFTLINE_LEADER_LEASE_S": str(self.config.leader_lease_s),
            "DRIFTLINE_LOG_POLL_S": str(self.config.log_poll_s),
            **self.config.env,
            "DRIFTLINE_REPLICA_ID": self.name(i),
        }

    # -- life cycle ----------------------------------------------------------------------
    def start_all(self) -> LocalCluster:
        atexit.register(self.close)
        try:
            self._start_all()
        except BaseException:
            self.close()
            raise
        return self

    def _start_all(self) -> None:
        config = self.config
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.database_url, drop = create_schema(config.database_url)
        if not config.keep_schema:
            self._stack.callback(drop)
        self._migrate()
        s3 = _MotoS3().start()
        self._stack.callback(s3.stop)
        self.s3_endpoint = s3.endpoint
        self.broker = EmbeddedBroker(
            port=free_port(),
            topic=config.topic,
            partitions=config.partitions,
            log_path=self.work_dir / "broker.log",
        )
        self._stack.callback(self.broker.stop)
        self.broker.start()
        self.replicas = [
            ServerProcess(
                self.work_dir / self.name(i),
                env=self.replica_env(i),
                log_path=self.work_dir / f"{self.name(i)}.log",
            )
            for i in range(config.replicas)
        ]
        self._stack.callback(self._kill_replicas)
        for replica in self.replicas:
            replica.start(config.start_timeout_s)
        socket_path = self.work_dir / "haproxy.sock"
        self.haproxy = HAProxyProcess(
            haproxy_config(
                self.lb_port,
                [(self.name(i), r.port) for i, r in enumerate(self.replicas)],
                socket_path,
                check_inter_ms=config.check_inter_ms,
                fall=config.check_fall,
                rise=config.check_rise,
            ),
            self.work_dir,
            socket_path,
        )
        self._stack.callback(self.haproxy.stop)
        self.haproxy.start()
        self.wait_healthy()

    def _migrate(self) -> None:
        """Create the tables once, before the replicas race to."""
        from service.store import Database

        Database(self.database_url).dispose()

    def close(self) -> None:
        """Stop everything (replicas killed if they do not stop in time); idempotent."""
        atexit.unregister(self.close)
        self._stack.close()
        self._http.close()

    def _kill_replicas(self) -> None:
        for replica in self.replicas:
            if replica.process is not None and replica.process.poll() is None:
                replica.process.kill()
        for replica in self.replicas:
            if replica.process is not None:
                replica.process.wait()

    def __enter__(self) -> LocalCluster:
        return self.start_all()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- replicas ------------------------------------------------------------------------
    def alive(self, i: int) -> bool:
        process = self.replicas[i].process
        return process is not None and process.poll() is None

    def kill(self, i: int) -> None:
        """SIGKILL replica ``i``: no goodbye to the group, the lease or HAProxy."""
        self.replicas[i].stop(kill=True)

    def stop(self, i: int) -> None:
        """SIGTERM replica ``i`` and wait for it to exit (it releases its lease)."""
        self.replicas[i].stop()

    def start(self, i: int, timeout: float | None = None) -> None:
        """Start replica ``i`` (again) on its port and wait until it answers healthy."""
        if self.alive(i):
            raise RuntimeError(f"{self.name(i)} is running")
        self.replicas[i].start(timeout or self.config.start_timeout_s)
        if self.haproxy is not None:
            self._wait_lb_up([i])

    def restart(self, i: int, *, kill: bool = False) -> None:
        self.replicas[i].stop(kill=kill)
        self.start(i)

    # -- HAProxy -------------------------------------------------------------------------
    def set_state(self, i: int, state: str) -> None:
        """``ready``, ``drain`` or ``maint`` for replica ``i`` in HAProxy."""
        assert self.haproxy is not None
        answer = self.haproxy.command(f"set server driftline/{self.name(i)} state {state}")
        if answer.strip():
            raise RuntimeError(f"haproxy: {answer.strip()}")

    def lb_status(self) -> dict[str, str]:
        """Replica name -> HAProxy's view (``UP``, ``DOWN``, ``MAINT``, ``DRAIN``, ...)."""
        assert self.haproxy is not None
        return {name: row["status"] for name, row in self.haproxy.servers().items()}

    def _lb_sessions(self, i: int) -> int:
        assert self.haproxy is not None
        return int(self.haproxy.servers()[self.name(i)]["scur"] or 0)

    def drain(self, i: int, timeout: float = 30.0) -> None:
        """Take replica ``i`` out of the ring and wait for its requests in flight."""
        self.set_state(i, "maint")
        deadline = time.monotonic() + timeout
        while self._lb_sessions(i) > 0 and time.monotonic() < deadline:
            time.sleep(0.05)

    def rolling_restart(self, *, drain: bool = True) -> list[float]:
        """Restart every replica in turn: drain it in HAProxy (or, with ``drain=False``,
        rely on the health checks and retries), SIGTERM, start, wait until it is healthy
        and has applied the log as it stood, put it back. Returns each replica's
        seconds out of service."""
        out: list[float] = []
        for i in range(len(self.replicas)):
            began = time.monotonic()
            if drain:
                self.drain(i)
            self.stop(i)
            position = self.log_position()
            self.replicas[i].start(self.config.start_timeout_s)
            self.wait_applied(i, position)
            if drain:
                self.set_state(i, "ready")
            self._wait_lb_up([i])
            out.append(time.monotonic() - began)
        return out

    # -- what the replicas say -----------------------------------------------------------
    def health(self, i: int) -> dict[str, Any] | None:
        """Replica ``i``'s ``/healthz`` body, or None when it does not answer 200."""
        if not self.alive(i):
            return None
        try:
            response = self._http.get(f"{self.replicas[i].url}/healthz")
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 else None

    def leader(self) -> int | None:
        """The index of the replica that says it leads, or None."""
        for i in range(len(self.replicas)):
            body = self.health(i)
            if body is not None and body["cluster"]["leader"]:
                return i
        return None

    def leaders(self) -> list[int]:
        """Every replica that says it leads (more than one is a bug)."""
        out = []
        for i in range(len(self.replicas)):
            body = self.health(i)
            if body is not None and body["cluster"]["leader"]:
                out.append(i)
        return out

    def wait_leader(self, timeout: float = 30.0, exclude: int | None = None) -> int:
        """Wait until a replica (other than ``exclude``) leads; returns its index."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader()
            if leader is not None and leader != exclude:
                return leader
            time.sleep(0.05)
        raise TimeoutError(f"no leader after {timeout}s")

    def applied(self, i: int) -> int | None:
        body = self.health(i)
        return None if body is None else int(body["cluster"]["applied_position"])

    def log_position(self) -> int:
        """The newest event id in the log (the events table)."""
        engine = create_engine(self.database_url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                return int(conn.scalar(text("SELECT coalesce(max(id), 0) FROM events")) or 0)
        finally:
            engine.dispose()

    def wait_applied(self, i: int, position: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while (self.applied(i) or 0) < position:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name(i)} has not applied {position} in {timeout}s")
            time.sleep(0.05)

    def wait_drained(self, position: int | None = None, timeout: float = 60.0) -> int:
        """Wait until every running replica has applied the log up to ``position``
        (default: the log's end now); returns the position."""
        position = self.log_position() if position is None else position
        for i in range(len(self.replicas)):
            if self.alive(i):
                self.wait_applied(i, position, timeout)
        return position

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Every replica running and healthy, and UP in HAProxy."""
        timeout = timeout or self.config.start_timeout_s
        for i in range(len(self.replicas)):
            if not self.alive(i):
                raise RuntimeError(f"{self.name(i)} is not running")
            self._wait_replica_healthy(i, timeout)
        self._wait_lb_up(range(len(self.replicas)), timeout)

    def _wait_replica_healthy(self, i: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.health(i) is None:
            if not self.alive(i):
                raise RuntimeError(f"{self.name(i)} exited; see {self.replicas[i].log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name(i)} not healthy after {timeout}s")
            time.sleep(0.1)

    def _wait_lb_up(self, indices: Any, timeout: float = 30.0) -> None:
        names = [self.name(i) for i in indices]
        deadline = time.monotonic() + timeout
        while True:
            status = self.lb_status()
            if all(status.get(name) == "UP" for name in names):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"haproxy does not see {names} up: {status}")
            time.sleep(0.05)
