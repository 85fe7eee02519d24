"""The relay draining a backlog: in this process, as the `outbox-relay run` subprocess, and two
diagnostic halves of it (the store alone, the publisher alone) that show where the time goes.

Every figure is messages over seconds from the moment the relay (or half) starts working on a
backlog that is already committed, to the moment the last row is marked published.
"""

from __future__ import annotations

import cProfile
import dataclasses
import importlib
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.fixtures import BenchDatabase
from benchmarks.machine import CpuMeter, CpuSplit
from relay.amqp.publisher import Publisher
from relay.core.outcome import Fate, Outcome
from relay.core.signing import Keyring
from relay.loop.counts import Counts
from relay.loop.relay import utc_now
from relay.loop.wiring import wire_relay
from relay.ports import Outgoing
from relay.runtime import heap
from relay.runtime.config import RelayConfig
from relay.store.sql_store import open_store

DB_POLL = 0.02  # seconds between progress checks against the database (subprocess)


class DrainError(RuntimeError):
    """A drain did not complete: timed out, or rows were left unpublished."""


@dataclass(slots=True)
class DrainResult:
    name: str
    messages: int
    seconds: float
    cpu: CpuSplit | None = None  # who used the machine's CPU during the drain
    peak_rss_bytes: int | None = None
    startup_seconds: float | None = None  # subprocess: spawn to `relay.started`
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


def _check_all_published(db: BenchDatabase, expected: int, what: str) -> None:
    states = db.by_state()
    if states.get("published", 0) != expected or sum(states.values()) != expected:
        raise DrainError(f"{what}: expected {expected} published rows, found {states}")


# --------------------------------------------------------------------------- in-process


def drain_in_process(
    db: BenchDatabase,
    amqp_url: str,
    *,
    timeout: float,
    profile_dir: Path | None = None,
    db_url: str | None = None,
    signing: Keyring | None = None,
    expected: int | None = None,
    capture_slot: str | None = None,
    database_pids: Callable[[], Mapping[int, str]] | None = None,
) -> DrainResult:
    """Relay the backlog with the relay's own parts, wired as `relay.runtime.runner` does
    (through `db_url` when given: the same database, other connection options; signing each
    message with `signing` when given). The drain ends when every restored row is published,
    or with `expected`, when that many are (then the caller checks what the others became).

    With `capture_slot`, the backlog is `expected` messages in that replication slot, and the
    relay reads them from it (`--capture logical`): the drain ends when that many are confirmed,
    and then the table must hold no row (none took the table's path). With `database_pids`,
    only the server processes it names at the end count as the database's CPU (CpuMeter)."""
    check = expected is None and capture_slot is None
    expected = db.restored if expected is None else expected
    config = RelayConfig(db_url=db_url or db.url, amqp_url=amqp_url, relay_id="bench-in-process")
    if capture_slot is not None:
        config = dataclasses.replace(config, capture="logical", capture_slot=capture_slot)
    # As the runner opens it: statement timeout, no commit waits for the disk, no JIT, prepared
    # statements on a direct connection.
    store = open_store(
        config.db_url, statement_timeout=config.statement_timeout, relaxed_commit=True
    )
    source = None
    if capture_slot is not None:
        from relay.runtime.capture import log_source  # psycopg's: PostgreSQL only

        source = log_source(config, store, utc_now)
    publisher = Publisher(
        config.amqp_url,
        confirm_timeout=config.confirm_timeout,
        name="outbox-relay bench",
        signing=signing,
    )
    publisher.start()
    # The end of the drain is seen from inside the store's mark_published (or the log's, which
    # settles what the broker confirmed by moving the slot), not by polling: a polling thread
    # would compete for the GIL with the relay's thread and skew the figure. The wrapper only
    # counts; the relay runs the real method.
    marked = 0
    all_marked = threading.Event()
    finished = 0.0
    settles: Any = store if source is None else source
    real_mark = settles.mark_published

    def counting_mark(token: uuid.UUID, seqs: Sequence[int]) -> int:
        nonlocal marked, finished
        n: int = real_mark(token, seqs)
        marked += n  # only the relay-loop thread calls this
        if marked >= expected and not all_marked.is_set():
            finished = time.perf_counter()
            all_marked.set()
        return n

    setattr(settles, "mark_published", counting_mark)  # noqa: B010 - instance-level wrap
    relay = wire_relay(store, publisher, config, source=source)
    heap.settle()  # as the runner does before the loop starts
    summary: list[Counts] = []
    failure: list[BaseException] = []
    relay_profile = cProfile.Profile() if profile_dir is not None else None

    def run() -> None:
        try:
            if relay_profile is not None:
                relay_profile.enable()
            summary.append(relay.run())
        except BaseException as exc:
            failure.append(exc)
        finally:
            if relay_profile is not None:
                relay_profile.disable()
            all_marked.set()  # wake the waiting thread if the relay stopped early

    thread = threading.Thread(target=run, name="relay-loop", daemon=True)
    meter = CpuMeter(database=database_pids)
    meter.start()
    started = time.perf_counter()
    thread.start()
    try:
        if not all_marked.wait(timeout) or marked < expected:
            raise DrainError(
                f"in-process relay: {marked} of {expected} published "
                + ("before it stopped" if not thread.is_alive() else f"after {timeout:.0f} s")
                + (f": {failure[0]!r}" if failure else "")
            )
        cpu = meter.stop(finished - started)
    finally:
        relay.request_stop()
        thread.join(30)
        if not thread.is_alive():  # its thread ran the publisher's loop: now this one may
            publisher.stop()
        store.close()
    if failure:
        raise DrainError(f"in-process relay failed: {failure[0]!r}") from failure[0]
    if check:
        _check_all_published(db, expected, "in-process relay")
    if capture_slot is not None and (states := db.by_state()):
        raise DrainError(f"in-process relay, from the log: rows in the table: {states}")
    result = DrainResult("in-process", expected, finished - started, cpu=cpu)
    if summary and summary[0].failures:
        result.notes.append(f"publish failures: {summary[0].failures}")
    if profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
        if relay_profile is not None:
            relay_profile.dump_stats(profile_dir / "relay-loop.prof")
    return result


