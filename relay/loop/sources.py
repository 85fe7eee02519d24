"""What the loop needs of a second source of messages beside the table's claims: the log, with
`--capture logical` (relay/capture/source.py). Its messages join the loop as a lease of their own
(Lease.holder settles them); the loop gives it room, and each pass a turn to write and confirm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from relay.errors import RelayError
from relay.loop.leases import Leases


class SourceFailed(RelayError):
    """The source can give nothing more and must not be skipped past (the log's slot was lost
    or dropped): the relay drains what it holds and stops, saying why."""


class Source(Protocol):
    def intake(
        self, leases: Leases, room: int, passed_by: Callable[[str, str], bool] | None = None
    ) -> tuple[int, bool]:
        """Take up to about `room` messages into `leases`; return how many, and whether more
        may be there at once. A message `passed_by(exchange, routing_key)` says the main claim
        would pass by (an open circuit, a rate limit) is left to the table, whose claims look
        after those. Raises SourceFailed when it never can again."""

    def flush(self) -> int:
        """Write what waits to be written; how many."""

    def advance(self) -> None:
        """Let go of what is resolved."""

    def fileno(self) -> int | None:
        """A socket that is readable when there is more to take, or None."""

    def close(self) -> None: ...
