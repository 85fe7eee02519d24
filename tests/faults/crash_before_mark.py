"""A relay process that dies (SIGKILL, no clean-up) right after the broker confirmed a batch and
before the confirms are written to the database: the window in which a crash could lose or
duplicate a message. Run as `python -m tests.faults.crash_before_mark DB_URL AMQP_URL`.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Sequence

from relay.amqp.publisher import Publisher
from relay.loop.wiring import wire_relay
from relay.runtime.config import RelayConfig
from relay.store.engines import make_engine
from relay.store.sql_store import SqlStore


class CrashingStore(SqlStore):
    def mark_published(self, token: uuid.UUID, seqs: Sequence[int]) -> int:
        if seqs:
            print(f"confirmed {len(seqs)}, dying before marking", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().mark_published(token, seqs)


def main() -> None:
    db_url, amqp_url = sys.argv[1], sys.argv[2]
    config = RelayConfig(
        db_url=db_url,
        amqp_url=amqp_url,
        relay_id="doomed",
        lease_seconds=3.0,
        confirm_timeout=2.0,
        poll_interval=0.05,
    )
    publisher = Publisher(amqp_url, confirm_timeout=config.confirm_timeout)
    publisher.start()
    wire_relay(CrashingStore(make_engine(db_url)), publisher, config).run()


if __name__ == "__main__":
    main()
