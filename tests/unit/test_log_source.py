"""The log as the loop's second source (relay/capture/source.py), against fakes at its port
boundary: the replication stream, the table and the broker. What goes out, what goes into the
table and in which order, and how far the slot moves."""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Collection, Sequence

from outbox import logged
from relay.capture.pgoutput import Commit
from relay.capture.source import LogSource
from relay.core.outcome import Fate, Outcome
from relay.core.policy import RetryPolicy
from relay.errors import DatabaseUnavailable
from relay.loop.relay import Relay
from relay.loop.wiring import wire_relay
from relay.ports import Outgoing
from relay.runtime.config import RelayConfig
from relay.store.logtable import Admitted
from tests.unit.fakes import EPOCH, FakePublisher, FakeStore

NOW = EPOCH + dt.timedelta(minutes=1)


class FakeStream:
    def __init__(self) -> None:
        self.waiting: list[Commit] = []
        self.confirmed = 0
        self.idled = 0
        self.opened = 0

    def open(self) -> None:
        self.opened += 1

    def fileno(self) -> int:
        return -1

    def read(self, max_commits: int = 1000) -> list[Commit]:
        taken, self.waiting = self.waiting[:max_commits], self.waiting[max_commits:]
        return taken

    def confirm(self, lsn: int) -> None:
        self.confirmed = max(self.confirmed, lsn)

    def idle(self) -> None:
        self.idled += 1

    def flush_status(self, reply: bool = False) -> None:
        pass

    def close(self) -> None:
        pass


class FakeTable:
    def __init__(self) -> None:
        self.admitted: list[Admitted] = []
        self.marked: list[str] = []
        self.held: set[str] = set()
        self.down = False

    def admit(self, rows: Sequence[Admitted], *, relay_id: str) -> None:
        if self.down:
            raise DatabaseUnavailable("down")
        self.admitted.extend(rows)

    def mark(self, ids: Sequence[str]) -> int:
        if self.down:
            raise DatabaseUnavailable("down")
        self.marked.extend(ids)
        return len(ids)

    def held_keys(self, keys: Collection[str]) -> set[str]:
        if self.down:
            raise DatabaseUnavailable("down")
        return self.held & set(keys)


def message(
    n: int,
    *,
    key: str | None = None,
    delay: dt.timedelta | None = None,
    has_row: bool = False,
) -> bytes:
    params = {
        "id": f"00000000-0000-7000-8000-{n:012d}",
        "exchange": "orders",
        "routing_key": f"rk.{n}",
        "payload": f"payload {n}".encode(),
        "content_type": "text/plain",
        "headers": None,
        "key": key,
        "priority": 0,
        "max_attempts": None,
        "traceparent": None,
        "tracestate": None,
    }
    return logged.stamped(logged.pack(params, delay=delay, has_row=has_row), EPOCH)


def commit(end_lsn: int, *messages: bytes) -> Commit:
    return Commit(end_lsn, EPOCH, list(messages))


def number(item: Outgoing) -> int:
    return int(item.message_id.rsplit("-", 1)[1])


def make(
    publisher: FakePublisher | None = None, **config: object
) -> tuple[Relay, FakeStream, FakeTable, FakePublisher]:
    stream, table = FakeStream(), FakeTable()
    publisher = publisher or FakePublisher()
    source = LogSource(stream, table, relay_id="test", clock=time.monotonic, wall=lambda: NOW)
    cfg = RelayConfig(db_url="sqlite://", relay_id="test", **config)  # type: ignore[arg-type]
    relay = wire_relay(
        FakeStore(),
        publisher,
        cfg,
        wall=lambda: NOW,
        rng=random.Random(5),
        source=source,
    )
    return relay, stream, table, publisher


def test_confirmed_messages_move_the_slot_and_write_nothing() -> None:
    relay, stream, table, publisher = make()
    stream.waiting = [commit(100, message(1), message(2)), commit(200, message(3))]
    relay.run_once()  # read and sent
    relay.run_once()  # settled
    assert [number(i) for i in publisher.published] == [1, 2, 3]
    assert stream.confirmed == 200
    assert table.admitted == []
    assert table.marked == []
    assert relay.in_flight == 0


def test_a_commit_is_confirmed_only_once_every_message_of_it_is_resolved() -> None:
    publisher = FakePublisher(hold=True)
    relay, stream, _, _ = make(publisher)
    stream.waiting = [commit(100, message(1)), commit(200, message(2), message(3))]
    relay.run_once()
    assert stream.confirmed == 0
    publisher.answer_first()  # the one chunk holds all three
    relay.run_once()
    assert stream.confirmed == 200


