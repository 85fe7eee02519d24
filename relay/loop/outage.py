"""Saying a database outage once: the first failure of a part that polls the database logs one
warning, the first success after it one line of recovery, and nothing in between however often
the part is called (a /metrics scrape every few seconds, several gauges per scrape).

Thread-safe: gauges are read on the HTTP server's threads.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("relay")


class Outage:
    def __init__(self, part: str) -> None:
        self._part = part  # the event names' prefix: metrics.database_unavailable, ...
        self._lock = threading.Lock()
        self._down = False

    @property
    def down(self) -> bool:
        return self._down

    def failed(self, error: str) -> None:
        with self._lock:
            if self._down:
                return
            self._down = True
        log.warning(f"{self._part}.database_unavailable", extra={"error": error})

    def answered(self) -> None:
        with self._lock:
            if not self._down:
                return
            self._down = False
        log.info(f"{self._part}.database_available")
