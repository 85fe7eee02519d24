"""`outbox-relay purge`: delete old terminal messages (and their attempt rows) in small batches.

    outbox-relay purge --older-than 7d [--state published,dead] [--batch-size N]
                       [--dry-run] [--json]

Prints "purged N message(s)", or JSON with --json; a progress bar on stderr when it is a terminal.
Bad usage (a live state such as pending, a bad duration) exits 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm

from outbox.states import State
from relay.cli.messages import operator_engine, utc_now
from relay.cli.options import Commands, Handler, argparse_type
from relay.core.durations import positive_duration
from relay.errors import ConfigError
from relay.runtime.config import RelayConfig
from relay.store import retention

DEFAULT_STATES: tuple[str, ...] = (State.PUBLISHED.value,)
DEFAULT_BATCH_SIZE = 1000
# Each batch is one transaction holding its rows' locks (SQLite: the write lock) until it
# commits; past this size a batch would hold them long enough for relays and writers to notice.
MAX_BATCH_SIZE = 10_000


older_than = argparse_type(positive_duration)  # --older-than: a positive duration in seconds


def purge_states(raw: str) -> list[str]:
    """--state: terminal states, comma-separated (pending and in_flight are refused)."""
    try:
        return list(retention.check_states(s.strip() for s in raw.split(",") if s.strip()))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def batch_size(raw: str) -> int:
    """--batch-size: 1 to MAX_BATCH_SIZE."""
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None
    if not 1 <= value <= MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(
            f"{raw!r} must be between 1 and {MAX_BATCH_SIZE} (small batches keep locks short)"
        )
    return value


def add_parser(sub: Commands) -> None:
    p = sub.add_parser(
        "purge",
        help="delete old published (or dead, discarded, cancelled) messages, in small batches",
    )
    p.add_argument("--older-than", required=True, type=older_than, metavar="DURATION",
                   help="age to keep: published by publish time, failed ones by their last "
                        "failure or replay (e.g. 72h, 7d)")  # fmt: skip
    p.add_argument("--state", type=purge_states, action="extend", default=[],
                   metavar="STATE[,STATE]",
                   help="published (default), dead, discarded, cancelled; comma-separated or "
                        "repeated")  # fmt: skip
    p.add_argument("--batch-size", type=batch_size, default=DEFAULT_BATCH_SIZE, metavar="N",
                   help=f"messages per delete (default {DEFAULT_BATCH_SIZE})")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="count what would go, delete nothing")
    p.add_argument("--json", action="store_true", help="print JSON")


def _checked(args: argparse.Namespace) -> tuple[tuple[str, ...], float, int]:
    # argparse has checked these already; callers that build the Namespace themselves have not.
    try:
        states = retention.check_states(args.state or DEFAULT_STATES)
    except ValueError as exc:
        raise ConfigError(f"purge: --state: {exc}") from None
    if not args.older_than > 0:
        raise ConfigError("purge: --older-than must be longer than zero")
    if not 1 <= args.batch_size <= MAX_BATCH_SIZE:
        raise ConfigError(f"purge: --batch-size must be between 1 and {MAX_BATCH_SIZE}")
    return states, float(args.older_than), int(args.batch_size)


def cmd_purge(config: RelayConfig, args: argparse.Namespace) -> int:
    states, age, size = _checked(args)
    now = utc_now()
    cutoff = retention.cutoff_time(now, age)
    scope = {"states": list(states), "cutoff": cutoff.isoformat()}
    with operator_engine(config) as engine:
        if args.dry_run:
            n = retention.count_eligible(engine, states=states, older_than_seconds=age, now=now)
            if args.json:
                print(json.dumps({"dry_run": True, "would_purge": n, **scope}))
            else:
                print(f"would purge {n} message(s) (dry run; nothing changed)")
            return 0
        show = sys.stderr.isatty()
        # Counting costs a scan of the old id range, so only for a bar someone is watching.
        total = (
            retention.count_eligible(engine, states=states, older_than_seconds=age, now=now)
            if show
            else None
        )
        with tqdm(total=total, desc="purge", unit="msg", file=sys.stderr, disable=not show) as bar:
            n = retention.purge(
                engine,
                states=states,
                older_than_seconds=age,
                batch_size=size,
                now=now,
                progress=bar.update,
            )
    if args.json:
        print(json.dumps({"purged": n, **scope}))
    else:
        print(f"purged {n} message(s)")
    return 0


COMMANDS: dict[str, Handler] = {"purge": cmd_purge}
