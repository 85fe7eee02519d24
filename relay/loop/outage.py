"""Saying a database outage once: the first failure of the gauges that read the database logs one
warning (`metrics.database_unavailable`), the first success after it one line of recovery
(`metrics.database_available`), and nothing in between however often they are read (a /metrics
scrape every few seconds, several gauges per scrape).

Thread-safe: gauges are read on the HTTP server's threads.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("relay")


class Outage:
    def __init__(self) -> None:
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
        log.warning("metrics.database_unavailable", extra={"error": error})

    def answered(self) -> None:
        with self._lock:
            if not self._down:
                return
            self._down = False
        log.info("metrics.database_available")
