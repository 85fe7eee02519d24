"""Chaos on a real three-node RabbitMQ cluster (tests/faults/rabbit_cluster.py): writers commit
keyed messages, `outbox-relay run` publishes them to the cluster (given the three nodes' URLs),
an `outbox.Consumer` on another node reads the queue, and a node is SIGKILLed, paused or
restarted. Quorum queues, and one row with a classic queue to show what it costs.

    python -m tests.chaos --only cluster

Besides the table's columns each row notes the longest stretch without a delivery (the stall a
user sees) and what the relay logged: attempts burned (relay.retry), circuits opened,
connections lost. PostgreSQL only: the broker is what these faults hit.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

import outbox
from tests.chaos.checker import DeliveryChecker
from tests.chaos.run import PG_URL, ROOT, Relay, Row, Writers, settle
from tests.faults import rabbit_cluster as rc

MESSAGES = 15_000  # 30 s of traffic at RATE: every fault falls inside it
RATE = 500.0  # messages/s: the cluster's three nodes share the machine's two cores
# A 20 s confirm timeout (the default): a quorum queue answers nothing while its leader's node is
# paused, and 3 s (run.RELAY_FLAGS) would count that wait against the exchange's circuit.
FLAGS = [
    "--lease",
    "30",
    "--confirm-timeout",
    "20",
    "--poll-interval",
    "0.05",
    "--drain-timeout",
    "5",
    "--no-listen",
]


@dataclass
class Ctx:
    queue: str
    relay_node: rc.Node
    started: float = 0.0  # when the fault began (time.monotonic())
    notes: list[str] = field(default_factory=list)


Fault = Callable[[Ctx], None]


@dataclass(frozen=True)
class Scenario:
    name: str
    queue_type: str
    fault: Fault
    relay_on_leader: bool = True  # else the relay starts on a node that does not lead the queue


def _accepting(ctx: Ctx, timeout: float = 60.0) -> None:
    """Wait until a live node leads the queue (classic: its node is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = rc.leader(ctx.queue)
        if leader is not None and leader.pid() is not None:
            return
        time.sleep(0.1)


def kill_relays_node(ctx: Ctx) -> None:
    """SIGKILL the node the relay is connected to (it leads the queue too)."""
    ctx.started = time.monotonic()
    rc.kill(ctx.relay_node)
    _accepting(ctx)


def kill_leaders_node(ctx: Ctx) -> None:
    """SIGKILL the node leading the quorum queue (the relay is on another)."""
    leader = rc.leader(ctx.queue)
    assert leader is not None
    ctx.notes.append(f"leader was {leader.name}, relay on {ctx.relay_node.name}")
    ctx.started = time.monotonic()
    rc.kill(leader)
    _accepting(ctx)


def pause_relays_node(seconds: float) -> Fault:
    def fault(ctx: Ctx) -> None:
        ctx.started = time.monotonic()
        rc.pause(ctx.relay_node)
        time.sleep(seconds)
        rc.resume(ctx.relay_node)

    return fault


def rolling_restart(ctx: Ctx) -> None:
    """Stop and start each node in turn, waiting for each to run before the next."""
    ctx.started = time.monotonic()
    for n in rc.ALL:
        rc.restart(n)
        time.sleep(2.0)


def kill_and_revive_classic(down: float) -> Fault:
    """SIGKILL the node that holds the classic queue (and the relay), start it after `down` s."""

    def fault(ctx: Ctx) -> None:
        ctx.started = time.monotonic()
        rc.kill(ctx.relay_node)
        time.sleep(down)
        rc.revive(ctx.relay_node)

    return fault


def scenarios() -> list[Scenario]:
    pause = pause_relays_node(20.0)
    classic = kill_and_revive_classic(10.0)
    return [
        Scenario("cluster: SIGKILL the relay's node (quorum)", "quorum", kill_relays_node),
        Scenario("cluster: SIGKILL the leader's node (quorum)", "quorum", kill_leaders_node, False),
        Scenario("cluster: SIGSTOP the relay's node 20 s (quorum)", "quorum", pause),
        Scenario("cluster: rolling restart (quorum)", "quorum", rolling_restart),
        Scenario("cluster: SIGKILL the queue's node 10 s (classic)", "classic", classic),
    ]


@contextlib.contextmanager
def environment(queue_type: str) -> Iterator[tuple[str, Engine, str, str]]:
    """A PostgreSQL schema, and an exchange and queue declared on the cluster with `outbox-relay
    topology apply` (from node 1: a classic queue lives there); all removed afterwards."""
    suffix = uuid.uuid4().hex[:10]
    schema, exchange, queue = f"chaos_{suffix}", f"chaos.{suffix}", f"chaos.{suffix}.q"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = f"{PG_URL}?options={urllib.parse.quote(f'-csearch_path={schema}')}"
    engine = create_engine(url, pool_size=8)
    outbox.create_schema(engine)
    spec = Path(f"/tmp/{schema}.toml")
    spec.write_text(
        f'[[exchanges]]\nname = "{exchange}"\ntype = "topic"\n\n'
        f'[[queues]]\nname = "{queue}"\ntype = "{queue_type}"\n'
        f'bindings = [{{ exchange = "{exchange}", routing_key = "#" }}]\n'
    )
    subprocess.run(
        [sys.executable, "-m", "relay", "--amqp", rc.urls(), "topology", "apply", str(spec)],
        cwd=ROOT, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    spec.unlink()
    try:
        yield url, engine, exchange, queue
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


class ClusterConsumer:
    """`outbox.Consumer` (with its inbox) on another node of the cluster than the relay's,
    started again whenever its connection fails, as a supervisor would."""

    def __init__(self, engine: Engine, node: rc.Node, queue: str, checker: DeliveryChecker):
        def handle(_session: Session, message: outbox.Message) -> None:
            checker.received(str(message.id))

        # Every node, its own first: it moves on when its node restarts, as the relay does.
        urls = rc.urls(first=node.n)
        self.consumer = outbox.Consumer(engine, urls, queue, handle, inbox_retention=None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-cluster")
        self.restarts = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.consumer.stop()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.consumer.run()
            except Exception:  # its node went away: start it again
                self.restarts += 1
                time.sleep(0.5)


def longest_gap(checker: DeliveryChecker, since: float) -> float:
    """The longest stretch without a first arrival, from `since` to the last arrival."""
    times = sorted(t for t in checker.arrival_times(checker.committed_ids()) if t >= since)
    gaps = [b - a for a, b in zip([since, *times], times, strict=False)]
    return max(gaps, default=0.0)


def _count(log: str, event: str) -> int:
    return len(re.findall(rf"\b{re.escape(event)}\b", log))


def run_scenario(s: Scenario, messages: int, workdir: Path) -> tuple[Row, str]:
    rc.up()  # whole again after the row before
    checker = DeliveryChecker()
    with environment(s.queue_type) as (db_url, engine, exchange, queue):
        leader = rc.leader(queue) if s.queue_type == "quorum" else rc.ALL[0]
        assert leader is not None
        relay_node = leader if s.relay_on_leader else next(n for n in rc.ALL if n != leader)
        others = [n for n in rc.ALL if n not in (leader, relay_node)]
        consumer_node = others[0] if others else next(n for n in rc.ALL if n != relay_node)
        slug = re.sub(r"[^a-z0-9]+", "-", s.name.lower()).strip("-")
        log = workdir / f"chaos-{slug}-{uuid.uuid4().hex[:6]}.log"
        relay = Relay(db_url, rc.urls(first=relay_node.n), log, flags=FLAGS)
        consumer = ClusterConsumer(engine, consumer_node, queue, checker)
        writers = Writers(engine, exchange, checker, total=messages, rate=RATE)
        ctx = Ctx(queue, relay_node)
        consumer.start()
        relay.start()
        writers.start()
        try:
            time.sleep(5.0)  # traffic flowing, the relay connected
            s.fault(ctx)
            _, recovered = settle(checker, relay, writers, 300, late=1.0)
        finally:
            relay.stop()
            consumer.stop()
        gap = longest_gap(checker, ctx.started)
        with engine.connect() as conn:
            dead = conn.execute(
                text("SELECT count(*) FROM outbox_message WHERE state = 'dead'")
            ).scalar_one()
    text_log = log.read_text(errors="replace")
    row = Row(s.name, checker.report(), recovered, innocent_dead=int(dead),
              connections_lost=_count(text_log, "broker.lost"))  # fmt: skip
    note = (
        f"{s.name}: longest stretch without a delivery {gap:.1f} s from the fault; "
        f"attempts burned (relay.retry lines) {_count(text_log, 'relay.retry')}, circuits "
        f"opened {_count(text_log, 'circuit.opened')}, consumer restarts {consumer.restarts}"
        + (f"; {'; '.join(ctx.notes)}" if ctx.notes else "")
    )
    return row, note


def run_all(wanted: list[str], messages: int, workdir: Path) -> Iterator[tuple[Row, str]]:
    """Each wanted scenario in turn (name prefixes; none: all), the cluster up for them and
    torn down at the end."""
    chosen = [s for s in scenarios() if not wanted or any(s.name.startswith(w) for w in wanted)]
    if not chosen:
        return
    try:
        for s in chosen:
            started = time.monotonic()
            print(f"chaos: {s.name}, {messages:,} messages ...", flush=True)
            row, note = run_scenario(s, messages, workdir)
            print(f"chaos: {row.fault}: {'ok' if row.ok else 'FAILED'} "
                  f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
            yield row, note
    finally:
        rc.down()
