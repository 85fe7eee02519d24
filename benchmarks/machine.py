"""Where the machine's CPU went during a phase: the relay, RabbitMQ, the database (PostgreSQL or
MariaDB/MySQL), the rest, idle.

On a small machine the broker, the database and the relay share the same cores, so a relay that
burns CPU slows the broker down as surely as one that waits too much. Linux only (/proc); on other
systems every reading is None and the report leaves the split out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
QUIET = 0.25  # cores busy below which the machine counts as idle between phases
GROUPS = ("relay", "rabbitmq", "database", "other", "idle")  # "other": everything else


def _group(comm: str) -> str:
    if comm.startswith(("postgres", "mariadbd", "mysqld")):
        return "database"
    if comm in ("beam.smp", "erl_child_setup", "epmd", "inet_gethost"):
        return "rabbitmq"
    return "other"


@dataclass(frozen=True, slots=True)
class _Snapshot:
    busy: float  # CPU seconds all cores spent not idle since boot
    idle: float  # idle + iowait seconds, all cores
    procs: dict[int, tuple[str, float]]  # pid -> (group, CPU seconds of all its threads)


def _snapshot(relay_pids: set[int]) -> _Snapshot | None:
    try:
        first = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = first[3] + first[4]
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    busy = sum(first[:8]) - idle
    procs: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw.rsplit(")", 1)[1].split()
        # utime, stime: fields 14 and 15 of stat (1-based), summed over the process's threads.
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        pid = int(entry.name)
        procs[pid] = ("relay" if pid in relay_pids else _group(comm), cpu)
    return _Snapshot(busy / _TICK, idle / _TICK, procs)


@dataclass
class CpuSplit:
    """CPU seconds per group over `seconds` of wall time. When "database" counts only the server
    processes a phase named (CpuMeter's `database`): `roles`, its CPU seconds by what each of
    them is, and `server`, every database process's on the machine."""

    seconds: float
    used: dict[str, float]
    server: float | None = None
    roles: dict[str, float] = field(default_factory=dict)

    def cores(self, group: str) -> float:
        return self.used.get(group, 0.0) / self.seconds if self.seconds > 0 else 0.0

    def describe(self, messages: int) -> str:
        parts = []
        for group in GROUPS:
            value = self.used.get(group, 0.0)
            if group == "idle":
                parts.append(f"idle {self.cores(group):.2f}")
            else:
                us = value / messages * 1e6 if messages else 0.0
                parts.append(f"{group} {self.cores(group):.2f} ({us:.0f} us/msg)")
        if self.server is not None and self.seconds > 0:
            us = self.server / messages * 1e6 if messages else 0.0
            parts.append(
                f"every database process {self.server / self.seconds:.2f} ({us:.0f} us/msg)"
            )
        if self.roles and messages:
            each = sorted(self.roles.items(), key=lambda kv: -kv[1])
            parts.append(
                "database by process: "
                + ", ".join(f"{role} {cpu / messages * 1e6:.1f} us/msg" for role, cpu in each)
            )
        return "cores: " + ", ".join(parts)


class CpuMeter:
    """Snapshot at `start()`, difference at `stop()`; counts the given pids as the relay. With
    `database`, called at `stop()` for the server processes that served the phase (pid: what it
    is, e.g. "walsender"), only those count as "database" (the rest of the server's, other
    databases' work, is "other"); a process that exited before `stop()` cannot be named, so the
    phase must keep its own open until then."""

    def __init__(
        self, *relay_pids: int, database: Callable[[], Mapping[int, str]] | None = None
    ) -> None:
        self.relay_pids = set(relay_pids) or {os.getpid()}
        self._database = database
        self._start: _Snapshot | None = None

    def start(self) -> None:
        self._start = _snapshot(self.relay_pids)

    def stop(self, seconds: float) -> CpuSplit | None:
        """The split over the `seconds` since start (the caller's own, more precise clock)."""
        end = _snapshot(self.relay_pids)
        start = self._start
        if start is None or end is None:
            return None
        served = None if self._database is None else dict(self._database())
        used = dict.fromkeys(GROUPS, 0.0)
        roles: dict[str, float] = {}
        server = 0.0
        # Per process, so that one exiting during the phase cannot subtract from its group; a
        # process born during the phase counts from zero. What exited unseen lands in "other".
        for pid, (group, cpu) in end.procs.items():
            before = start.procs.get(pid)
            spent = max(0.0, cpu - (before[1] if before else 0.0))
            if group == "database":
                server += spent
                if served is not None:
                    if pid not in served:
                        continue  # another database's work: "other"
                    roles[served[pid]] = roles.get(served[pid], 0.0) + spent
            if group != "other":
                used[group] += spent
        busy = end.busy - start.busy
        used["other"] = max(0.0, busy - used["relay"] - used["rabbitmq"] - used["database"])
        used["idle"] = end.idle - start.idle
        return CpuSplit(seconds, used, None if served is None else server, roles)


def busy_cores(seconds: float = 1.0) -> float | None:
    """How many cores something else kept busy over `seconds` (Linux /proc/stat), or None."""

    def sample() -> tuple[int, int]:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values), idle

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 == total0:
        return None
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / (total1 - total0))


def quiesce(limit: float = 15.0, busy: float = QUIET) -> bool:
    """Wait (at most `limit` s) until the machine is nearly idle: the broker and the database
    finish what the previous phase left them (fsyncs, vacuum, queue deletion) before the next.
    False if it stayed busy."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        used = busy_cores(0.5)
        if used is None or used < busy:
            return True
    return False
