"""A relay process that dies (os._exit, no clean-up) whenever it is about to publish the row with
routing key `poison`: a message that kills every relay that claims it. Otherwise it relays for
RUN_SECONDS and stops cleanly. Run as `python -m tests.faults.crash_on_row DB_URL AMQP_URL`.
"""

from __future__ import annotations

import os
import sys
import threading

from relay.amqp.publisher import Publisher
from relay.core.policy import RetryPolicy
from relay.loop.wiring import wire_relay
from relay.ports import Claimed, Outgoing
from relay.runtime.config import RelayConfig
from relay.store.sql_store import open_store

POISON = "poison"
RUN_SECONDS = 4.0
CRASHED = 3  # the exit code of a death by poison


class PoisonedPublisher(Publisher):
    def encode(
        self, row: Claimed, *, traceparent: str | None = None, tracestate: str | None = None
    ) -> Outgoing:
        if row.routing_key == POISON:
            print(f"dying on row {row.seq}", flush=True)
            os._exit(CRASHED)
        return super().encode(row, traceparent=traceparent, tracestate=tracestate)


def main() -> None:
    db_url, amqp_url = sys.argv[1], sys.argv[2]
    config = RelayConfig(
        db_url=db_url,
        amqp_url=amqp_url,
        relay_id=f"poisoned-{os.getpid()}",
        lease_seconds=1.0,
        confirm_timeout=0.5,
        poll_interval=0.05,
        reclaim_interval=0.1,
        policy=RetryPolicy(max_attempts=3, base=0.01, cap=0.05, floor=0.01),
    )
    publisher = PoisonedPublisher(amqp_url, confirm_timeout=config.confirm_timeout)
    publisher.start()
    relay = wire_relay(open_store(db_url), publisher, config)
    threading.Timer(RUN_SECONDS, relay.request_stop).start()
    relay.run()


if __name__ == "__main__":
    main()
