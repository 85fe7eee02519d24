"""Upkeep between claims: the leases (other relays' expired leases, keys freed by a dead or
cancelled head, this relay's slow batches) and retention. The heartbeat, and the leases of relays
whose heartbeat stopped, are the pulse's (relay/loop/pulse.py), on a thread of its own.

After the database failed the loop (an outage, a failover to a standby), the rows the database
holds leased to this relay under a claim the relay never heard the answer of are taken back as
soon as it answers again (`reclaim_strays`), rather than when their lease runs out: a claim whose
commit the server made (or the standby received) while its answer was lost is a lease no part of
this relay knows, never sent. They come back as the rows of an earlier run of this relay do, as
suspects (relay/core/suspects.py); the leases the relay does hold are left as they are.

Each runs when due, as one bounded step: retention deletes at most the policy's budget per pass
(relay/core/retention.py) and comes back soon only when it left a backlog, so neither ever holds
the loop up for long.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from relay.core.retention import RetentionPolicy
from relay.loop.counts import Counts
from relay.loop.leases import Leases
from relay.loop.settings import LoopSettings
from relay.ports import Store

log = logging.getLogger("relay")

# Seconds between two attempts at taking back strays while the database still fails.
STRAYS_RETRY = 0.5


class Maintenance:
    def __init__(
        self,
        store: Store,
        config: LoopSettings,
        *,
        leases: Leases,
        wall: Callable[[], dt.datetime],
    ) -> None:
        self._store = store
        self._config = config
        self._leases = leases
        self._wall = wall
        self.next_upkeep = 0.0  # clock time the leases are next looked after
        self._next_sweep = 0.0
        self._next_retention = 0.0
        self._strays = False  # the database failed the loop since strays were last taken back
        self._next_strays = 0.0

    def database_failed(self) -> None:
        """A statement of the loop failed on the database: one of its claims may have been made
        without the relay hearing of it."""
        self._strays = True

    def reclaim_strays(self, counts: Counts, now: float) -> int:
        """After a database failure, take back the rows leased to this relay outside the
        leases it holds; how many. May raise DatabaseUnavailable (then tried again
        STRAYS_RETRY seconds later)."""
        if not self._strays or now < self._next_strays:
            return 0
        self._next_strays = now + STRAYS_RETRY
        config = self._config
        held = [
            (lease.token, seq)
            for lease in self._leases.values()
            if lease.holder is None
            for seq in lease.rows
        ]
        taken = self._store.reclaim_strays(
            config.relay_id, held, max_attempts=config.policy.max_attempts
        )
        self._strays = False
        if taken:
            counts.reclaimed += taken
            log.warning("relay.strays_reclaimed", extra={"count": taken, "held": len(held)})
        return taken

    def upkeep(self, counts: Counts, now: float) -> None:
        """Look after the leases. May raise DatabaseUnavailable (then again at the next turn
        it is due)."""
        config, store = self._config, self._store
        # Often enough that a lease of this relay's is extended well before it runs out, however
        # short the lease: a third of it old, at most a sixth more before the next look.
        self.next_upkeep = now + min(config.reclaim_interval, config.lease_seconds / 6)
        # Batches normally settle in milliseconds; one still open after a third of its lease (a
        # slow broker, a hot key's run) gets more time before another relay could take it over.
        # First: the expired leases reclaimed next must never be this relay's own.
        stale = [
            lease
            for lease in self._leases.values()
            if lease.holder is None and now - lease.extended_at > config.lease_seconds / 3
        ]
        if stale:
            store.extend_leases([lease.token for lease in stale], config.lease_seconds)
            for lease in stale:
                lease.extended_at = now
        reclaimed = store.reclaim_expired(
            relay_id=config.relay_id, max_attempts=config.policy.max_attempts
        )
        if reclaimed:
            counts.reclaimed += reclaimed
            log.warning("relay.leases_reclaimed", extra={"count": reclaimed})
        if now >= self._next_sweep:
            self._next_sweep = now + config.sweep_interval
            store.unpark_sweep()

    def retention_due(self, now: float) -> RetentionPolicy | None:
        """The retention policy when a pass is due, else None (or when retention is off)."""
        policy = self._config.retention
        return policy if policy is not None and now >= self._next_retention else None

    def purge(self, policy: RetentionPolicy, now: float) -> None:
        """One bounded retention pass. May raise DatabaseUnavailable (then again after the
        policy's interval)."""
        self._next_retention = now + policy.interval
        deleted = self._store.purge_expired(policy, self._wall())
        self._next_retention = now + policy.next_run_in(deleted)
