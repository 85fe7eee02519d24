"""While the relay's thread waits for PostgreSQL, it does the broker's IO instead of sleeping.

The relay has one thread for its work (relay/loop/relay.py): a claim or a mark that keeps it
waiting for the server would otherwise keep the broker's confirms unread, and a hot key's chain,
which sends its next message from the confirm of the one before, would stand still for that long.
psycopg waits for its socket in one method, `Connection.wait`, given a generator that says what it
waits for (readable, writable) and takes what became ready. The loop's connections are
of `connection_class()`: on a thread that registered a wait with `waiting_with`, that method
hands each of its waits to it (the publisher's `wait_fd`, which runs the broker's IO loop with the
database's socket in it), and to psycopg's own everywhere else (the heartbeat's thread, the HTTP
server's, operator commands).

Only psycopg has a wait to hand over: MySQL's and SQLite's drivers block the thread.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

from relay.ports import FdWait

_waits: dict[int, FdWait] = {}  # thread ident -> how that thread waits for the database


@contextlib.contextmanager
def waiting_with(wait: FdWait) -> Iterator[None]:
    """On the calling thread, until the block ends, wait for PostgreSQL with `wait`."""
    thread = threading.get_ident()
    _waits[thread] = wait
    try:
        yield
    finally:
        _waits.pop(thread, None)


@functools.cache
def connection_class() -> type[Any]:
    """psycopg's Connection, waiting as above (imported here: psycopg is an extra)."""
    import psycopg
    from psycopg.abc import PQGen
    from psycopg.waiting import Ready

    class OverlappingConnection(psycopg.Connection[Any]):
        def wait(self, gen: PQGen[Any], interval: float = 0.1, timeout: float | None = None) -> Any:
            how = _waits.get(threading.get_ident())
            if how is None or timeout is not None:  # a bounded wait (a cancel) is psycopg's
                return super().wait(gen, interval, timeout)
            fileno = self.pgconn.socket
            try:
                wanted = next(gen)
                while True:
                    wanted = gen.send(Ready(how(fileno, int(wanted))))
            except StopIteration as done:
                return done.value

    return OverlappingConnection
