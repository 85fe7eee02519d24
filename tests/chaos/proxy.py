"""A TCP proxy the chaos tests control: cut every connection (and refuse new ones), restore, add
latency. Real sockets, so the relay sees exactly what a network failure looks like to it."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._up = True
        self._closed = False
        self.latency = 0.0  # seconds added to every chunk, each way
        self._thread = threading.Thread(target=self._accept, daemon=True, name="chaos-proxy")
        self._thread.start()

    def url_for(self, url: str, default_port: int) -> str:
        """`url` with host:port replaced by this proxy's."""
        host_port = f"{self.target[0]}:{self.target[1]}"
        if host_port in url:
            return url.replace(host_port, f"127.0.0.1:{self.port}")
        return url.replace(f"{self.target[0]}", f"127.0.0.1:{self.port}", 1)

    def cut(self) -> None:
        """Drop every open connection at once and refuse new ones until `restore()`."""
        with self._lock:
            self._up = False
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def restore(self) -> None:
        with self._lock:
            self._up = True

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                up = self._up
            if not up:
                client.close()  # refused, as a dead host behind a firewall would look
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            # Each chunk goes on at once, as the endpoints send it (both set TCP_NODELAY). With
            # Nagle here, a write behind one not yet acknowledged waits for the peer's delayed
            # ACK, on every message of a chain (one message per confirm): a hot key would drain
            # far slower through the proxy than past it.
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 1.0)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    if self.latency:
                        time.sleep(self.latency)
                    peers[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
            with self._lock, contextlib.suppress(ValueError):
                self._pairs.remove((a, b))
