"""`make soak`: the relay for a long time at a steady rate with retention on, and whether what
could grow with time stays flat.

    python -m benchmarks.soak [--minutes 30] [--rate 1000] [--every 60] [--retain 1m]
                              [--db URL] [--amqp URL]

It runs on a database of its own (dropped afterwards) and a queue that keeps only its newest
messages (`x-max-length`: the broker drops the oldest, so nothing has to consume). Writer threads
commit `--rate` messages a second through `outbox.enqueue` (ten to a transaction), and
`outbox-relay run` relays them as a subprocess, with `--retain-published` and `/metrics` on.
Every `--every` seconds one line: the relay's resident memory, the size of outbox_message on
disk (heap, indexes and TOAST), the mean claim time over the interval (the relay's own
`outbox_claim_duration_milliseconds` histogram), what was written and published a second, the
ready backlog, and outbox_message's dead-row ratio (PostgreSQL).

Flat, for each of memory, table size and claim time: after the warm-up (the retention window
plus one minute, while the table fills up to what retention keeps), the samples are cut in
thirds, and the median of the last third is at most TOLERANCE (20%) above the first third's,
or within the series' small absolute slack (noise at small values: 5 MB, 1 MB, 0.5 ms).
Fewer than three samples after the warm-up judge nothing. Exit 0 when every series is flat,
1 when one grows, 2 when the run was too short to tell.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pika
from sqlalchemy import Engine, text

import outbox
from benchmarks.drain import relay_command
from benchmarks.fixtures import BenchDatabase, make_payload
from relay.core.durations import parse_duration

SUMMARY = "the relay at a steady rate for a long time: are memory, table size, claim time flat?"
DEFAULT_DB = os.environ.get("BENCH_DB_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
DEFAULT_AMQP = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
PER_TRANSACTION = 10  # messages a writer commits together
QUEUE_KEEPS = 10_000  # the queue's x-max-length: the newest messages, the rest dropped
TOLERANCE = 0.20
SLACK = {"rss": 5.0, "table": 1.0, "claim": 0.5}  # MB, MB, ms
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)$")


# --------------------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Verdict:
    series: str
    first: float  # median of the first third after the warm-up
    last: float  # median of the last third
    flat: bool

    def line(self, unit: str) -> str:
        change = (self.last / self.first - 1.0) * 100 if self.first > 0 else 0.0
        word = "flat" if self.flat else "GROWING"
        return (
            f"  {self.series:<11} {self.first:9.2f} {unit} -> {self.last:9.2f} {unit}"
            f"  ({change:+.0f}%)  {word}"
        )


def judge(series: str, values: Sequence[float], slack: float) -> Verdict | None:
    """Whether `values` (the samples after the warm-up, in order) stay flat; None for fewer
    than three."""
    if len(values) < 3:
        return None
    third = len(values) // 3
    first = statistics.median(values[:third])
    last = statistics.median(values[-third:])
    flat = last <= first * (1.0 + TOLERANCE) or last - first <= slack
    return Verdict(series, first, last, flat)


# --------------------------------------------------------------------------- readings


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the start
    rss_mb: float
    table_mb: float
    claim_ms: float | None  # mean over the interval; None when no claim ran in it
    written: int
    published: float
    ready: float | None
    dead_ratio: float | None


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def table_mb(engine: Engine, mysql: bool) -> float:
    if mysql:
        # InnoDB's figures, refreshed by its own statistics (not at every change).
        query = (
            "SELECT data_length + index_length FROM information_schema.tables "
            "WHERE table_schema = DATABASE() AND table_name = 'outbox_message'"
        )
    else:
        query = "SELECT pg_total_relation_size('outbox_message')"
    with engine.connect() as conn:
        return float(conn.execute(text(query)).scalar_one() or 0) / 1e6


def scrape(port: int) -> dict[str, float]:
    """/metrics as {name{labels}: value}, and each name summed over its labels as {name: sum}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body = response.read().decode()
    found: dict[str, float] = {}
    for line in body.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
        found[name + labels] = value
        if labels:
            found[name] = found.get(name, 0.0) + value
    return found


def _labelled(metrics: dict[str, float], name: str, **labels: str) -> float | None:
    for key, value in metrics.items():
        if key.startswith(name + "{") and all(f'{k}="{v}"' in key for k, v in labels.items()):
            return value
    return None


