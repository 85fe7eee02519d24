"""outbox.Consumer(partitions=N): the queues it reads, named as the topology declares them, and a
bad count refused when the consumer is made."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

import outbox
from outbox.consumer.consumer import partition_queues
from relay.core.topology import partition_names


def _nothing(_session: Session, _message: outbox.Message) -> None:
    pass


def test_the_consumer_reads_the_queues_the_topology_declares() -> None:
    assert partition_queues("work", None) == ["work"]
    assert (
        partition_queues("work", 3) == partition_names("work", 3) == ["work.0", "work.1", "work.2"]
    )


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "4"])
def test_a_bad_partition_count_is_refused_when_the_consumer_is_made(bad: object) -> None:
    engine = create_engine("sqlite://")
    with pytest.raises(outbox.OutboxError, match="partitions must be a positive integer"):
        outbox.Consumer(engine, "amqp://guest:guest@127.0.0.1:1/%2F", "work", _nothing,
                        partitions=bad)  # type: ignore[arg-type]  # fmt: skip
    engine.dispose()
