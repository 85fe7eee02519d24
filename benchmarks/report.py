"""The report `python -m benchmarks` prints: the rates against the ceiling in a table, each
phase's details, then one line per target (benchmarks/targets.py); also as Markdown for the
docs' performance page, and as JSON."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import pika

from benchmarks.many import ratio_line
from benchmarks.results import BASES, NOT_RATES, Results, fmt_rate, median, spread
from benchmarks.targets import WINDOWS, Figures, LogicalFigures, target_lines, window_line

SIGNED_TARGET = 0.95  # signing may cost at most 5% of the drain rate
NOISE = 0.2  # cores used by other processes during a phase above which its figure is suspect


def report(args: argparse.Namespace, command: str, info: dict[str, str], results: Results) -> None:
    out = _header(args, command, info) + _table(results) + [""] + _details(results)
    out += _comparisons(results)
    out += _targets(results)
    print("\n".join(out), flush=True)
    if args.markdown is not None:
        write_markdown(args.markdown, out)
    if args.json is not None:
        _write_json(args, command, info, results)


def _header(args: argparse.Namespace, command: str, info: dict[str, str]) -> list[str]:
    return [
        "",
        "outbox-relay benchmark",
        f"command : {command}",
        f"machine : {os.cpu_count()} cores, {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, pika {pika.__version__}, "
        f"{info.get('database', '?')}, RabbitMQ {info.get('rabbitmq', '?')}"
        + (f"; {info['busy_before']} cores busy before start" if "busy_before" in info else ""),
        f"messages: {args.messages:,} per phase, {args.payload_bytes}-byte JSON body, persistent, "
        "mandatory, topic exchange -> durable queue"
        + (f"; median of {args.repeat} runs" if args.repeat > 1 else ""),
        "",
    ]


def _table(results: Results) -> list[str]:
    ceiling = results.get("ceiling")
    base = ceiling.rate if ceiling else None
    lines: list[tuple[str, str, str]] = []
    for key, row in results.items():
        if key in NOT_RATES:  # below the table
            continue
        if key.endswith("-rss"):
            lines.append((row.figure, f"{max(row.rates):,.0f} MiB", "-"))
            continue
        if row.error and not row.rates:
            lines.append((row.figure, "FAILED", "-"))
            continue
        ratio = f"{row.rate / base:.2f}x" if base else "-"
        if key in BASES:  # a ratio to another figure of the same run, not to the ceiling
            other_key, name = BASES[key]
            other = results.get(other_key)
            ratio = f"{row.rate / other.rate:.2f}x {name}" if other and other.rate else "-"
        lines.append((row.figure, fmt_rate(row.rate) + spread(row.rates), ratio))
    w1 = max([len("figure"), *(len(a) for a, _, _ in lines)])
    w2 = max([len("value"), *(len(b) for _, b, _ in lines)])
    return [
        f"{'figure':<{w1}}  {'value':>{w2}}  ratio to ceiling",
        f"{'-' * w1}  {'-' * w2}  ----------------",
        *(f"{a:<{w1}}  {b:>{w2}}  {c}" for a, b, c in lines),
    ]


def _details(results: Results) -> list[str]:
    out = []
    for key, row in results.items():
        if row.extra and not key.endswith("-rss"):
            out.append(f"{key}: {row.extra}")
        if row.error:
            out.append(f"{key}: FAILED: {row.error}")
    noisy = [
        f"{k} ({max(r.others):.2f})" for k, r in results.items() if max(r.others, default=0) > NOISE
    ]
    if noisy:
        out.append(
            "warning: other processes kept cores busy during "
            + ", ".join(noisy)
            + ": those figures are low; rerun on an idle machine"
        )
    return out


def _comparisons(results: Results) -> list[str]:
    """Prepared statements and signing, each against the same drain without; many databases
    against one."""
    out = []
    off, on = results.get("prepared"), results.get("prepared-on")
    if off and on and off.rates and on.rates:
        # CPU per message is the steadier figure on a shared machine: others' load lowers
        # rates, not the work each message costs.
        cpu = ""
        if off.work_us and on.work_us:
            a, b = statistics.median(off.work_us), statistics.median(on.work_us)
            cpu = f"; relay + PostgreSQL CPU per message {a:.0f} us / {b:.0f} us = {a / b:.2f}x"
        out.append(
            f"no prepared statements / prepared statements: rate {off.rate / on.rate:.2f}x{cpu} "
            f"(median of {len(off.rates)} run(s) each)"
        )
    plain, signed = results.get("unsigned"), results.get("signed")
    if plain and signed and plain.rates and signed.rates:
        cost = signed.rate / plain.rate
        cpu = ""
        if plain.work_us and signed.work_us:
            a, b = statistics.median(signed.work_us), statistics.median(plain.work_us)
            cpu = f"; relay + database CPU per message {a:.0f} us / {b:.0f} us"
        out.append(
            f"target signed drain >= {SIGNED_TARGET:.2f}x unsigned: "
            f"{'met' if cost >= SIGNED_TARGET else 'NOT met'} ({cost:.3f}x{cpu}; median of "
            f"{len(signed.rates)} run(s) each)"
        )
        bound, ceiling = results.get("signed-ceiling"), results.get("ceiling")
        if bound and ceiling and bound.rates and ceiling.rates:
            out.append(
                f"the broker's bound for signed messages: raw pika with their headers "
                f"{bound.rate / ceiling.rate:.3f}x the ceiling (the relay's signed drain "
                f"{signed.rate / bound.rate:.2f}x that bound, unsigned "
                f"{plain.rate / ceiling.rate:.2f}x the ceiling)"
            )
    one, unkeyed = results.get("hot-1"), results.get("hot-unkeyed")
    if one and unkeyed and one.rates and unkeyed.rates:
        # Not a target: strict per-key order makes one confirm at a time a key's bound, and the
        # targets (targets.py) judge the relay against that bound, not against the unkeyed drain.
        serial = results.get("hot-serial")
        serial_bound = ""
        if serial and serial.rates:
            serial_bound = (
                f"; its bound, raw pika one confirm at a time, {serial.rate / unkeyed.rate:.2f}x"
            )
        out.append(f"one hot key: {one.rate / unkeyed.rate:.2f}x the unkeyed drain{serial_bound}")
    many = ratio_line(results)
    if many is not None:
        out.append(many)
    return out


def figures(results: Results) -> Figures:
    """The medians the targets are judged on, from the rows that have any."""

    def value(key: str) -> float | None:
        row = results.get(key)
        return row.rate if row is not None and row.rates else None

    relay = "in-process" if value("in-process") is not None else "subprocess"
    small, drained = results.get("small"), results.get(relay)
    ceiling_row, floor = results.get("small-ceiling"), results.get("small-floor")
    windows = {w: rate for w in WINDOWS if (rate := value(f"window-{w}")) is not None}
    return Figures(
        ceiling=value("ceiling"),
        drain=value(relay),
        drain_name=relay,
        window_rates=windows,
        kill_duplicates=value("kill"),
        kill_recovery_s=value("kill-recovery"),
        steady_duplicates=value("steady-kill"),
        hot_1=value("hot-1"),
        hot_serial=value("hot-serial"),
        hot_4=value("hot-4"),
        hot_serial_4=value("hot-serial-4"),
        hot_floor_1=value("hot-floor-1"),
        hot_floor_4=value("hot-floor-4"),
        neighbour=value("neighbour"),
        neighbour_alone=value("neighbour-alone"),
        small=value("small"),
        small_ceiling=value("small-ceiling"),
        small_relay_us=median(small.relay_us) if small is not None and small.relay_us else None,
        small_ceiling_us=median(ceiling_row.relay_us)
        if ceiling_row and ceiling_row.relay_us
        else None,
        small_database_us=(
            median(small.database_us) if small is not None and small.database_us else None
        ),
        relay_us=median(drained.relay_us) if drained is not None else None,
        floor=value("small-floor"),
        floor_us=median(floor.relay_us) if floor is not None else None,
        floor_database_us=median(floor.database_us) if floor is not None else None,
        enqueue_plain=value("enqueue-plain"),
        enqueue_many=value("enqueue-many"),
        logical=logical_figures(results),
    )


def logical_figures(results: Results) -> LogicalFigures:
    """The logical phase's medians, from the rows that have any."""

    def value(key: str) -> float | None:
        row = results.get(key)
        return row.rate if row is not None and row.rates else None

    def cpu(key: str, kind: str) -> float | None:
        row = results.get(key)
        values = getattr(row, kind) if row is not None else []
        return median(values) if values else None

    return LogicalFigures(
        drain=value("logical"),
        ceiling=value("logical-ceiling"),
        table=value("logical-table"),
        single=value("logical-single"),
        single_database_us=cpu("logical-single", "database_us"),
        relay_us=cpu("logical", "relay_us"),
        table_relay_us=cpu("logical-table", "relay_us"),
        ceiling_us=cpu("logical-ceiling", "relay_us"),
        database_us=cpu("logical", "database_us"),
        table_database_us=cpu("logical-table", "database_us"),
        enqueue=value("logical-enqueue"),
        enqueue_bare=value("logical-enqueue-bare"),
        enqueue_nothing=value("logical-enqueue-nothing"),
        enqueue_table=value("logical-enqueue-table"),
        p50_ms=value("logical-latency"),
        p99_ms=value("logical-latency-p99"),
        floor_p50_ms=value("logical-floor"),
        floor_p99_ms=value("logical-floor-p99"),
        table_p50_ms=value("logical-latency-table"),
        table_p99_ms=value("logical-latency-table-p99"),
    )


