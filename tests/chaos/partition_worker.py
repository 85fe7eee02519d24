"""One consumer process of the partitions scenario (tests/chaos/partitions.py):

    python -m tests.chaos.partition_worker DB_URL AMQP_URL QUEUE PARTITIONS

`outbox.Consumer(..., partitions=N)` with the inbox; the handler records each message it
processes in `chaos_processed`, in its own transaction, so the table's serial is the order of
processing. Connects again whenever the broker connection ends; exits on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType

import pika.exceptions
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import outbox


def main(db_url: str, amqp_url: str, queue: str, partitions: int) -> int:
    engine = create_engine(db_url, pool_size=2)
    me = str(os.getpid())

    def handle(session: Session, message: outbox.Message) -> None:
        row = {
            "id": message.id,
            "key": message.headers.get("x-outbox-key"),
            "n": message.json()["n"],
            "consumer": me,
        }
        session.execute(
            text(
                "INSERT INTO chaos_processed (message_id, key, n, consumer) "
                "VALUES (:id, :key, :n, :consumer)"
            ),
            row,
        )

    stopping = threading.Event()
    consumer = outbox.Consumer(
        engine, amqp_url, queue, handle, partitions=partitions, inbox_retention=None
    )

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stopping.set()
        consumer.stop()

    signal.signal(signal.SIGTERM, on_signal)
    while not stopping.is_set():
        try:
            consumer.run()
        except pika.exceptions.AMQPError as exc:
            print(f"partition_worker: {exc!r}", file=sys.stderr, flush=True)
            time.sleep(0.2)  # the broker went away: a supervisor would start it again
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
