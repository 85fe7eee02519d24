"""Record a real relay's /metrics under real faults into tests/prometheus/alerts_test.yaml.

    make alert-series          (python -m tests.prometheus.record [--only NAME ...])

Each scenario runs a real relay (`python -m relay ... run --http-port N`) on a PostgreSQL schema
of its own and the local RabbitMQ, produces its fault for real, and scrapes /metrics once every
`SPACING` seconds; the scenarios run side by side, so a recording takes about two minutes. Its
expectations say which alerts must be firing at which scrape: none while healthy, the fault's
alert once its `for` has passed.

How real scrapes map to promtool's series: scrape i is the sample at i x `INTERVAL` (one real
second is one minute of promtool's time, a factor of 60). What the relay measures in time is
multiplied by the same factor, so it agrees with the compressed clock: the oldest ready message's
age (seconds), the latency histogram's bucket bounds (`le`, milliseconds: a real 250 ms is
15 s) and the WAL a replication slot keeps (it piles up with time: what a real second writes is
what a minute would). Counts and states are kept as scraped. A failed scrape (the relay is down)
gives every series a stale marker, as Prometheus writes one, and `up` 0. Labels get the job and
instance a scrape adds, and the run's random exchange prefix is removed (`orders`, not
`ar.1f2e.orders`; a slot is `outbox_relay`), so a new recording changes only what the relay did
differently.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pika
import yaml
from sqlalchemy import Engine, create_engine, make_url

import outbox
from relay.core.urls import node_name
from tests.prometheus import series
from tests.prometheus.processes import (
    ALERTS,
    ROOT,
    capture_database,
    get,
    outbox_schema,
    start_relay,
)
from tests.prometheus.processes import stop as stop_process
from tests.support.broker import AMQP_URL
from tests.support.ports import free_port

OUT = ROOT / "tests" / "prometheus" / "alerts_test.yaml"
SPACING = 1.0  # real seconds between two scrapes
INTERVAL = "1m"  # promtool's time between two samples
SCALE = 60.0 / SPACING  # promtool seconds per real second
TARGET = {"job": "outbox-relay", "instance": "relay-1:9464"}
RESOURCE = f"{node_name(AMQP_URL)}/%2F/"  # a circuit's resource, before the exchange name

Firing = tuple[str, Mapping[str, str]]  # an alert's name and the labels its expression keeps


class Run:
    """One scenario's live parts: its schema, exchanges (`orders` is routed to a queue, `unbound`
    to none, `missing` is never declared) and relay."""

    def __init__(self, db_url: str, prefix: str, relay_args: Sequence[str]) -> None:
        self.db_url = db_url
        self.prefix = prefix
        self.port = free_port()
        self.engine: Engine = create_engine(db_url, pool_size=1)
        self.args = [a.format(**{n: self.exchange(n) for n in ("orders", "unbound")})
                     for a in relay_args]  # fmt: skip
        self.relay: Any = None
        self.holder: Any = None  # a capture scenario's first relay, holding the slot

    def exchange(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def enqueue(self, name: str, n: int) -> None:
        with self.engine.begin() as conn:
            outbox.enqueue_many(conn, [
                {"exchange": self.exchange(name), "routing_key": "order.created",
                 "payload": {"n": i}} for i in range(n)
            ])  # fmt: skip

    def start(self) -> None:
        self.relay = start_relay(self.db_url, self.port, *self.args)

    def stop(self) -> None:
        stop_process(self.relay)

    def scrape(self, keep: set[str]) -> dict[series.Key, float] | None:
        text = get(f"http://127.0.0.1:{self.port}/metrics")
        return None if text is None else series.parse(text, keep)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str  # the promtool test's name: the fault, in words
    ticks: int  # scrapes
    act: Callable[[Run, int], None]  # what happens after scrape i
    expect: Mapping[int, Sequence[Firing]]  # scrape -> the alerts firing then, exactly
    relay_args: Sequence[str] = ()  # {orders} and {unbound} are the exchanges' real names
    # Logical capture: a database of its own with a slot, and a first relay holding the slot
    # (unscraped; `act` gets it as run.holder) before the scraped one starts, its standby.
    capture: bool = False


def traffic(run: Run, tick: int) -> None:
    run.enqueue("orders", 5)


def falling_behind(run: Run, tick: int) -> None:
    if tick >= 3:
        run.enqueue("orders", 20)  # 20/s against a relay limited to 5/s
    else:
        traffic(run, tick)


def destination_missing(run: Run, tick: int) -> None:
    traffic(run, tick)
    if tick == 3:
        run.enqueue("missing", 10)


def dying(run: Run, tick: int) -> None:
    traffic(run, tick)
    if tick >= 3:
        run.enqueue("unbound", 1)


def slot_holder_hangs(run: Run, tick: int) -> None:
    """The relay holding the slot stops (SIGSTOP: its connection stays up, so the slot stays
    taken) while the application writes 2 MB of WAL a second; the scraped relay waits as its
    standby, and its gauges show the WAL the slot keeps."""
    if tick == 3:
        os.kill(run.holder.pid, signal.SIGSTOP)
    with run.engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO ballast SELECT gen_random_bytes(1024) FROM generate_series(1, 2048)"
        )


def relay_down(run: Run, tick: int) -> None:
    traffic(run, tick)
    if tick == 5:
        run.stop()
    elif tick == 13:
        run.start()


WAITING: Firing = ("OutboxMessagesWaiting", {})
SCENARIOS = (
    Scenario(
        "healthy: 5 messages a second published at once, nothing fires",
        96, traffic, {3: (), 30: (), 60: (), 95: ()},
    ),
    Scenario(
        "backlog: 20 messages a second to a relay limited to 5 (--rate-limit)",
        56, falling_behind,
        {2: (), 55: (WAITING, ("OutboxStuck", {}), ("OutboxPublishSlow", {}))},
        relay_args=("--rate-limit", "{orders}=5"),
    ),
    Scenario(
        "circuit open: messages to an exchange that does not exist wait",
        24, destination_missing,
        {2: (), 23: (("OutboxCircuitOpen", {"resource": f"{RESOURCE}missing"}), WAITING)},
    ),
    Scenario(
        "dead letters: a message a second to an exchange no queue is bound to",
        96, dying,
        {2: (), 95: (("OutboxDeadMessagesGrowing", {"exchange": "unbound"}),
                     ("OutboxDeadMessagesPiling", {}))},
        relay_args=("--unroutable-grace", "0"),
    ),
    Scenario(
        "relay down: the only relay stopped for 8 s (8 minutes), then started again",
        19, relay_down, {4: (), 12: (("OutboxNoRelayAlive", {}),), 18: ()},
    ),
    Scenario(
        "capture: the relay holding the slot hangs while 2 MB of WAL a second is written",
        30, slot_holder_hangs,
        {2: (), 29: (("OutboxCaptureSlotBehind", {"slot": "outbox_relay"}),)},
        capture=True,
    ),
)  # fmt: skip


def alert_rules() -> dict[str, str]:
    """Each alert's name and severity in alerts.yaml."""
    (group,) = yaml.safe_load(ALERTS.read_text())["groups"]
    return {r["alert"]: r["labels"]["severity"] for r in group["rules"]}