# --------------------------------------------------------------------------- subprocess


def relay_command() -> list[str]:
    """`outbox-relay` from the same environment as this interpreter."""
    beside = Path(sys.executable).with_name("outbox-relay")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("outbox-relay")
    return [found] if found else [sys.executable, "-m", "relay"]


def _peak_rss(pid: int) -> int | None:
    """The high-water mark of resident memory (VmHWM) of a live process, in bytes."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    psutil = _psutil()
    try:
        return int(psutil.Process(pid).memory_info().rss) if psutil else None  # current, not peak
    except Exception:
        return None


def _psutil() -> Any:
    try:
        return importlib.import_module("psutil")
    except ImportError:
        return None


def drain_subprocess(db: BenchDatabase, amqp_url: str, *, timeout: float) -> DrainResult:
    """Relay the backlog with `outbox-relay --db URL run`, as an operator runs it."""
    expected = db.restored
    cmd = [
        *relay_command(),
        "--db",
        db.url,
        "--amqp",
        amqp_url,
        "--log-level",
        "INFO",
        "run",
        "--relay-id",
        "bench-subprocess",
    ]
    spawned = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    log_tail: deque[str] = deque(maxlen=40)
    started_at: list[float] = []
    started = threading.Event()

    def read_log() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log_tail.append(line.rstrip())
            if not started.is_set() and " relay.started" in line:
                started_at.append(time.perf_counter())
                started.set()

    reader = threading.Thread(target=read_log, name="relay-log", daemon=True)
    reader.start()

    def failed(why: str) -> DrainError:
        tail = "\n    ".join(log_tail)
        return DrainError(f"subprocess relay {why}; command: {' '.join(cmd)}\n    {tail}")

    try:
        while not started.wait(0.05):
            if proc.poll() is not None:
                raise failed(f"exited with {proc.returncode} before starting")
            if time.perf_counter() - spawned > 60:
                raise failed("did not log relay.started within 60 s")
        begin = started_at[0]
        meter = CpuMeter(proc.pid)
        meter.start()
        deadline = begin + timeout
        while db.remaining():
            if proc.poll() is not None:
                raise failed(f"exited with {proc.returncode} during the drain")
            if time.perf_counter() > deadline:
                raise failed(f"did not drain within {timeout:.0f} s: {db.by_state()}")
            time.sleep(DB_POLL)
        finished = time.perf_counter()
        cpu = meter.stop(finished - begin)
        peak = _peak_rss(proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            raise failed("did not exit within 30 s of SIGTERM") from None
        if code != 0:
            raise failed(f"exited with {code} after SIGTERM")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)
    _check_all_published(db, expected, "subprocess relay")
    return DrainResult(
        "subprocess",
        expected,
        finished - begin,
        cpu=cpu,
        peak_rss_bytes=peak,
        startup_seconds=begin - spawned,
    )


# --------------------------------------------------------------------------- diagnostics


def drain_store_only(db: BenchDatabase, *, batch_size: int = 500) -> DrainResult:
    """The relay's store, claim then mark, one batch after another, nothing published."""
    expected = db.restored
    store = open_store(db.url)
    done = 0
    try:
        meter = CpuMeter()
        meter.start()
        started = time.perf_counter()
        while True:
            token = uuid.uuid4()
            rows = store.claim(owner="bench-store", token=token, limit=batch_size, lease_seconds=30)
            if not rows:
                break
            done += store.mark_published(token, [r.seq for r in rows])
        finished = time.perf_counter()
        cpu = meter.stop(finished - started)
    finally:
        store.close()
    _check_all_published(db, expected, "store only")
    return DrainResult("store only", done, finished - started, cpu=cpu)


