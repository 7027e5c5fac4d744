"""A replica's name in the cluster."""

from __future__ import annotations

import socket


def default_replica_id(port: int) -> str:
    """Host name and port: stable across restarts (a restarted leader takes its role
    back at once) and distinct for servers on one host. Processes that serve no port
    (``consume``) and share a host need ``REPLICA_ID`` set."""
    return f"{socket.gethostname()}:{port}"