def metrics_named() -> set[str]:
    """The metrics the alert expressions read (histograms by their `_bucket` series)."""
    return set(re.findall(r"\boutbox_[a-z0-9_]+", ALERTS.read_text()))


def record(scenario: Scenario, keep: set[str]) -> list[series.Scrape]:
    """Run `scenario` for real; its scrapes, on the compressed clock."""
    prefix = f"ar.{uuid.uuid4().hex[:8]}."
    where = capture_database() if scenario.capture else outbox_schema("alerts")
    with where as db_url, Exchanges(prefix):
        slot = make_url(db_url).database if scenario.capture else None
        args = list(scenario.relay_args)
        if slot is not None:
            args += ["--capture", "logical", "--capture-slot", slot]

        def rename(value: str) -> str:
            value = value.replace(prefix, "")
            return "outbox_relay" if value == slot else value

        run = Run(db_url, prefix, args)
        if slot is not None:
            run.holder = start_relay(db_url, free_port(), *run.args)
            wait_for(lambda: slot_active(run.engine, slot), f"{scenario.name}: slot taken")
        run.start()
        try:
            deadline = time.monotonic() + 30
            while run.scrape(keep) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{scenario.name}: the relay never served /metrics")
                time.sleep(0.1)
            scrapes: list[series.Scrape] = []
            start = time.monotonic()
            for tick in range(scenario.ticks):
                time.sleep(max(0.0, start + tick * SPACING - time.monotonic()))
                scraped = run.scrape(keep)
                scrapes.append(None if scraped is None else series.rescale(scraped, SCALE, rename))
                scenario.act(run, tick)
        finally:
            run.stop()
            if run.holder is not None:
                os.kill(run.holder.pid, signal.SIGCONT)
                stop_process(run.holder)
            run.engine.dispose()
    return scrapes


