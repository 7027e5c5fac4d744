"""A webhook receiver on loopback for the alert-delivery tests: a real HTTP server."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """A webhook receiver on loopback: records bodies, answers ``statuses`` in turn
    (then 200), and while ``hang`` is set holds every request until ``released`` is."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        self.attempts = 0
        self.hang = threading.Event()
        self.released = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                receiver.attempts += 1
                if receiver.hang.is_set():
                    receiver.released.wait(timeout=30)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                if status == 200:
                    receiver.bodies.append(body)
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.bodies) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.bodies

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
