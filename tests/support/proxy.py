"""A TCP proxy a test controls, on real sockets, so the code under test sees exactly what a network
failure looks like to it:

- pass-through (the default): every chunk goes on at once, both ways;
- `cut()`: drop every open connection at once and refuse new ones, until `restore()`;
- `hold()`: take what the client sends on to the server, but hold back what the server answers
  (a node that has taken messages and not confirmed them yet), until `release()`;
- `slow(latency)`: wait `latency` seconds before passing each chunk on, each way.

    with TcpProxy("127.0.0.1", 5672) as proxy:
        url = proxy.url_for(AMQP_URL, 5672)

tests/support/tls.py terminates TLS in front of it (`_wrap`).
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from types import TracebackType
from typing import Self


class TcpProxy:
    """Listens on 127.0.0.1 (a free port, `port`) and forwards each connection to the target."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.latency = 0.0  # seconds added to every chunk, each way
        self.holding = threading.Event()  # set: nothing the server sends gets through
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._up = True
        self._closed = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        # accept() wakes up now and then to see close(): closing the socket would not wake it.
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, daemon=True, name="test-proxy")
        self._thread.start()

    def url_for(self, url: str, default_port: int) -> str:
        """`url` with host:port replaced by this proxy's."""
        host_port = f"{self.target[0]}:{self.target[1]}"
        if host_port in url:
            return url.replace(host_port, f"127.0.0.1:{self.port}")
        return url.replace(f"{self.target[0]}", f"127.0.0.1:{self.port}", 1)

    # ---- modes

    def cut(self) -> None:
        """Drop every open connection at once and refuse new ones until `restore()`."""
        with self._lock:
            self._up = False
            sockets, self._sockets = self._sockets, set()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        with self._lock:
            self._up = True

    def hold(self) -> None:
        """Hold back everything the server sends (the client's bytes still go through)."""
        self.holding.set()

    def release(self) -> None:
        """Pass on what was held back, and everything after it."""
        self.holding.clear()

    def slow(self, latency: float) -> None:
        """Wait `latency` s before passing each chunk on (0: pass-through again)."""
        self.latency = latency

    def close(self) -> None:
        """Stop accepting and drop every forwarded connection."""
        self._closed = True
        self.cut()
        self._listener.close()
        self._thread.join(5)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- forwarding

    def _wrap(self, client: socket.socket) -> socket.socket | None:
        """The socket to talk to the client through (a TLS proxy does its handshake here);
        None when the connection is not to be served (closed already)."""
        return client

    def _register(self, *sockets: socket.socket) -> bool:
        """Track `sockets` so that cut() drops them; False (and closed) while cut or closed."""
        with self._lock:
            if self._up and not self._closed:
                self._sockets.update(sockets)
                return True
        for s in sockets:
            s.close()  # refused, as a dead host behind a firewall would look
        return False

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        # Each chunk goes on at once, as the endpoints send it (both set TCP_NODELAY). With Nagle
        # here, a write behind one not yet acknowledged waits for the peer's delayed ACK, on
        # every message of a chain (one message per confirm): a hot key would drain far slower
        # through the proxy than past it.
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self._register(client):
            return
        near = self._wrap(client)
        if near is None or not self._register(near):
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            near.close()
            return
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._register(upstream):
            self._pump(near, upstream)
        else:
            near.close()

    def _pump(self, near: socket.socket, far: socket.socket) -> None:
        """Both ways, in one thread per connection (an SSL object is not used from two threads).
        Bytes the TLS layer has already decrypted (`pending()`) are read without waiting on the
        socket, which would not wake for them."""
        peers = {near: far, far: near}
        try:
            while True:
                holding = self.holding.is_set()
                ready: list[socket.socket] = (
                    [near] if isinstance(near, ssl.SSLSocket) and near.pending() else []
                )
                if not ready:
                    ready, _, _ = select.select([near] if holding else [near, far], [], [], 0.05)
                for s in ready:
                    if s is far and self.holding.is_set():
                        continue  # hold() came while waiting: the server's bytes stay put
                    data = s.recv(65536)
                    if not data:
                        return
                    if self.latency:
                        time.sleep(self.latency)
                    peers[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            with self._lock:
                self._sockets.difference_update((near, far))
            for s in (near, far):
                with contextlib.suppress(OSError):
                    s.close()