def slot_active(engine: Engine, slot: str) -> bool:
    from relay.capture import admin

    return admin.slot_state(engine, slot, publication=slot).active


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {what}")
        time.sleep(0.1)


class Exchanges:
    """The run's exchanges and the queue `orders` routes to, deleted afterwards."""

    def __init__(self, prefix: str) -> None:
        self.conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        self.channel = self.conn.channel()
        self.names = (f"{prefix}orders", f"{prefix}unbound")
        for name in self.names:
            self.channel.exchange_declare(name, exchange_type="topic", durable=True)
        self.queue = f"{prefix}orders.q"
        self.channel.queue_declare(self.queue)
        self.channel.queue_bind(self.queue, self.names[0], "#")

    def __enter__(self) -> Exchanges:
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.queue_delete(self.queue)
        for name in self.names:
            self.channel.exchange_delete(name)
        self.conn.close()


def test_case(scenario: Scenario, scrapes: list[series.Scrape], severity: Mapping[str, str]) -> Any:
    checks = []
    for tick, firing in sorted(scenario.expect.items()):
        samples = []
        for name, labels in firing:
            shown = {"alertname": name, "alertstate": "firing", "severity": severity[name],
                     **labels}  # fmt: skip
            inner = ",".join(f'{k}="{v}"' for k, v in sorted(shown.items()))
            samples.append({"labels": f"ALERTS{{{inner}}}", "value": 1})
        checks.append({"expr": 'ALERTS{alertstate="firing"}', "eval_time": f"{tick}m",
                       "exp_samples": samples})  # fmt: skip
    return {
        "name": scenario.name,
        "interval": INTERVAL,
        "input_series": series.input_series(scrapes, TARGET),
        "promql_expr_test": checks,
    }


HEADER = """\
# Generated by `make alert-series` (tests/prometheus/record.py) from a real relay's /metrics
# under real faults: do not edit; record again after changing an alert or a metric. One sample
# per real second of scraping, one minute apart here (record.py says how values are scaled).
# Each check lists exactly the alerts firing at that time. Run by
# tests/integration/test_prometheus_rules.py: promtool test rules tests/prometheus/alerts_test.yaml
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="scenarios whose name starts with these words")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    chosen = [s for s in SCENARIOS if not args.only or s.name.split()[0].rstrip(":") in args.only]
    keep = metrics_named()
    results: dict[str, list[series.Scrape]] = {}
    errors: list[str] = []

    def one(scenario: Scenario) -> None:
        try:
            results[scenario.name] = record(scenario, keep)
        except Exception as exc:  # reported once all have stopped
            errors.append(f"{scenario.name}: {exc!r}")

    threads = [threading.Thread(target=one, args=(s,)) for s in chosen]
    print(f"recording {len(threads)} scenarios for {max(s.ticks for s in chosen)} s...",
          file=sys.stderr)  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    severity = alert_rules()
    document = {
        "rule_files": [os.path.relpath(ALERTS, args.out.resolve().parent)],
        "evaluation_interval": INTERVAL,
        "tests": [test_case(s, results[s.name], severity) for s in chosen],
    }
    text = yaml.safe_dump(document, sort_keys=False, width=200)
    args.out.write_text(HEADER + text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
