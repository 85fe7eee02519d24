"""The replication protocol's bytes, without a server: frames built by hand as PostgreSQL sends
them, read back into whole commits; the status update; positions as text. And the connection
string the stream opens with (relay/capture/conninfo.py)."""

from __future__ import annotations

import datetime as dt
import struct

import pytest
from psycopg.conninfo import conninfo_to_dict

from relay.capture import pgoutput
from relay.capture.conninfo import conninfo_of
from relay.capture.pgoutput import Commit, Decoder, lsn_text, parse_lsn

T0 = 800_000_000_000_000  # a protocol time: microseconds since PG_EPOCH
AT = pgoutput.PG_EPOCH + dt.timedelta(microseconds=T0)


def w(lsn: int, message: bytes) -> bytes:
    return pgoutput.xlog_data(lsn, lsn, message)


def transaction(
    first: int, contents: list[tuple[str, bytes]], *, xid: int = 700
) -> tuple[list[bytes], int]:
    """The frames of one committed transaction emitting `contents` (prefix, bytes) at positions
    from `first` on, and its commit's end position."""
    commit_lsn = first + 0x100 * (len(contents) + 1)
    end_lsn = commit_lsn + 0x30
    frames = [w(first, pgoutput.begin(commit_lsn, T0, xid))]
    for at, (prefix, content) in enumerate(contents, 1):
        lsn = first + 0x100 * at
        frames.append(w(lsn, pgoutput.message(lsn, prefix, content)))
    frames.append(w(end_lsn, pgoutput.commit(commit_lsn, end_lsn, T0)))
    return frames, end_lsn


def fed(decoder: Decoder, frames: list[bytes]) -> list[Commit]:
    for frame in frames:
        decoder.feed(memoryview(frame))  # what get_copy_data gives
    ready, decoder.ready = decoder.ready, []
    return ready


def test_a_transaction_becomes_one_commit_with_its_messages_in_order() -> None:
    frames, end = transaction(0x1_0000_0000, [("outbox", b"one"), ("outbox", b"two\0three")])
    commits = fed(Decoder("outbox"), frames)
    assert commits == [Commit(end, AT, [b"one", b"two\0three"])]
    assert commits[0].commit_time.tzinfo is dt.UTC


def test_other_prefixes_and_empty_transactions_produce_nothing() -> None:
    decoder = Decoder("outbox")
    mixed, end = transaction(0x1000, [("audit", b"a"), ("outbox", b"b"), ("outboxes", b"c")])
    foreign, foreign_end = transaction(end + 0x10, [("audit", b"x"), ("outbo", b"y")])
    assert fed(decoder, mixed + foreign) == [Commit(end, AT, [b"b"])]
    assert decoder.heard == foreign_end  # moved past the transaction it did not return


def test_a_message_may_be_empty_and_its_prefix_custom() -> None:
    frames, end = transaction(0x2000, [("app.events", b""), ("outbox", b"z")])
    assert fed(Decoder("app.events"), frames) == [Commit(end, AT, [b""])]


def test_a_transaction_split_across_reads_is_returned_once_whole() -> None:
    decoder = Decoder("outbox")
    frames, end = transaction(0x3000, [("outbox", b"1"), ("outbox", b"2")])
    assert fed(decoder, frames[:2]) == []
    assert decoder.in_transaction
    assert fed(decoder, frames[2:3]) == []
    assert fed(decoder, frames[3:]) == [Commit(end, AT, [b"1", b"2"])]
    assert not decoder.in_transaction


def test_unknown_messages_and_frames_are_skipped() -> None:
    decoder = Decoder("outbox")
    frames, end = transaction(0x4000, [("outbox", b"m")])
    relation = b"R" + struct.pack("!II", 700, 16384) + b"public\0t\0d" + struct.pack("!H", 0)
    insert = b"I" + struct.pack("!IcH", 16384, b"N", 0)
    odd = [w(0x4010, relation), w(0x4020, insert), w(0x4030, b"Y\0\0"), w(0x4040, b"O\0"), b"z"]
    assert fed(decoder, frames[:1] + odd + frames[1:]) == [Commit(end, AT, [b"m"])]


def test_a_non_transactional_message_is_ignored_but_its_position_counts() -> None:
    decoder = Decoder("outbox")
    lonely = w(0x9000, pgoutput.message(0x9000, "outbox", b"now", transactional=False))
    assert fed(decoder, [lonely]) == []
    assert decoder.heard == 0x9000
    assert decoder.settled_up_to() == 0x9000


def test_keepalives_move_the_position_and_ask_for_a_reply() -> None:
    decoder = Decoder("outbox")
    fed(decoder, [pgoutput.keepalive(0x5000, reply=False)])
    assert (decoder.heard, decoder.reply) == (0x5000, False)
    fed(decoder, [pgoutput.keepalive(0x4000, reply=True)])  # never backwards
    assert (decoder.heard, decoder.reply) == (0x5000, True)


def test_settled_up_to_stops_at_a_transaction_still_being_read() -> None:
    decoder = Decoder("outbox")
    frames, _ = transaction(0x6000, [("outbox", b"a"), ("outbox", b"b")])
    commit_lsn = struct.unpack_from("!Q", frames[0], 26)[0]
    fed(decoder, frames[:2])
    fed(decoder, [pgoutput.keepalive(commit_lsn + 0x1000, reply=False)])
    assert decoder.settled_up_to() == commit_lsn  # the server resends a commit from there
    fed(decoder, frames[2:])
    assert decoder.settled_up_to() == commit_lsn + 0x1000


