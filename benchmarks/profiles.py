"""A short reading of the in-process drain's profile (--profile DIR): the relay thread's own time
by where the code lives, then the functions that spent most of it.

Own time (pstats' tottime) is time in a function's own body, not in what it calls: what to make
faster. A wait is own time of the function that blocks, so waits are grouped apart: psycopg's
`wait` (its C part is not profiled on its own) is the thread waiting for the database; a lock, a
queue, a sleep or the IO loop's poll is the thread idle.
"""

from __future__ import annotations

import pstats
import sysconfig
from collections import defaultdict
from pathlib import Path

# The profile drain.drain_in_process writes, and what its thread does.
PROFILES = (("relay-loop.prof", "the relay's thread: claims, sends, confirms, marks"),)
TOP = 15
IDLE = ("'acquire' of '_thread", "'get' of '_queue", "'poll' of 'select", "time.sleep")
DB_WAIT = ("wait", "wait_c", "wait_conn")  # psycopg's functions that block on the server
ROOT = Path(__file__).resolve().parents[1]
STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()

Label = tuple[str, int, str]  # a function, as pstats names it: (file, line, name)


def where(file_name: str, function: str) -> str:
    """The group a function's time counts under: this project's package (two levels), an
    installed distribution, a standard library module, C code, or a wait."""
    if file_name == "~":  # C code: builtins and extension methods
        return "idle" if any(w in function for w in IDLE) else "C built-ins"
    path = Path(file_name)
    parts = path.parts
    if "site-packages" in parts:
        package = parts[parts.index("site-packages") + 1].removesuffix(".py")
        waits = package.startswith("psycopg") and function in DB_WAIT
        return "waiting for the database" if waits else package
    if path.is_relative_to(ROOT):
        inside = path.relative_to(ROOT).with_suffix("").parts
        return ".".join(inside[:2] if inside[0] == "relay" and len(inside) > 2 else inside[:1])
    if path.is_relative_to(STDLIB):
        return "stdlib " + path.relative_to(STDLIB).with_suffix("").parts[0]
    return file_name


def _short(label: Label) -> str:
    file_name, line, function = label
    if file_name == "~":
        return function
    path = Path(file_name)
    if "site-packages" in path.parts:  # before ROOT: the venv may live inside it
        inside = path.parts[path.parts.index("site-packages") + 1 :]
        return f"{'/'.join(inside)}:{line}({function})"
    for base in (ROOT, STDLIB):
        if path.is_relative_to(base):
            return f"{path.relative_to(base)}:{line}({function})"
    return f"{file_name}:{line}({function})"


def summarise(path: Path, what: str, top: int = TOP) -> list[str]:
    """The lines for one profile file."""
    # function -> (primitive calls, calls, own seconds, cumulative seconds, callers)
    raw: dict[Label, tuple[int, int, float, float, object]]
    raw = vars(pstats.Stats(str(path)))["stats"]
    total = sum(own for _, _, own, _, _ in raw.values())
    if total <= 0:
        return [f"profile {path.name} ({what}): empty"]
    groups: defaultdict[str, float] = defaultdict(float)
    for (file_name, _, function), (_, _, own, _, _) in raw.items():
        groups[where(file_name, function)] += own
    work = total - groups["idle"] - groups["waiting for the database"]
    largest = sorted(groups.items(), key=lambda g: g[1], reverse=True)
    shares = ", ".join(f"{g} {s / total:.0%}" for g, s in largest if s >= total / 100)
    lines = [
        f"profile {path.name} ({what}): {total:.2f} s own time in all, {work:.2f} s of it "
        "not waiting",
        f"  by where: {shares}",
        f"  {'own s':>7}  {'share':>5}  {'calls':>9}  where: function",
    ]
    heaviest = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:top]
    for label, (_, calls, own, _, _) in heaviest:
        lines.append(
            f"  {own:7.3f}  {own / total:5.1%}  {calls:>9,}  "
            f"{where(label[0], label[2])}: {_short(label)}"
        )
    return lines


def summary(directory: Path, since: float = 0.0) -> list[str]:
    """The lines for the profiles in `directory` written after `since` (time.time()), or why
    there are none."""
    lines: list[str] = []
    for name, what in PROFILES:
        path = directory / name
        if not path.exists() or path.stat().st_mtime < since:
            lines.append(f"profile {name}: not written by this run (no in-process phase)")
            continue
        lines += ["", *summarise(path, what)]
    return lines


def print_summary(directory: Path, since: float) -> None:
    head = f"profiles in {directory} (own time, top {TOP} each)"
    print("\n".join(["", head, *summary(directory, since)]), flush=True)
