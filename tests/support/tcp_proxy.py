"""A small threaded TCP proxy whose link a test can cut and restore.

``TcpProxy(upstream_port)`` listens on a free loopback port and forwards every connection
to ``127.0.0.1:upstream_port``. ``cut()`` closes every forwarded connection at once and
turns new ones away (accepted and closed straight away, as a dead server or a broken
network looks to a client); ``restore()`` forwards again. It stands between the service
and its database in the fault tests.
"""

from __future__ import annotations

import contextlib
import socket
import threading

_CHUNK = 65536


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream_host:upstream_port``; use as a context manager."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self.connections = 0  # connections forwarded so far
        self.refused = 0  # connections turned away while cut
        self._acceptor = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._acceptor.start()

    # -- control ---------------------------------------------------------------------
    def cut(self) -> None:
        """Close every forwarded connection and turn new ones away until ``restore``."""
        with self._lock:
            self._cut = True
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            _close(sock)

    def restore(self) -> None:
        """Forward new connections again."""
        with self._lock:
            self._cut = False

    @property
    def is_cut(self) -> bool:
        return self._cut

    def close(self) -> None:
        """Stop listening and close everything."""
        with self._lock:
            self._closed = True
        self.cut()
        _close(self._listener)
        self._acceptor.join(timeout=5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- forwarding ------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            with self._lock:
                if self._closed:
                    _close(client)
                    return
                refuse = self._cut
                if refuse:
                    self.refused += 1
            if refuse:
                _close(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._cut or self._closed:  # cut while connecting upstream
                    _close(client)
                    _close(server)
                    continue
                self._open.update((client, server))
                self.connections += 1
            pending = [2]  # directions still open; the pair is closed when both are done
            for source, sink in ((client, server), (server, client)):
                threading.Thread(
                    target=self._pump,
                    args=(source, sink, pending),
                    name="tcp-proxy-pump",
                    daemon=True,
                ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, pending: list[int]) -> None:
        try:
            while data := source.recv(_CHUNK):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)  # pass the end of the stream on (half-close)
            with self._lock:
                pending[0] -= 1
                done = pending[0] == 0
        except OSError:
            done = True  # reset or cut: the forwarded connection is over
        if done:
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