# --------------------------------------------------------------------------- the load


class Writers:
    """`threads` threads committing `rate` messages a second between them, PER_TRANSACTION to a
    transaction, paced to the clock (a late one catches up)."""

    def __init__(
        self, engine: Engine, exchange: str, rate: float, payload: int, threads: int = 2
    ) -> None:
        self.engine, self.exchange = engine, exchange
        self.pause = PER_TRANSACTION * threads / rate
        self.payload = make_payload(0, payload)
        self.written = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._write, daemon=True) for _ in range(threads)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _write(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            next_at += self.pause
            self._stop.wait(max(0.0, next_at - time.monotonic()))
            try:
                with self.engine.begin() as conn:
                    for _ in range(PER_TRANSACTION):
                        outbox.enqueue(
                            conn, exchange=self.exchange, routing_key="soak", payload=self.payload
                        )
            except Exception as exc:  # reported at the end; the soak goes on
                self.errors.append(repr(exc))
                continue
            with self._lock:
                self.written += PER_TRANSACTION


class Vacuum:
    """VACUUM the tables the relay churns every `every` seconds, as a scheduled job would where
    the server's autovacuum is off (on the soak's own database only)."""

    def __init__(self, engine: Engine, every: float) -> None:
        self.engine = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-vacuum")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            with self.engine.connect() as conn:
                conn.exec_driver_sql("VACUUM outbox_message, outbox_attempt")


def declare(amqp_url: str, name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        channel.exchange_declare(name, "topic", durable=True)
        channel.queue_declare(name, durable=True, arguments={"x-max-length": QUEUE_KEEPS})
        channel.queue_bind(name, name, "#")
    finally:
        conn.close()


def undeclare(amqp_url: str, name: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = conn.channel()
        channel.queue_delete(name)
        channel.exchange_delete(name)
    finally:
        conn.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- the run


HEADER = (
    f"{'minute':>7} {'rss MB':>8} {'table MB':>9} {'claim ms':>9} {'written/s':>10} "
    f"{'published/s':>12} {'ready':>7} {'dead ratio':>10}"
)


def row(s: Sample, previous: Sample | None) -> str:
    span = s.at - (previous.at if previous else 0.0)
    written = (s.written - (previous.written if previous else 0)) / span
    published = (s.published - (previous.published if previous else 0.0)) / span

    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    return (
        f"{s.at / 60:7.2f} {s.rss_mb:8.1f} {s.table_mb:9.1f} {fmt(s.claim_ms, '9.2f'):>9} "
        f"{written:10.0f} {published:12.0f} {fmt(s.ready, '7.0f'):>7} "
        f"{fmt(s.dead_ratio, '10.3f'):>10}"
    )


def verdicts(samples: Sequence[Sample], warm_up: float) -> list[tuple[Verdict | None, str]]:
    after = [s for s in samples if s.at > warm_up]
    claims = [s.claim_ms for s in after if s.claim_ms is not None]
    return [
        (judge("rss", [s.rss_mb for s in after], SLACK["rss"]), "MB"),
        (judge("table size", [s.table_mb for s in after], SLACK["table"]), "MB"),
        (judge("claim time", claims, SLACK["claim"]), "ms"),
    ]


def soak(args: argparse.Namespace) -> int:
    name = f"outbox_soak_{os.getpid()}"
    retain = parse_duration(args.retain)
    warm_up = retain + 60.0 if args.warm_up is None else args.warm_up
    db = BenchDatabase(args.db, name)
    db.create()
    assert db.engine is not None
    declare(args.amqp, name)
    port = free_port()
    logdir = Path(tempfile.mkdtemp(prefix="outbox-soak-"))
    log = logdir / "relay.log"
    cmd = [*relay_command(), "--db", db.url, "--amqp", args.amqp, "run", "--relay-id", name,
           "--http-port", str(port), "--http-host", "127.0.0.1",
           "--retain-published", args.retain]  # fmt: skip
    writers = Writers(db.engine, name, args.rate, args.payload_bytes)
    print(f"soak: {db.product} {db.server_version()}, {args.minutes:g} min at {args.rate:,.0f} "
          f"msg/s, retention {args.retain}, a line every {args.every:g} s; relay log {log}",
          flush=True)  # fmt: skip
    samples: list[Sample] = []
    vacuum: Vacuum | None = None
    with log.open("wb") as sink:
        relay = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink)
    try:
        start = time.monotonic()
        while True:
            try:
                scrape(port)
                break
            except OSError:
                if relay.poll() is not None or time.monotonic() - start > 60:
                    raise RuntimeError(f"the relay did not start: see {log}") from None
                time.sleep(0.1)
        writers.start()
        vacuum = (
            Vacuum(db.engine, args.vacuum_every) if args.vacuum_every and not db.mysql else None
        )
        if vacuum is not None:
            vacuum.start()
            print(f"soak: vacuuming outbox_message and outbox_attempt every "
                  f"{args.vacuum_every:g} s (--vacuum-every)", flush=True)  # fmt: skip
        start = time.monotonic()
        end = start + args.minutes * 60
        print(HEADER, flush=True)
        claims = (0.0, 0.0)  # the histogram's sum and count at the last sample
        while time.monotonic() < end:
            due = min(end, start + (len(samples) + 1) * args.every)
            time.sleep(max(0.0, due - time.monotonic()))
            if relay.poll() is not None:
                raise RuntimeError(f"the relay exited with {relay.returncode}: see {log}")
            metrics = scrape(port)
            total = (
                metrics.get("outbox_claim_duration_milliseconds_sum", 0.0),
                metrics.get("outbox_claim_duration_milliseconds_count", 0.0),
            )
            claimed = total[1] - claims[1]
            claim_ms = (total[0] - claims[0]) / claimed if claimed > 0 else None
            claims = total
            sample = Sample(
                at=time.monotonic() - start,
                rss_mb=rss_mb(relay.pid),
                table_mb=table_mb(db.engine, db.mysql),
                claim_ms=claim_ms,
                written=writers.written,
                published=metrics.get("outbox_messages_published_total", 0.0),
                ready=_labelled(metrics, "outbox_messages", state="ready"),
                dead_ratio=_labelled(metrics, "outbox_table_dead_ratio", table="outbox_message"),
            )
            print(row(sample, samples[-1] if samples else None), flush=True)
            samples.append(sample)
    finally:
        writers.stop()
        if vacuum is not None:
            vacuum.stop()
        if relay.poll() is None:
            relay.send_signal(signal.SIGTERM)
            try:
                relay.wait(60)
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait()
        undeclare(args.amqp, name)
        db.drop()
    for line in log.read_text(errors="replace").splitlines():
        if " warning " in line and "schema." in line:
            print(f"relay: {line}")
    if writers.errors:
        print(f"soak: {len(writers.errors)} transactions failed, the first: {writers.errors[0]}")
    judged = verdicts(samples, warm_up)
    print(f"verdict, after a {warm_up / 60:.1f} min warm-up (flat: the last third's median at "
          f"most {TOLERANCE:.0%} above the first third's, or within a small slack):")  # fmt: skip
    for verdict, unit in judged:
        if verdict is not None:
            print(verdict.line(unit))
    if any(v is None for v, _ in judged):
        print("  too few samples after the warm-up to judge: run longer, or sample more often")
        return 2
    return 0 if all(v is not None and v.flat for v, _ in judged) else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=SUMMARY)
    p.add_argument("--minutes", type=float, default=30.0, help="how long (30)")
    p.add_argument("--rate", type=float, default=1000.0, help="messages a second written (1000)")
    p.add_argument("--every", type=float, default=60.0, help="seconds between lines (60)")
    p.add_argument("--retain", default="1m", help="the relay's --retain-published (1m)")
    p.add_argument(
        "--warm-up", type=float, default=None,
        help="seconds left out of the verdict (default: the retention window plus 60)",
    )  # fmt: skip
    p.add_argument("--payload-bytes", type=int, default=256, help="JSON body size (256)")
    p.add_argument(
        "--vacuum-every", type=float, default=0.0,
        help="PostgreSQL: VACUUM the soak's tables this often (seconds), standing in for an "
        "autovacuum the server has off (0: never, the default)",
    )  # fmt: skip
    p.add_argument("--db", default=DEFAULT_DB, help="admin database URL (env BENCH_DB_URL)")
    p.add_argument("--amqp", default=DEFAULT_AMQP, help="AMQP URL (env BENCH_AMQP_URL)")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0 or args.every <= 0:
        p.error("--minutes, --rate and --every must be positive")
    return soak(args)


if __name__ == "__main__":
    sys.exit(main())
