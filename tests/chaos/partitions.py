"""Partitioned consumers under faults: writers commit keyed messages, the relay (`outbox-relay run
--topology FILE`) publishes them to a queue of N partitions, and consumer processes
(`outbox.Consumer(..., partitions=N)`, with the inbox) process them while they are SIGKILLed and
restarted at random, and the relay is SIGKILLed and cut off from the broker.

Checked from the database: every committed message processed (lost), none processed twice (the
inbox), none that was rolled back (unexpected), and per key the order of *processing* (the serial
of the handler's own insert, committed with the inbox record) equal to the commit order.

Everything runs in a vhost and a PostgreSQL schema of the run's own, removed afterwards.
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine, text

import outbox
from tests.chaos.checker import DeliveryChecker, Report
from tests.chaos.run import PG_URL, RELAY_FLAGS, ROOT, Keys, Relay, Row, Writers, running
from tests.support.proxy import TcpProxy
from tests.support.vhosts import own_vhost

QUEUE = "work"
TOPOLOGY = """
[[exchanges]]
name = "orders"
type = "topic"

[[queues]]
name = "work"
bindings = [{{ exchange = "orders", routing_key = "#" }}]
partitions = {partitions}
"""


@dataclass(frozen=True)
class Faults:
    consumer_kills: int
    between: tuple[float, float]  # seconds between consumer kills
    relay_kills: int = 0
    broker_cuts: int = 0
    cut_for: float = 2.0  # seconds each broker cut lasts


class Workers:
    """The consumer processes, each restarted as soon as it is killed."""

    def __init__(self, count: int, argv: list[str], log: Path) -> None:
        self.argv, self.log = argv, log
        self.processes: list[subprocess.Popen[bytes]] = []
        for _ in range(count):
            self.processes.append(self._start())
        self.kills = 0

    def _start(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            return subprocess.Popen(self.argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)

    def kill(self, i: int) -> None:
        self.processes[i].kill()
        self.processes[i].wait(10)
        self.kills += 1
        self.processes[i] = self._start()

    def index_of(self, pid: str | None) -> int | None:
        for i, p in enumerate(self.processes):
            if str(p.pid) == pid:
                return i
        return None

    def stop(self) -> None:
        for p in self.processes:
            p.send_signal(signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@contextlib.contextmanager
def _schema() -> Iterator[tuple[str, Engine]]:
    schema = f"chaos_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = f"{PG_URL}?options={urllib.parse.quote(f'-csearch_path={schema}')}"
    engine = create_engine(url, pool_size=8)
    try:
        outbox.create_schema(engine)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "CREATE TABLE chaos_processed (pos BIGSERIAL PRIMARY KEY, message_id TEXT NOT "
                    "NULL, key TEXT, n INTEGER NOT NULL, consumer TEXT NOT NULL)"
                )
            )
        yield url, engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _processed(engine: Engine) -> list[tuple[str, str | None, str]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT message_id, key, consumer FROM chaos_processed ORDER BY pos")
        )
        return [(str(i), k, str(c)) for i, k, c in rows]


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def report(checker: DeliveryChecker, processed: list[tuple[str, str | None, str]]) -> Report:
    """The checker's columns, read from what the handlers recorded: received = processed,
    duplicated = processed more than once, out of order = keys processed out of commit order."""
    order = checker.key_order()
    committed = checker.committed_ids()
    ids = [i for i, _, _ in processed]
    seen: dict[str, int] = {}
    for position, message_id in enumerate(ids):
        seen.setdefault(message_id, position)
    disordered = [
        key for key, keyed in order.items()
        if [seen[i] for i in keyed if i in seen] != sorted(seen[i] for i in keyed if i in seen)
    ]  # fmt: skip
    lost = sorted(committed - seen.keys())
    return Report(
        committed=len(committed),
        received=len(ids),
        lost=len(lost),
        unexpected=len(seen.keys() - committed),
        duplicated=len(ids) - len(seen),
        out_of_order=len(disordered),
        lost_ids=tuple(lost[:10]),
        disordered_keys=tuple(disordered[:10]),
    )


def run_partitions(
    name: str, *, messages: int, keys: int, partitions: int, consumers: int, faults: Faults,
    rate: float, workdir: Path, settle_timeout: float = 180.0, seed: int = 7,
) -> tuple[Row, int]:  # fmt: skip
    """The run's row, and how many times consumer processes were killed."""
    rng = random.Random(seed)
    checker = DeliveryChecker()
    slug = uuid.uuid4().hex[:6]
    topology = workdir / f"chaos-partitions-{slug}.toml"
    topology.write_text(TOPOLOGY.format(partitions=partitions))
    with own_vhost("chaos") as amqp_url, _schema() as (db_url, engine):
        applied = subprocess.run(
            [sys.executable, "-m", "relay", "--amqp", amqp_url, "topology", "apply", str(topology)],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if applied.returncode != 0:
            raise RuntimeError(f"{name}: topology apply failed: {applied.stderr}")
        proxy = TcpProxy("127.0.0.1", 5672)
        relay = Relay(
            db_url, proxy.url_for(amqp_url, 5672), workdir / f"chaos-partitions-relay-{slug}.log",
            flags=[*RELAY_FLAGS, "--topology", str(topology)],
        )  # fmt: skip
        worker = [sys.executable, "-m", "tests.chaos.partition_worker", db_url, amqp_url, QUEUE,
                  str(partitions)]  # fmt: skip
        workers = Workers(consumers, worker, workdir / f"chaos-partitions-consumers-{slug}.log")
        # One transaction in 25 rolls back: `messages` are those committed.
        writers = Writers(
            engine, "orders", checker, total=messages * 25 // 24, keys=Keys(cold=keys), rate=rate
        )
        relay.start()
        writers.start()
        try:
            _inject(faults, rng, workers, relay, proxy, engine)
            fault_over = time.monotonic()
            deadline = fault_over + settle_timeout
            writers.join()
            total = checker.committed_count
            while time.monotonic() < deadline:
                done = _count(engine, "SELECT count(DISTINCT message_id) FROM chaos_processed")
                if done >= total:
                    break
                relay.ensure_running()
                time.sleep(0.1)
            recovery = time.monotonic() - fault_over
            time.sleep(1.0)  # a late duplicate would be processed now
        finally:
            workers.stop()
            relay.stop()
            proxy.close()
        if writers.errors:
            raise RuntimeError(f"{name}: writers failed: {writers.errors[:3]}")
        dead = _count(engine, "SELECT count(*) FROM outbox_message WHERE state = 'dead'")
        lost_connections = relay.log.read_text(errors="replace").count("broker.lost")
        row = Row(
            name, report(checker, _processed(engine)), recovery, innocent_dead=dead,
            connections_lost=lost_connections,
        )  # fmt: skip
        return row, workers.kills


def _inject(
    faults: Faults, rng: random.Random, workers: Workers, relay: Relay, proxy: TcpProxy,
    engine: Engine,
) -> None:  # fmt: skip
    """Consumer kills at random moments, half of them aimed at the consumer that processed last
    (an active one: a random pick would mostly hit consumers standing by); the relay's kills and
    cuts in between."""
    # The cuts come before the relay's kills, so they hit a relay that has been connected for a
    # while rather than one still starting.
    picks = sorted(
        rng.sample(range(faults.consumer_kills), faults.relay_kills + faults.broker_cuts)
    )
    cut_at, relay_at = set(picks[: faults.broker_cuts]), set(picks[faults.broker_cuts :])
    running(relay)  # a fault on a relay still starting would hit nothing
    for n in range(faults.consumer_kills):
        time.sleep(rng.uniform(*faults.between))
        target: int | None = rng.randrange(len(workers.processes))
        if n % 2 == 0:
            with engine.connect() as conn:
                last = conn.execute(
                    text("SELECT consumer FROM chaos_processed ORDER BY pos DESC LIMIT 1")
                ).scalar()
            active = workers.index_of(None if last is None else str(last))
            target = target if active is None else active
        assert target is not None
        workers.kill(target)
        if n in relay_at:
            running(relay)
            relay.kill()
            relay.start()
        if n in cut_at:
            running(relay)
            proxy.cut()
            time.sleep(faults.cut_for)
            proxy.restore()


def note(row: Row, kills: int) -> str:
    return (
        f"{row.fault}: consumer processes SIGKILLed {kills} times and restarted; messages "
        "counted as processed (handler's transaction), duplicated = processed twice, out of "
        "order = keys processed out of commit order"
    )