def test_the_status_update_is_what_the_server_reads() -> None:
    data = pgoutput.status_update(write=0x30, flush=0x20, apply=0x10, clock=12345, reply=True)
    assert data == b"r" + struct.pack("!QQQqB", 0x30, 0x20, 0x10, 12345, 1)
    assert len(data) == 34
    assert pgoutput.status_update(write=1, flush=1, apply=1, clock=0, reply=False)[-1] == 0


def test_the_protocol_clock_counts_from_its_epoch() -> None:
    assert pgoutput.pg_clock(946_684_800.0) == 0
    assert pgoutput.pg_clock(946_684_801.5) == 1_500_000
    assert pgoutput.pg_time(1_500_000) == dt.datetime(2000, 1, 1, 0, 0, 1, 500_000, dt.UTC)


@pytest.mark.parametrize("year", [2000, 2024, 2070, 2105])
def test_protocol_times_are_exact_to_the_microsecond(year: int) -> None:
    start = dt.datetime(year, 6, 1, tzinfo=dt.UTC)
    for step in range(0, 10_000_000, 7_919):  # microseconds, odd ones among them
        when = start + dt.timedelta(microseconds=step)
        assert pgoutput.pg_time((when - pgoutput.PG_EPOCH) // dt.timedelta(microseconds=1)) == when


@pytest.mark.parametrize(
    ("text", "lsn"),
    [
        ("0/0", 0),
        ("0/16B3748", 0x16B3748),
        ("16/B374D848", 0x16_B374D848),
        ("FFFFFFFF/FFFFFFFF", 2**64 - 1),
    ],
)
def test_positions_read_and_write_as_postgresql_does(text: str, lsn: int) -> None:
    assert parse_lsn(text) == lsn
    assert lsn_text(lsn) == text
    assert parse_lsn(text.lower()) == lsn


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "16",
        "16/",
        "/1",
        "x/1",
        "1/2/3",
        "123456789/0",
        "1 /2",
        "0x1/2",
        "1_0/2",
        "+1/2",
        " 1/2",
    ],
)
def test_what_is_not_a_position_is_refused_in_one_line(bad: str) -> None:
    with pytest.raises(ValueError, match="not a WAL position"):
        parse_lsn(bad)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql+psycopg://app:p%40ss@db.example:5433/shop?sslmode=require"
            "&options=-csearch_path%3Dx&prepare_threshold=5",
            {"host": "db.example", "port": "5433", "dbname": "shop", "user": "app",
             "password": "p@ss", "sslmode": "require"},
        ),
        ("postgresql://db/shop", {"host": "db", "dbname": "shop"}),
        (
            "postgresql+psycopg2://app@/shop?host=/var/run/postgresql",
            {"host": "/var/run/postgresql", "dbname": "shop", "user": "app"},
        ),
        (
            "postgresql+psycopg://app@/shop?host=h1:5432&host=h2:5433",
            {"host": "h1,h2", "port": "5432,5433", "dbname": "shop", "user": "app"},
        ),
    ],
)  # fmt: skip
def test_a_url_becomes_the_replication_connection_string(
    url: str, expected: dict[str, str]
) -> None:
    assert conninfo_to_dict(conninfo_of(url, replication=True)) == {
        **expected,
        "replication": "database",
    }
    plain = conninfo_to_dict(conninfo_of(url, replication=False))
    assert "replication" not in plain
    assert plain.get("options") == ("-csearch_path=x" if "options" in url else None)


@pytest.mark.parametrize("url", ["sqlite:///outbox.db", "mysql+pymysql://u@h/db", "not a url"])
def test_only_a_postgresql_url_has_a_connection_string(url: str) -> None:
    with pytest.raises(ValueError, match=r"(?i)postgresql") as refused:
        conninfo_of(url, replication=True)
    assert "\n" not in str(refused.value)


def test_drain_stops_when_full_and_goes_on_where_it_stopped() -> None:
    first, one = transaction(0x1000, [("outbox", b"1")])
    second, two = transaction(one + 0x10, [("outbox", b"2")])
    third, three = transaction(two + 0x10, [("outbox", b"3"), ("outbox", b"4")])
    waiting = [(len(f), memoryview(f)) for f in first + second + third]

    def get_copy_data(_async: int) -> tuple[int, memoryview]:
        return waiting.pop(0) if waiting else (0, memoryview(b""))

    decoder = Decoder("outbox")
    assert decoder.drain(get_copy_data, 2) == 6
    assert [c.end_lsn for c in decoder.ready] == [one, two]
    assert decoder.settled_up_to() == two  # nothing of the third is taken yet
    assert decoder.drain(get_copy_data, 2) == 0  # full: takes nothing
    decoder.ready = []
    assert decoder.drain(get_copy_data, 2) == 4
    assert decoder.ready == [Commit(three, AT, [b"3", b"4"])]


def test_drain_says_when_the_copy_has_ended() -> None:
    frames, _ = transaction(0x1000, [("outbox", b"1")])
    waiting = [(len(frames[0]), memoryview(frames[0])), (-1, memoryview(b""))]
    decoder = Decoder("outbox")
    assert decoder.drain(lambda _: waiting.pop(0), 10) == -1
    assert decoder.in_transaction