def test_a_keys_messages_go_as_one_chain_across_reads() -> None:
    publisher = FakePublisher(hold=True)
    relay, stream, _, _ = make(publisher)
    stream.waiting = [commit(100, message(1, key="k"), message(2, key="k"))]
    relay.run_once()
    stream.waiting = [commit(200, message(3, key="k"))]
    relay.run_once()
    assert len(set(publisher.chain_ids)) == 1  # the publisher sends each after the one before
    assert [number(i) for i in publisher.published] == [1, 2, 3]


def test_a_failure_and_what_its_key_held_back_go_into_the_table_in_order() -> None:
    def decide(item: Outgoing) -> Outcome:
        if number(item) == 2:
            return Outcome(item.seq, Fate.REJECTED, "nack")
        return Outcome(item.seq, Fate.CONFIRMED)

    relay, stream, table, publisher = make(FakePublisher(decide=decide))
    stream.waiting = [
        commit(100, message(1, key="k"), message(2, key="k"), message(3, key="k")),
        commit(200, message(4)),
    ]
    relay.run_once()
    relay.run_once()
    relay.run_once()
    # 1 confirmed; 2 nacked: a retry, its attempt charged; 3 held back behind it, uncharged.
    assert [(r.id[-1], r.state, r.attempts, r.outcome) for r in table.admitted] == [
        ("2", "pending", 1, "retry"),
        ("3", "pending", 0, None),
    ]
    assert table.admitted[0].available_at > NOW
    assert stream.confirmed == 200
    # The key's later messages from the log follow it into the table.
    stream.waiting = [commit(300, message(5, key="k"))]
    table.held = {"k"}
    relay.run_once()
    assert table.admitted[-1].id.endswith("5")
    assert 5 not in [number(i) for i in publisher.published]
    assert stream.confirmed == 300


def test_a_message_waits_for_its_keys_messages_in_flight_before_entering_the_table() -> None:
    publisher = FakePublisher(hold=True)
    relay, stream, table, _ = make(publisher)
    stream.waiting = [commit(100, message(1, key="k"))]
    relay.run_once()
    # Delayed: it takes the table's path, but not ahead of message 1, still in flight.
    later = dt.timedelta(hours=1)
    stream.waiting = [commit(200, message(2, key="k", delay=later, has_row=True))]
    relay.run_once()
    assert table.admitted == []
    publisher.confirm_held()
    relay.run_once()
    relay.run_once()
    [delayed] = table.admitted
    assert delayed.has_row
    assert delayed.available_at == EPOCH + later
    assert stream.confirmed == 200


def test_a_key_the_table_holds_keeps_the_logs_messages_behind_it() -> None:
    relay, stream, table, publisher = make()
    table.held = {"k"}
    stream.waiting = [commit(100, message(1, key="k"), message(2, key="other"))]
    relay.run_once()
    relay.run_once()
    assert [r.id[-1] for r in table.admitted] == ["1"]
    assert [number(i) for i in publisher.published] == [2]
    assert stream.confirmed == 100


def test_when_the_table_cannot_say_which_keys_it_holds_keyed_messages_wait_for_it() -> None:
    relay, stream, table, publisher = make()
    table.down = True
    stream.waiting = [commit(100, message(1, key="k"), message(2))]
    relay.run_once()
    relay.run_once()
    assert [number(i) for i in publisher.published] == [2]
    assert stream.confirmed == 0  # message 1 is not written yet
    table.down = False
    relay.run_once()
    assert [r.id[-1] for r in table.admitted] == ["1"]
    assert stream.confirmed == 100


def test_a_message_with_a_held_row_marks_it_when_confirmed() -> None:
    relay, stream, table, _ = make()
    stream.waiting = [commit(100, message(1, has_row=True), message(2))]
    relay.run_once()
    relay.run_once()
    assert table.marked == ["00000000-0000-7000-8000-000000000001"]


def test_an_unreadable_message_is_dead_lettered_and_the_rest_go() -> None:
    relay, stream, table, publisher = make()
    stream.waiting = [commit(100, b"\x09garbage", message(2))]
    relay.run_once()
    relay.run_once()
    [dead] = table.admitted
    assert dead.state == "dead"
    assert dead.payload == b"\x09garbage"
    assert dead.error is not None
    assert "malformed message in the log" in dead.error
    assert [number(i) for i in publisher.published] == [2]
    assert stream.confirmed == 100