def _targets(results: Results) -> list[str]:
    found = figures(results)
    k = window_line(found.window_rates)
    return ([k] if k else []) + target_lines(found)


def write_markdown(path: Path, report: list[str]) -> None:
    """The report as a Markdown fragment the performance page includes: when, where and how it was
    measured on one line each, then the table as the command printed it."""
    command = next(line for line in report if line.startswith("command : "))
    machine = next(line for line in report if line.startswith("machine : "))
    body = [line for line in report if not line.startswith(("command : ", "machine : "))]
    while body and body[0] in ("", "outbox-relay benchmark"):
        body.pop(0)
    day = time.strftime("%Y-%m-%d", time.gmtime())
    text = [
        f"Measured {day} on {machine.removeprefix('machine : ')}.",
        "",
        "```sh",
        command.removeprefix("command : "),
        "```",
        "",
        "```text",
        *body,
        "```",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text), encoding="utf-8")


def _write_json(
    args: argparse.Namespace, command: str, info: dict[str, str], results: Results
) -> None:
    args.json.write_text(
        json.dumps(
            {
                "command": command,
                "cores": os.cpu_count(),
                "python": platform.python_version(),
                "messages": args.messages,
                "payload_bytes": args.payload_bytes,
                **info,
                "results": {
                    k: {"figure": r.figure, "median": r.rate, "runs": r.rates, "extra": r.extra}
                    for k, r in results.items()
                },
            },
            indent=2,
        )
        + "\n"
    )