def publish_only(
    amqp_url: str,
    items: Sequence[Outgoing],
    *,
    batch_size: int = 500,
    max_in_flight: int = 2000,
    chains: int = 0,
    timeout: float,
) -> DrainResult:
    """The relay's Publisher fed pre-built messages, batched and bounded as the relay does. With
    `chains`, as that many keys' chains side by side (message i on chain i % chains, each chain a
    key of its own): every batch handed over at once, as the relay hands over a run, each chain
    sending a message once the one before it is confirmed (no database, no loop beside it)."""
    publisher = Publisher(amqp_url, name="outbox-relay bench publisher-only")
    publisher.start()
    state = {"settled": 0, "in_flight": 0, "failed": 0}

    def done(outcomes: list[Outcome]) -> None:
        state["settled"] += len(outcomes)
        state["in_flight"] -= len(outcomes)
        state["failed"] += sum(1 for o in outcomes if o.fate is not Fate.CONFIRMED)

    total = len(items)
    # (batch, its chain or None), in the order they are handed over: with chains, each chain's
    # first chunk, then each one's second..., so that every chain starts at once.
    lanes = [list(items[c::chains]) if chains else list(items) for c in range(max(chains, 1))]
    cut = [[lane[i : i + batch_size] for i in range(0, len(lane), batch_size)] for lane in lanes]
    batches = deque(
        (own[n], ("bench", f"hot{c}") if chains else None)
        for n in range(max(map(len, cut)))
        for c, own in enumerate(cut)
        if n < len(own)
    )
    try:
        meter = CpuMeter()
        meter.start()
        started = time.perf_counter()
        deadline = started + timeout
        while state["settled"] < total:
            while batches and (chains or state["in_flight"] + batch_size <= max_in_flight):
                batch, chain = batches.popleft()
                state["in_flight"] += len(batch)
                publisher.publish(batch, done, chain=chain)
            if time.perf_counter() > deadline:
                raise DrainError(f"publisher only: {state['settled']} of {total} settled")
            publisher.wait(0.5)  # the answers arrive here
        finished = time.perf_counter()
        cpu = meter.stop(finished - started)
    finally:
        publisher.stop()
    what = f"publisher only, {chains} chain(s)" if chains else "publisher only"
    result = DrainResult(what, total, finished - started, cpu=cpu)
    if state["failed"]:
        result.notes.append(f"{state['failed']} not confirmed")
    return result


# --------------------------------------------------------------------------- the usual outbox


def drain_one_at_a_time(
    db: BenchDatabase, amqp_url: str, *, limit: int, timeout: float
) -> DrainResult:
    """What most outbox libraries do, for comparison: claim a batch, then publish each message and
    wait for its confirm before marking it (pika BlockingConnection, one UPDATE per message).
    Drains `limit` messages of the backlog (it is slow; its rate is what is compared)."""
    import pika

    from relay.amqp.frames import decode_properties
    from relay.amqp.wire import to_outgoing

    store = open_store(db.url)
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = conn.channel()
    channel.confirm_delivery()
    done = 0
    try:
        meter = CpuMeter()
        meter.start()
        started = time.perf_counter()
        while done < limit:
            if time.perf_counter() - started > timeout:
                raise DrainError(f"one at a time: {done} of {limit} after {timeout:.0f} s")
            token = uuid.uuid4()
            rows = store.claim(
                owner="bench-naive", token=token, limit=min(100, limit - done), lease_seconds=60
            )
            if not rows:
                break
            for row in rows:
                item = to_outgoing(row)
                # Blocks until the broker confirms (raises on nack or return).
                props = decode_properties(item.header)
                channel.basic_publish(
                    item.exchange, item.routing_key, item.body, props, mandatory=True
                )
                done += store.mark_published(token, [row.seq])
        finished = time.perf_counter()
        cpu = meter.stop(finished - started)
    finally:
        conn.close()
        store.close()
    if done != limit:
        raise DrainError(f"one at a time: published {done}, expected {limit}")
    return DrainResult("one at a time", done, finished - started, cpu=cpu)
