"""The fault tests' TCP proxy, against a loopback echo server."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.support.tcp_proxy import TcpProxy


@pytest.fixture
def echo_port() -> Iterator[int]:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield int(listener.getsockname()[1])
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)
    listener.close()


def _echo(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
        return received


def _turned_away(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            return sock.recv(1) == b""
        except ConnectionResetError:
            return True


def test_the_proxy_forwards_cuts_and_restores(echo_port: int) -> None:
    with TcpProxy(echo_port) as proxy:
        assert _echo(proxy.port, b"hello") == b"hello"
        held = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        held.sendall(b"ping")
        assert held.recv(4) == b"ping"

        proxy.cut()
        assert held.recv(4) == b""  # the open connection was closed under it
        held.close()
        assert _turned_away(proxy.port)  # and new ones are turned away
        assert proxy.refused == 1

        proxy.restore()
        assert _echo(proxy.port, b"x" * 200_000) == b"x" * 200_000
        assert proxy.connections == 3