def test_commits_read_again_after_a_reconnect_are_not_taken_twice() -> None:
    publisher = FakePublisher(hold=True)
    relay, stream, _, _ = make(publisher)
    stream.waiting = [commit(100, message(1))]
    relay.run_once()
    stream.waiting = [commit(100, message(1)), commit(200, message(2))]  # a new stream's start
    relay.run_once()
    assert [number(i) for i in publisher.published] == [1, 2]


def test_a_stop_gives_what_was_never_sent_to_the_table_and_moves_the_slot() -> None:
    publisher = FakePublisher(ready=False)
    relay, stream, table, _ = make(publisher)
    stream.waiting = [commit(100, message(1))]
    relay.run_once()  # the broker is away: nothing is read
    assert stream.waiting
    assert table.admitted == []
    publisher.ready = True
    publisher.hold = True
    relay.request_stop()
    relay.run()
    assert stream.confirmed in (0, 100)
    assert all(r.state == "pending" for r in table.admitted)


def test_failures_are_written_with_the_policys_decision() -> None:
    def decide(item: Outgoing) -> Outcome:
        return Outcome(item.seq, Fate.UNROUTABLE, "312 NO_ROUTE")

    relay, stream, table, _ = make(
        FakePublisher(decide=decide), policy=RetryPolicy(unroutable_grace=0.0)
    )
    stream.waiting = [commit(100, message(1))]
    relay.run_once()
    relay.run_once()
    [dead] = table.admitted
    assert (dead.state, dead.failure_class, dead.outcome) == ("dead", "unroutable", "dead")
    assert stream.confirmed == 100


def test_the_stores_statements_know_a_held_row_by_the_librarys_time() -> None:
    from relay.store.postgres import SQL

    held = f"'{logged.HELD_UNTIL}'"
    for block in ("admit_logged", "mark_logged", "held_keys"):
        assert held in SQL._block(block).text, block


def test_a_lost_slot_stops_the_relay_after_draining_and_says_why() -> None:
    from relay.capture.stream import SlotLost

    publisher = FakePublisher(hold=True)
    relay, stream, table, _ = make(publisher)
    stream.waiting = [commit(100, message(1))]
    relay.run_once()

    def lost(max_commits: int = 1000) -> list[Commit]:
        raise SlotLost("replication slot 'outbox_relay' was invalidated: its messages are gone")

    stream.read = lost  # type: ignore[method-assign]
    publisher.confirm_held()
    summary = relay.run()  # ends on its own: no stop was requested
    assert relay.failure is not None
    assert "invalidated" in relay.failure
    assert summary.published == 1  # what it held was drained first
    assert stream.confirmed == 100
    assert table.admitted == []


def test_a_keys_lone_message_goes_side_by_side_and_the_next_waits_for_it() -> None:
    publisher = FakePublisher(hold=True)
    relay, stream, _, _ = make(publisher)
    stream.waiting = [commit(100, message(1, key="k"), message(2, key="other"))]
    relay.run_once()
    assert publisher.chain_ids == []  # one message of each key: no chain to wait on
    stream.waiting = [commit(200, message(3, key="k"))]
    relay.run_once()
    assert [number(i) for i in publisher.published] == [1, 2]  # 3 waits for 1
    publisher.confirm_held()
    relay.run_once()
    relay.run_once()
    assert [number(i) for i in publisher.published] == [1, 2, 3]


def test_what_waited_behind_a_lone_message_that_failed_follows_it_into_the_table() -> None:
    def decide(item: Outgoing) -> Outcome:
        if number(item) == 1:
            return Outcome(item.seq, Fate.REJECTED, "nack")
        return Outcome(item.seq, Fate.CONFIRMED)

    publisher = FakePublisher(decide=decide, hold=True)
    relay, stream, table, _ = make(publisher)
    stream.waiting = [commit(100, message(1, key="k"))]
    relay.run_once()
    stream.waiting = [commit(200, message(2, key="k"), message(3, key="k"))]
    relay.run_once()
    publisher.confirm_held()
    relay.run_once()
    relay.run_once()
    assert [(r.id[-1], r.outcome) for r in table.admitted] == [
        ("1", "retry"),
        ("2", None),
        ("3", None),
    ]
    assert [number(i) for i in publisher.published] == [1]
    assert stream.confirmed == 200


def test_a_rate_limited_destinations_messages_are_left_to_the_tables_claims() -> None:
    relay, stream, table, publisher = make(rate_limits={"orders": 5.0})
    stream.waiting = [commit(100, message(1), message(2))]  # both to exchange "orders"
    relay.run_once()
    relay.run_once()
    assert publisher.published == []
    assert [(r.id[-1], r.state, r.attempts) for r in table.admitted] == [
        ("1", "pending", 0),
        ("2", "pending", 0),
    ]
    assert stream.confirmed == 100
