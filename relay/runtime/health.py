"""The relay's HTTP endpoint: /healthz (liveness), /readyz (readiness) and /metrics (Prometheus).

    /healthz  200 while the loop turns (it did within `stale_after` seconds, and `problem`
              names none), else 503 with the reason: a stuck relay, or one whose heartbeat
              fails, is restarted by its orchestrator.
    /readyz   200 when the database answers and the broker connection is open, else 503 with a
              JSON body saying which is not (several databases: each one's state, and ready
              while the broker and at least one database are); `broker_node` names the node
              (host:port) of the broker, or of its cluster, the relay is connected to.
    /metrics  the relay's OpenTelemetry metrics in the Prometheus text format.

It runs in a daemon thread and only reads: it never touches the loop's state beyond one timestamp.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger("relay")

PATHS = ("/healthz", "/readyz", "/metrics")


class HealthServer:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        heartbeat: Callable[[], float],
        stale_after: float,
        database: Callable[[], None] | None = None,
        broker_ready: Callable[[], bool],
        registry: CollectorRegistry | None,
        clock: Callable[[], float] = time.monotonic,
        problem: Callable[[], str | None] = lambda: None,  # why the relay cannot work, if so
        broker_node: Callable[[], str | None] = lambda: None,  # host:port connected to, if any
        # Several databases: each one's state ("ok" or why not), instead of `database`.
        databases: Callable[[], dict[str, str]] | None = None,
    ) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, content_type, body = server.answer(self.path.split("?", 1)[0])
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # probes every few seconds would drown the relay's own log

        self._heartbeat = heartbeat
        self._stale_after = stale_after
        self._database = database
        self._databases = databases
        self._broker_ready = broker_ready
        self._broker_node = broker_node
        self._registry = registry
        self._clock = clock
        self._problem = problem
        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="outbox-relay-http", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        log.info("http.listening", extra={"port": self.port, "paths": ",".join(PATHS)})

    def stop(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()  # waits for serve_forever to return
        self._httpd.server_close()

    def answer(self, path: str) -> tuple[int, str, bytes]:
        if path == "/healthz":
            age = self._clock() - self._heartbeat()
            problem = self._problem()
            ok = age <= self._stale_after and problem is None
            # Before the loop's first turn (still connecting) the age is infinite: JSON null.
            shown = round(age, 3) if age != float("inf") else None
            body: dict[str, Any] = {"status": "ok" if ok else "stalled", "loop_age_s": shown}
            if problem is not None:
                body["problem"] = problem
            return _json(200 if ok else 503, body)
        if path == "/readyz":
            if self._databases is not None:
                return self._ready_many(self._databases())
            checks: dict[str, str] = {}
            try:
                if self._database is not None:
                    self._database()
                checks["database"] = "ok"
            except Exception as exc:
                checks["database"] = str(exc).splitlines()[0] if str(exc) else repr(exc)
            checks["broker"] = "ok" if self._broker_ready() else "not connected"
            ok = all(v == "ok" for v in checks.values())
            body = {"status": "ok" if ok else "not ready", **checks}
            node = self._broker_node()
            if node is not None:
                body["broker_node"] = node
            return _json(200 if ok else 503, body)
        if path == "/metrics":
            if self._registry is None:
                return 404, "text/plain", b"metrics are off\n"
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        return _json(404, {"error": f"no such path; try {', '.join(PATHS)}"})

    def _ready_many(self, databases: dict[str, str]) -> tuple[int, str, bytes]:
        """Ready while the broker is and at least one database is: the others are retried on
        their own, and this relay serves the rest meanwhile."""
        broker = "ok" if self._broker_ready() else "not connected"
        serving = sum(state == "ok" for state in databases.values())
        ok = broker == "ok" and serving > 0
        body: dict[str, Any] = {
            "status": "ok" if ok else "not ready",
            "broker": broker,
            "databases_ready": f"{serving}/{len(databases)}",
            "databases": databases,
        }
        node = self._broker_node()
        if node is not None:
            body["broker_node"] = node
        return _json(200 if ok else 503, body)


def _json(status: int, body: dict[str, Any]) -> tuple[int, str, bytes]:
    return status, "application/json", (json.dumps(body) + "\n").encode()
